"""gpuserve compare as the tool read after a profile switch: one row per scenario with its
spread, the baseline's latest *good* run, history with what changed, filters, JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.measure.compare import (
    chronological,
    default_baseline,
    history_view,
    latest_view,
)
from gpuserve.measure.results import (
    RecordSpec,
    bench_record,
    parse_sglang_line,
    read_results,
    smoke_record,
    write_record,
)
from gpuserve.measure.smoke import SmokeResult

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BENCH = FIXTURES / "bench"
RESULTS = str(BENCH / "results")  # composed: see tests/fixtures/bench/README.md
C1_TEXT, C64_TEXT = (BENCH / "sglang-serving-composed.jsonl").read_text().splitlines()
BASE, EAGLE = "glm5-nvfp4-tp8", "glm5-nvfp4-tp8-eagle3"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def table(out: str) -> list[list[str]]:
    """Cells of the table rows (header and rule left out), split on runs of 2+ spaces."""
    lines = out.split("\n\n")[0].splitlines()[2:]
    return [re.split(r"\s{2,}", ln.strip()) for ln in lines]


def spec(profile: str, version: str = "0.5.23", lock: str = "sglang-0.5.23-cu13-py311",
         launch: str = "sha256:" + "0" * 64) -> RecordSpec:
    return RecordSpec(results_dir="results", profile=profile, launch_hash=launch,
                      sglang_version=version, model="/m", served_name="m", lock=lock)


def bench(profile: str, scenario: str, tok_s: float, ts: str, *, host: str = "gpu1",
          text: str = C1_TEXT, gate: dict | None = None, **spec_kw):
    line = {**parse_sglang_line(text, "composed"), "output_throughput": tok_s}
    return bench_record(spec(profile, **spec_kw), host, scenario, line, gate=gate,
                        timestamp=ts)


def test_default_view_one_row_per_scenario_profiles_side_by_side(capsys) -> None:
    rc, out, _ = run(capsys, RESULTS)
    assert rc == 0
    rows = table(out)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("gpu1", BASE, "single", "1"), ("gpu1", EAGLE, "single", "1"),
        ("gpu1", BASE, "batch", "64"), ("gpu1", EAGLE, "batch", "64")]
    base_single, eagle_single, _, eagle_batch = rows
    # the latest run, and the spread of its three runs
    assert base_single[5:7] == ["90.1", "3 (88.9-90.1)"]
    assert base_single[7:11] == ["117.9", "11.0", "212.2", "0.5.23"]
    assert base_single[11:] == ["baseline", "pass"]
    # EAGLE-3 vs the baseline: more tok/s single-stream, ITL down, TTFT up
    assert eagle_single[11:] == ["+45.6%", "+6.3%", "-32.7%", "pass"]
    assert eagle_batch[11:] == ["-22.8%", "+17.9%", "+30.3%", "FAIL"]
    assert "1 smoke group(s) not shown: --smoke shows them." in out
    assert f"skipped {RESULTS}/gpu1/host.json: no result record in it" in out
    assert "measure.json: timestamp: must be a non-empty string (not a usable " \
        "gpuserve.measure/1 record)" in out


def test_twenty_noop_reruns_are_one_row(tmp_path: Path, capsys) -> None:
    sp = spec(BASE)
    for i in range(20):
        smoke = SmokeResult("/v1/completions", 64, 5, 1.9 + i / 100, " Paris")
        write_record(tmp_path, smoke_record(sp, "gpu1", smoke,
                                            timestamp=f"2026-11-29T12:{i:02d}:00Z"))
    rc, out, _ = run(capsys, str(tmp_path))
    assert rc == 0
    [row] = table(out)  # nothing else recorded: the smoke group is shown without --smoke
    assert row[:3] == ["gpu1", BASE, "smoke"]
    assert row[5:7] == ["30.6", "20 (30.6-33.7)"]  # 64 tokens in 2.09 s, the latest


def test_smoke_rows_come_after_bench_rows_with_the_flag(capsys) -> None:
    rc, out, _ = run(capsys, RESULTS, "--smoke")
    rows = table(out)
    assert [r[2] for r in rows] == ["single", "single", "batch", "batch", "smoke"]
    assert rows[-1][6] == "3 (33.7-33.7)" and "not shown" not in out


def test_failed_gate_is_never_a_reference(capsys) -> None:
    rc, out, _ = run(capsys, RESULTS, "--baseline", EAGLE)
    rows = {(r[1], r[2]): r for r in table(out)}
    assert rows[(BASE, "single")][11:14] == ["-31.3%", "-5.9%", "+48.6%"]
    # EAGLE-3's only batch run failed its gate: nothing to compare the baseline's with
    assert rows[(BASE, "batch")][11:] == ["n/a", "pass"]
    assert rows[(EAGLE, "batch")][11:] == ["baseline", "FAIL"]


def test_other_hosts_and_workloads_are_never_compared(tmp_path: Path) -> None:
    records = [bench(BASE, "single", 90.0, "2026-11-29T10:00:00Z"),
               bench(EAGLE, "single", 130.0, "2026-11-29T11:00:00Z", host="gpu2"),
               bench(EAGLE, "batch", 1000.0, "2026-11-29T11:00:00Z", text=C64_TEXT)]
    rows = latest_view(records, BASE)
    assert [(r.group.host, r.group.profile, r.change) for r in rows[1:]] == [
        ("gpu1", EAGLE, None), ("gpu2", EAGLE, None)]


def test_default_baseline_is_the_oldest_records_profile(tmp_path: Path, capsys) -> None:
    write_record(tmp_path, bench("zz-old", "single", 80.0, "2026-01-01T00:00:00Z"))
    write_record(tmp_path, bench("aa-new", "single", 100.0, "2026-02-01T00:00:00Z"))
    records = read_results(tmp_path)
    assert default_baseline(records) == "zz-old"
    assert [r.profile for r in chronological(records)] == ["zz-old", "aa-new"]
    rc, out, _ = run(capsys, str(tmp_path))
    assert "baseline: zz-old " in out
    assert {r[1]: r[11] for r in table(out)} == {"zz-old": "baseline", "aa-new": "+25.0%"}


def test_history_lists_every_run_with_the_change_and_what_changed(tmp_path: Path,
                                                                 capsys) -> None:
    for rec in [
        bench(BASE, "single", 80.0, "2026-11-29T10:00:00Z", version="0.5.22",
              lock="sglang-0.5.22-cu13-py311"),
        bench(BASE, "single", 88.0, "2026-11-29T11:00:00Z"),
        bench(BASE, "single", 88.0, "2026-11-29T12:00:00Z", launch="sha256:" + "1" * 64,
              gate={"passed": False, "misses": ["single: 88 < 90"], "checked": []}),
        bench(EAGLE, "single", 130.0, "2026-11-29T13:00:00Z"),
    ]:
        write_record(tmp_path, rec)
    rc, out, _ = run(capsys, str(tmp_path), "--history", "--profile", BASE)
    assert rc == 0
    rows = table(out)
    assert [r[0] for r in rows] == ["2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z",
                                    "2026-11-29T12:00:00Z"], "oldest first, one profile"
    assert [r[-2:] for r in rows] == [
        ["-", "-"], ["+10.0%", "sglang 0.5.22->0.5.23, lock"], ["+0.0%", "launch"]]
    assert rows[2][-3] == "FAIL"
    doc = json.loads(run(capsys, str(tmp_path), "--history", "--json")[1])
    assert doc["view"] == "history" and len(doc["rows"]) == 4
    second = doc["rows"][1]
    assert second["vs_previous"]["change_pct"]["output_tok_s"] == 10.0
    assert second["changed"] == ["sglang 0.5.22->0.5.23", "lock"]
    assert doc["rows"][2]["gate"] == "fail" and doc["rows"][2]["gate_misses"] == [
        "single: 88 < 90"]


def test_history_view_keeps_groups_apart(tmp_path: Path) -> None:
    records = [bench(BASE, "single", 90.0, "2026-11-29T10:00:00Z"),
               bench(BASE, "batch", 1400.0, "2026-11-29T10:01:00Z", text=C64_TEXT),
               bench(BASE, "single", 99.0, "2026-11-29T11:00:00Z")]
    rows = history_view(records)
    assert [(r.group.scenario, r.record.output_tok_s) for r in rows] == [
        ("single", 90.0), ("single", 99.0), ("batch", 1400.0)]
    assert rows[1].change.pct["output_tok_s"] == pytest.approx(10.0)
    assert rows[2].change is None, "a batch run is not the next single run"


def test_filters_keep_the_unfiltered_baseline(capsys) -> None:
    rc, out, _ = run(capsys, RESULTS, "--profile", EAGLE, "--scenario", "single")
    assert rc == 0
    [row] = table(out)
    assert row[1:3] == [EAGLE, "single"] and row[11] == "+45.6%"
    rc, out, _ = run(capsys, RESULTS, "--host", "gpu1", "--scenario", "smoke")
    assert [r[2] for r in table(out)] == ["smoke"]


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--profile", "glm5-typo", "--profile: no record with profile 'glm5-typo' (known: "
     "glm5-nvfp4-tp8, glm5-nvfp4-tp8-eagle3)"),
    ("--host", "gpu9", "--host: no record with host 'gpu9' (known: gpu1)"),
    ("--scenario", "c8", "--scenario: no record with scenario 'c8' (known: batch, single, "
     "smoke)"),
    ("--baseline", "glm4", "--baseline: no record of profile 'glm4'"),
])
def test_unknown_filter_values_are_input_errors(capsys, option, value, message) -> None:
    rc, out, err = run(capsys, RESULTS, option, value)
    assert rc == 2 and out == ""
    assert f"gpuserve: error: <input>: {message}" in err


def test_json_latest_view_has_stable_keys(capsys) -> None:
    rc, out, _ = run(capsys, RESULTS, "--json")
    assert rc == 0
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert (doc["view"], doc["baseline"]) == ("latest", BASE)
    assert len(doc["skipped"]) == 2
    first = doc["rows"][0]
    assert set(first) == {
        "host", "profile", "scenario", "kind", "concurrency", "input_len", "output_len",
        "timestamp", "source", "output_tok_s", "median_ttft_ms", "median_itl_ms",
        "p99_ttft_ms", "sglang_version", "lock", "launch_hash", "profile_hash", "gate",
        "gate_misses", "note", "runs", "output_tok_s_min", "output_tok_s_max",
        "is_baseline", "vs_baseline"}
    assert (first["runs"], first["output_tok_s_min"], first["output_tok_s_max"]) == (
        3, 88.9, 90.1)
    assert first["is_baseline"] and first["vs_baseline"] is None
    eagle = doc["rows"][1]
    assert eagle["vs_baseline"]["timestamp"] == "2026-11-29T12:00:00Z"
    assert eagle["vs_baseline"]["change_pct"] == {
        "output_tok_s": 45.62, "median_ttft_ms": 6.28, "median_itl_ms": -32.73}


def test_v1_and_v2_directories_read_together(capsys) -> None:
    rc, out, _ = run(capsys, RESULTS, str(FIXTURES / "results"), "--baseline", BASE)
    assert rc == 0
    profiles = {(r[0], r[1], r[3]) for r in table(out)}
    assert ("gpu1", EAGLE, "64") in profiles and ("-", EAGLE, "16") in profiles
