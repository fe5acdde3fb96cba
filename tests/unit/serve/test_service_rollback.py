"""Rollback to the last good service configuration (roles/service/rollback.py, and the
health gate in roles/checks that uses it).

The decisions are pure; the shell scripts run for real against a temporary directory
(with a stub ``systemctl``); the operations run through pyinfra's real execution path
with the @fake connector, as in test_serve_checks.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.operation import add_op

import gpuserve.roles.checks.gate
import gpuserve.roles.checks.probe
from gpuserve.measure.health import Probe
from gpuserve.roles.checks.gate import wait_healthy
from gpuserve.roles.service.rollback import (
    ConfigState,
    RollbackSpec,
    keep_last_good,
    needs_save,
    parse_state,
    restore_script,
    rollback_decision,
    save_script,
    state_command,
)
from tests.unit.conftest import run_fake_op

A = "a" * 40 + " 600:root:root"
B = "b" * 40 + " 600:root:root"
U1 = "1" * 40 + " 644:root:root"
U2 = "2" * 40 + " 644:root:root"


def lines(live: dict, saved: dict, profile: str = "") -> list[str]:
    """state_command's output for these fingerprints (``sha1 mode``; None: absent)."""
    out, found = [], []
    for name in ("unit", "env", "config"):
        for kind, prints in (("live", live), ("saved", saved)):
            path = f"/{kind}/{name}"
            out.append(f"file {kind} {name} {path}")
            if prints.get(name):
                sha, mode = prints[name].split(" ")
                found += [f"{sha}  {path}", f"mode {mode} {path}"]
    return [*out, *found, f"profile {profile}".rstrip() if profile else "profile "]


def test_parse_state() -> None:
    st = parse_state(lines({"unit": U1, "env": A}, {"unit": U1, "env": A}, "glm5-nvfp4-tp8"))
    assert st.live == {"unit": U1, "env": A, "config": None} == st.saved
    assert st.saved_profile == "glm5-nvfp4-tp8" and st.has_saved and st.live_is_saved
    assert parse_state(None) == ConfigState({}, {}, None)
    assert not parse_state(lines({"unit": U1}, {}, "")).has_saved


@pytest.mark.parametrize(("saved", "profile", "save"), [
    ({}, "", True),                                  # first passing deploy
    ({"unit": U1, "env": A}, "good", False),         # rerun: nothing to do
    ({"unit": U1, "env": B}, "good", True),          # the env changed (e.g. a new token)
    ({"unit": U1, "env": A}, "other", True),         # same files, other name
])
def test_needs_save(saved: dict, profile: str, save: bool) -> None:
    st = parse_state(lines({"unit": U1, "env": A}, saved, profile))
    assert needs_save(st, "good") is save


def test_rollback_decision() -> None:
    first = rollback_decision(parse_state(lines({"unit": U1}, {}, "")))
    assert first.target is None and "nothing to roll back to" in first.reason
    same = rollback_decision(parse_state(lines({"unit": U1}, {"unit": U1}, "good")))
    assert same.target is None and "is the last good one (profile good)" in same.reason
    back = rollback_decision(parse_state(lines({"unit": U2, "env": A}, {"unit": U1, "env": A},
                                               "good")))
    assert back.target == "good"


def _spec(tmp: Path, profile: str = "good") -> RollbackSpec:
    live = tmp / "live"
    live.mkdir(exist_ok=True)
    return RollbackSpec(profile_name=profile, unit="gpuserve-sglang.service",
                        files=(("unit", str(live / "unit.service")), ("env", str(live / "env")),
                               ("config", str(live / "secrets.yaml"))),
                        saved_dir=str(tmp / "last-good"))


def _sh(script: str, tmp: Path) -> str:
    stub = tmp / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp}/systemctl.log\n')
    (stub / "systemctl").chmod(0o755)
    (stub / "chown").write_text("#!/bin/sh\nexit 0\n")  # not root here
    (stub / "chown").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}")
    return subprocess.run(["sh", "-c", script], env=env, check=True, capture_output=True,
                          text=True).stdout


def test_scripts_save_compare_and_restore_for_real(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    live = {name: Path(path) for name, path in spec.files}
    live["unit"].write_text("# Profile: good\n")
    live["unit"].chmod(0o644)
    live["env"].write_text("HF_TOKEN=secret-1\n")
    live["env"].chmod(0o600)
    live["config"].write_text('api-key: "k1"\n')
    live["config"].chmod(0o600)

    before = parse_state(_sh(state_command(spec), tmp_path).splitlines())
    assert not before.has_saved and needs_save(before, "good")
    Path(spec.saved_dir).mkdir(mode=0o755)  # left too open by hand: the save closes it
    _sh(save_script(spec), tmp_path)
    saved = parse_state(_sh(state_command(spec), tmp_path).splitlines())
    assert saved.live_is_saved and saved.saved_profile == "good"
    assert not needs_save(saved, "good")
    assert oct(Path(spec.saved_dir).stat().st_mode & 0o777) == "0o700"
    assert oct(Path(spec.saved("env")).stat().st_mode & 0o777) == "0o600"

    # a new profile without an API key: unit and env change, --config disappears
    live["unit"].write_text("# Profile: bad\n")
    live["env"].write_text("HF_TOKEN=secret-1\nGPUSERVE_LAB_STANDIN_FAIL=oom\n")
    live["config"].unlink()
    changed = parse_state(_sh(state_command(spec), tmp_path).splitlines())
    assert changed.live["config"] is None and rollback_decision(changed).target == "good"

    _sh(restore_script(spec), tmp_path)
    assert live["unit"].read_text() == "# Profile: good\n"
    assert live["env"].read_text() == "HF_TOKEN=secret-1\n"
    assert live["config"].read_text() == 'api-key: "k1"\n'
    assert oct(live["env"].stat().st_mode & 0o777) == "0o600"
    assert parse_state(_sh(state_command(spec), tmp_path).splitlines()).live_is_saved
    assert (tmp_path / "systemctl.log").read_text().splitlines() == [
        "daemon-reload", "reset-failed gpuserve-sglang.service",
        "restart gpuserve-sglang.service"]


# -- operations through pyinfra (@fake) --

def run(op, responses: dict, **kwargs):
    return run_fake_op(op, responses, **kwargs)


SPEC = RollbackSpec(profile_name="bad")


def test_keep_last_good_is_no_change_when_already_saved() -> None:
    st = lines({"unit": U1, "env": A}, {"unit": U1, "env": A}, "bad")
    meta, cmds = run(keep_last_good, {"sha1sum": st}, spec=SPEC)
    assert meta.did_succeed() and not meta.did_change()
    assert not any("cp -p" in c for c in cmds)


def test_keep_last_good_saves_a_new_configuration() -> None:
    st = lines({"unit": U2, "env": A}, {"unit": U1, "env": A}, "good")
    meta, cmds = run(keep_last_good, {"sha1sum": st}, spec=SPEC)
    assert meta.did_succeed() and meta.did_change()
    assert any("cp -p /etc/systemd/system/gpuserve-sglang.service" in c
               and "install -d -o root -g root -m 700 /etc/gpuserve/last-good" in c
               for c in cmds)


def test_keep_last_good_after_the_service_changed_copies_without_reading_again() -> None:
    """A switch has rewritten the live files: the copy needs no fresh read of them."""
    meta, cmds = run(keep_last_good, {}, spec=SPEC, service_changed=True)
    assert meta.did_succeed() and meta.did_change()
    assert not any("sha1sum" in c for c in cmds), cmds  # no state read
    assert sum("cp -p /etc/systemd/system/gpuserve-sglang.service" in c for c in cmds) == 1


def test_keep_last_good_after_another_change_still_reads() -> None:
    """An operation that changed something else (a benchmark run) leaves the service as
    it was: the read decides, and an already saved set is not copied again."""
    from pyinfra.operations import server

    st = lines({"unit": U1, "env": A}, {"unit": U1, "env": A}, "bad")
    meta, cmds = run_fake_op(keep_last_good, {"sha1sum": st}, spec=SPEC, before_op=lambda state:
                             add_op(state, server.shell, commands=["echo benchmarked"]))
    assert meta.did_succeed() and not meta.did_change()
    assert not any("cp -p" in c for c in cmds), cmds


def probe(health=None, active="active", sub="running", restarts=0, lines_=(), tail=()):
    return Probe(health, active, sub, restarts, None, list(lines_), list(tail))


DEAD = probe(None, "activating", "auto-restart", 1,
             lines_=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"],
             tail=["Nov 29 sglang[42]: torch.OutOfMemoryError: CUDA out of memory."])
GATE = dict(unit="gpuserve-sglang.service", port=30000,
            script="/opt/gpuserve/bin/sglang_probe.py", timeout=60)


@pytest.fixture
def probes(monkeypatch):
    """Script the probes the gate sees, in order (the last one repeats)."""
    seq: list[Probe] = []

    def fake_parse(_stdout):
        return seq.pop(0) if len(seq) > 1 else seq[0]

    monkeypatch.setattr(gpuserve.roles.checks.probe, "parse_probe", fake_parse)
    monkeypatch.setattr(gpuserve.roles.checks.gate, "INTERVAL_S", 0.001)  # no pause
    return seq


def test_failed_gate_rolls_back_and_still_fails(probes, caplog) -> None:
    probes += [DEAD, probe(200)]
    st = lines({"unit": U2, "env": B}, {"unit": U1, "env": A}, "good")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(wait_healthy, {"sha1sum": st}, rollback=SPEC, **GATE)
    assert not meta.did_succeed()
    restore = [c for c in cmds if "systemctl restart gpuserve-sglang.service" in c]
    assert len(restore) == 1 and "cp -p /etc/gpuserve/last-good/env" in restore[0]
    text = caplog.text
    assert "CUDA out of memory" in text and "profile bad failed" in text
    assert "the host was rolled back to profile good, which is healthy again" in text


def test_rollback_that_is_not_healthy_says_so(probes, caplog) -> None:
    probes += [DEAD, DEAD]
    st = lines({"unit": U2}, {"unit": U1}, "good")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(wait_healthy, {"sha1sum": st}, rollback=SPEC, **GATE)
    assert not meta.did_succeed()
    assert "rolled back to profile good, but it is NOT healthy either" in caplog.text


@pytest.mark.parametrize(("saved", "why"), [
    ({}, "no configuration has passed"),
    ({"unit": U2}, "the failing configuration is the last good one"),
])
def test_nothing_to_roll_back_to(probes, caplog, saved: dict, why: str) -> None:
    probes.append(DEAD)
    st = lines({"unit": U2}, saved, "good" if saved else "")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(wait_healthy, {"sha1sum": st}, rollback=SPEC, **GATE)
    assert not meta.did_succeed()
    assert not any("systemctl restart" in c for c in cmds)
    assert "profile bad failed" in caplog.text and "not rolled back: nothing to roll back to" \
        in caplog.text and why in caplog.text


def test_healthy_gate_reads_no_rollback_state(probes) -> None:
    probes.append(probe(200))
    meta, cmds = run(wait_healthy, {}, rollback=SPEC, **GATE)
    assert meta.did_succeed() and not meta.did_change()
    assert not any("sha1sum" in c for c in cmds)


def test_outcome_names_both_profiles_or_the_previous_configuration() -> None:
    from gpuserve.roles.service.rollback import rollback_outcome

    assert rollback_outcome("new", "old", 8, None) == (
        "rolled back: profile new failed, the host was rolled back to profile old, which is "
        "healthy again (/health 200 after 8 s)")
    assert "rolled back to the previous configuration of profile p, which is healthy" \
        in rollback_outcome("p", "p", 8, None)
    assert rollback_outcome("new", "old", 8, "timeout").startswith(
        "rolled back to profile old, but it is NOT healthy either: timeout")


def test_prune_keeps_what_the_units_name_and_deletes_nothing_when_its_read_fails() -> None:
    """The venvs a rollback needs are never pruned: the live and the last good unit name
    them. One read gives both kinds of line; no output is no venv; a failed read deletes
    nothing."""
    from gpuserve.roles.sglang import prune_venvs

    home = "/opt/gpuserve"
    units = ("/etc/systemd/system/gpuserve-sglang.service", SPEC.saved("unit"))
    live, saved, old, stray = (f"{home}/venvs/{n}" for n in ("0.5.3-c", "0.5.2-b", "0.5.1-a",
                                                              "0.5.4-d"))
    seen = [f"ExecStart={live}/bin/python -m sglang.launch_server $GPUSERVE_SGLANG_ARGS",
            f"ExecStart={saved}/bin/python -m sglang.launch_server $GPUSERVE_SGLANG_ARGS",
            f"1700000003 1 {live}", f"1700000002 1 {saved}", f"1700000001 1 {old}",
            f"1700000004 0 {stray}",
            # never deleted, whatever a listing says: not right under <home>/venvs
            "1700000000 0 /etc", f"1700000000 0 {home}/venvs", f"1700000000 0 {live}/lib"]
    meta, cmds = run(prune_venvs, {"grep -ah ": seen}, home=home, keep=2,
                     unit_paths=units)
    assert meta.did_succeed() and meta.did_change()
    assert sorted(c for c in cmds if c.startswith("rm -rf")) == [f"rm -rf {old}",
                                                                 f"rm -rf {stray}"]
    # no unit, no venv (no output at all): nothing to do
    meta, cmds = run(prune_venvs, {}, home=home, keep=2, unit_paths=units)
    assert meta.did_succeed() and not meta.did_change()
    # a read that fails fails the host (pyinfra's fact error), and deletes nothing
    meta, cmds = run(prune_venvs, {"grep -ah ": {"success": False, "stdout": []}},
                     home=home, keep=2, unit_paths=units)
    assert not any(c.startswith("rm ") for c in cmds), cmds
