"""The running profile as the truth for every view (gpuserve/serve/running.py): the
host's record written after a passing gate (through pyinfra's real execution path with
the @fake connector), the deploy's first line on a switch, the controller's view from
the records the serve deploy writes, and the views: render, logs, fleet status, the
monitor's targets."""

from __future__ import annotations

import contextlib
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from gpuserve.commands.fleet import format_status
from gpuserve.commands.render import running_line
from gpuserve.fleet import status as st
from gpuserve.measure.results import ResultRecord, read_results, write_record
from gpuserve.monitor.targets import HostEntry, targets_of
from gpuserve.roles.service.running import record_running
from gpuserve.serve.running import (
    RUNNING_PATH,
    Running,
    difference,
    from_dict,
    parse_running,
    record_text,
    running_of_records,
    switch_note,
)

REPO = Path(__file__).resolve().parents[3]
TP8, EP8 = "glm5-nvfp4-tp8", "glm5-nvfp4-tp8-ep8"
H1, H2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_record_round_trip_and_what_is_not_a_record() -> None:
    rec = Running(EP8, H1, "2026-12-06T10:00:00Z")
    assert parse_running(record_text(rec).splitlines()) == rec
    assert from_dict(rec.to_dict()) == rec
    for text in (None, [], ["not json"], ['{"schema":"other/1","profile":"x"}'],
                 ['{"schema":"gpuserve.running/1","profile":""}']):
        assert parse_running(text) is None


def test_switch_note_in_plain_words() -> None:
    running = Running(EP8, H2, "2026-12-06T10:00:00Z")
    back = switch_note("gpu1", running, TP8, TP8, overridden=False)
    assert back == (f"gpu1: switches from {EP8} (running since 2026-12-06T10:00:00Z) to {TP8},"
                    f" the profile the inventory names (the desired state); to keep {EP8}, "
                    f"set profile: {EP8} in the inventory")
    to = switch_note("gpu1", Running(TP8), EP8, TP8, overridden=True)
    assert to == (f"gpu1: switches from {TP8} (running) to {EP8} (--data profile={EP8}); "
                  f"the inventory names {TP8}, so a plain deploy would switch back: set "
                  f"profile: {EP8} in the inventory to keep it")
    assert switch_note("gpu1", running, EP8, TP8, overridden=True) is None  # no switch
    assert switch_note("gpu1", None, TP8, TP8, overridden=False) is None  # nothing recorded


def bench(profile: str, launch: str, ts: str, passed: bool | None) -> ResultRecord:
    gate = None if passed is None else {"passed": passed, "misses": [], "checked": []}
    return ResultRecord(kind="bench", profile=profile, host="gpu1", launch_hash=launch,
                        timestamp=ts, scenario="batch", gate=gate,
                        figures={"output_throughput": 90.0, "max_concurrency": 64})


def test_records_say_what_runs_and_a_failed_switch_rolled_back(tmp_path) -> None:
    for rec in (bench(TP8, H1, "2026-12-06T08:00:00Z", True),
                bench(EP8, H2, "2026-12-06T09:00:00Z", None)):
        write_record(tmp_path, rec)
    records = read_results(tmp_path / "gpu1")
    assert running_of_records(records, "gpu1") == Running(EP8, H2, "2026-12-06T09:00:00Z",
                                                           "records")
    # the switch's gate failed: the deploy rolled back to the launch before it
    write_record(tmp_path, bench(EP8, H2, "2026-12-06T09:05:00Z", False))
    records = read_results(tmp_path / "gpu1")
    assert running_of_records(records, "gpu1").profile == TP8
    assert running_of_records(records, "gpu2") is None
    assert running_of_records([], "gpu1") is None


def test_views_mark_the_difference() -> None:
    running = Running(EP8, H2, "2026-12-06T10:00:00Z")
    assert difference(running, TP8) == (
        f"runs {EP8}, the inventory names {TP8}: a plain deploy switches it to {TP8} (to "
        f"keep {EP8}, set profile: {EP8} in the inventory)")
    assert difference(running, EP8) is None and difference(None, TP8) is None
    line = running_line(running.to_dict(), TP8)
    assert line.startswith(f"# running: {EP8} since 2026-12-06T10:00:00Z (launch sha256:222222"
                           "222222): DIFFERS: runs")
    assert running_line(running.to_dict(), EP8).endswith(": the same profile")
    assert "nothing recorded" in running_line(None, TP8)


def test_fleet_status_shows_the_running_profile_and_marks_it() -> None:
    row = st.HostStatus(host="gpu1", profile=TP8, running=Running(EP8, H2, None, "records"))
    same = st.HostStatus(host="gpu2", profile=TP8, running=Running(TP8, H1, None, "records"))
    text = format_status([row, same], [])
    lines = text.splitlines()
    assert lines[2].split()[:2] == ["gpu1", f"{EP8}*"] and f"(inventory: {TP8})" in lines[2]
    assert lines[3].split()[:2] == ["gpu2", TP8] and "inventory:" not in lines[3]
    assert f"gpu1: runs {EP8}, the inventory names {TP8}" in text
    assert st.host_dict(row)["running"]["profile"] == EP8


def test_targets_label_and_scrape_the_running_profile() -> None:
    data = {"profile": TP8, "listen_address": "10.0.0.11"}
    out = targets_of([HostEntry("gpu1", data, "gpus", None, EP8)], "inv.py")
    sglang = [t for t in out.targets if t.job == "sglang"]
    assert {t.labels["profile"] for t in out.targets} == {EP8}
    assert any(f"runs {EP8}" in w and f"names {TP8}" in w for w in out.warnings)
    plain = targets_of([HostEntry("gpu1", data, "gpus", None, None)], "inv.py")
    assert {t.labels["profile"] for t in plain.targets} == {TP8}
    assert len(sglang) == 1
    gone = targets_of([HostEntry("gpu1", data, "gpus", None, "no-such-profile")], "inv.py")
    assert {t.labels["profile"] for t in gone.targets} == {TP8}
    assert any("does not load" in w for w in gone.warnings)


# -- the host's record, through pyinfra (@fake) --

def run(responses: dict, **kwargs):
    inv = Inventory((["@fake"], {"fake_responses": responses, "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    meta = next(iter(add_op(state, record_running, **kwargs).values()))
    with contextlib.suppress(PyinfraError):
        run_ops(state)
    host = next(iter(inv))
    return meta, [str(c) for c in host.connector.executed_commands]


def test_record_running_writes_once_and_keeps_since() -> None:
    meta, cmds = run({}, profile=EP8, launch=H2)
    assert meta.did_succeed() and meta.did_change()
    written = [c for c in cmds if f"> {RUNNING_PATH}.tmp" in c]
    assert len(written) == 1 and f'"profile":"{EP8}"' in written[0], cmds
    same = record_text(Running(EP8, H2, "2026-12-06T10:00:00Z"))
    meta, cmds = run({RUNNING_PATH: [same.strip()]}, profile=EP8, launch=H2)
    assert meta.did_succeed() and not meta.did_change(), cmds
