"""gpuserve compare: the field notes' runs side by side, baselines, JSON, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.commands.compare import printable
from gpuserve.measure import compare as cmp
from gpuserve.measure import gate_runs as gr
from gpuserve.measure import gates
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
    read_file,
    read_results,
    smoke_record,
    write_record,
)
from gpuserve.measure.smoke import SmokeResult
from tests.unit.measure.test_gate_runs import EP_TEXTS, MATRIX_NONE, OFF, _evaluate

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"
NOTES = str(FIXTURES / "field-notes.jsonl")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def rows_of(out: str, profile: str) -> list[str]:
    """Table lines whose profile column (the second) is ``profile`` (footnote mark aside)."""
    return [ln for ln in out.splitlines()
            if len(cells := re.split(r"\s{2,}", ln)) > 2
            and re.sub(r" \[\d+\]$", "", cells[1]) == profile]


def line_of(out: str, profile: str) -> str:
    [line] = rows_of(out, profile)
    return line


def test_field_notes_eagle3_is_slower_than_the_baseline(capsys) -> None:
    rc, out, _ = run(capsys, NOTES)
    assert rc == 0
    # default baseline: the oldest record's profile (none has a timestamp: the first read)
    assert "baseline" in line_of(out, "glm5-nvfp4-tp8")
    eagle = line_of(out, "glm5-nvfp4-tp8-eagle3")
    assert " 54.1 " in eagle and " -39.6% " in eagle
    assert "baseline: glm5-nvfp4-tp8 " in out
    assert "COMPOSED from the field notes" in out, "composed figures stay labelled"


def test_field_notes_cuda_graph_cut_gain(capsys) -> None:
    rc, out, _ = run(capsys, NOTES, "--baseline", "glm5-nvfp4-tp8-cgbs512")
    assert rc == 0
    assert " +9.1% " in line_of(out, "glm5-nvfp4-tp8")
    assert "baseline" in line_of(out, "glm5-nvfp4-tp8-cgbs512")
    assert " -34.0% " in line_of(out, "glm5-nvfp4-tp8-eagle3")


def test_json_output(capsys) -> None:
    rc, out, _ = run(capsys, NOTES, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert (doc["view"], doc["baseline"], doc["skipped"]) == ("latest", "glm5-nvfp4-tp8", [])
    by = {r["profile"]: r for r in doc["rows"]}
    assert by["glm5-nvfp4-tp8"]["is_baseline"] and by["glm5-nvfp4-tp8"]["vs_baseline"] is None
    vs = by["glm5-nvfp4-tp8-eagle3"]["vs_baseline"]
    assert vs["profile"] == "glm5-nvfp4-tp8" and vs["output_tok_s"] == 89.5
    assert vs["change_pct"]["output_tok_s"] == pytest.approx(-39.55, abs=0.01)
    assert vs["change_pct"]["median_itl_ms"] is None, "the notes have no latency"
    assert by["glm5-nvfp4-tp8-cgbs512"]["vs_baseline"]["change_pct"]["output_tok_s"] < 0
    assert by["glm5-nvfp4-tp8-eagle3"]["source"].endswith("field-notes.jsonl:2")
    assert by["glm5-nvfp4-tp8-eagle3"]["note"].startswith("COMPOSED")


def test_directory_mixes_sglang_bench_and_smoke_records_by_workload(capsys) -> None:
    rc, out, _ = run(capsys, str(FIXTURES), "--baseline", "glm5-nvfp4-tp8")
    assert rc == 0
    # compared with the baseline bench of the same concurrency and lengths, not the notes
    [bench_eagle] = [r for r in rows_of(out, "glm5-nvfp4-tp8-eagle3") if " 16 " in r]
    assert " -36.9% " in bench_eagle and "1024/512" in bench_eagle
    assert any("1204.7" in r for r in rows_of(out, "glm5-nvfp4-tp8"))
    assert not [r for r in rows_of(out, "glm5-nvfp4-tp8") if " smoke " in r], "smoke hidden"
    assert "1 smoke group(s) not shown: --smoke shows them." in out
    rc, out, _ = run(capsys, str(FIXTURES), "--baseline", "glm5-nvfp4-tp8", "--smoke")
    [smoke] = [r for r in rows_of(out, "glm5-nvfp4-tp8") if " smoke " in r]
    assert smoke.startswith("gpu1 ") and " 33.7 " in smoke and "baseline" in smoke


def test_run_without_a_comparable_baseline_says_so(capsys) -> None:
    recs = read_file(FIXTURES / "sglang-bench.jsonl") + read_file(NOTES)
    rows = latest_view(recs[1:], "glm5-nvfp4-tp8")
    eagle16 = next(r for r in rows if r.group.latest.concurrency == 16)
    assert not eagle16.is_baseline and eagle16.change is None
    rc, out, _ = run(capsys, NOTES, str(FIXTURES / "sglang-bench.jsonl"),
                     "--baseline", "glm5-nvfp4-tp8-cgbs512")
    assert [r for r in rows_of(out, "glm5-nvfp4-tp8-eagle3") if " 16 " in r][0].split()[-2] \
        == "n/a"


def test_latest_baseline_run_is_the_reference(tmp_path: Path) -> None:
    lines = [{"schema": "gpuserve.result/1", "kind": "smoke", "profile": p, "host": "h",
              "timestamp": ts, "figures": {"tok_s": v}}
             for p, ts, v in [("a", "2026-11-29T10:00:00Z", 100.0),
                              ("a", "2026-11-29T11:00:00Z", 50.0),
                              ("b", "2026-11-29T10:30:00Z", 75.0)]]
    f = tmp_path / "runs.jsonl"
    f.write_text("".join(json.dumps(d) + "\n" for d in lines))
    rows = latest_view(read_file(f), "a")
    a, b = rows
    assert a.is_baseline and len(a.group.runs) == 2 and a.group.latest.output_tok_s == 50.0
    assert a.group.tok_s_range == (50.0, 100.0)
    assert b.change.reference.output_tok_s == 50.0
    assert b.change.pct["output_tok_s"] == pytest.approx(50.0)


def test_unknown_baseline_is_an_input_error(capsys) -> None:
    rc, _, err = run(capsys, NOTES, "--baseline", "glm5-nope")
    assert rc == 2
    assert "--baseline: no record of profile 'glm5-nope'" in err


def test_bad_file_exits_2_naming_file_and_line(tmp_path: Path, capsys) -> None:
    f = tmp_path / "bench.jsonl"
    f.write_text('{"output_throughput": 10}\n{"output_throughput": "x"}\n')
    rc, _, err = run(capsys, str(f))
    assert rc == 2
    assert f"gpuserve: error: {f}:2: output_throughput: must be a finite number" in err


def test_empty_directory_is_an_input_error(tmp_path: Path, capsys) -> None:
    rc, _, err = run(capsys, str(tmp_path))
    assert rc == 2 and "no result records found" in err


def test_directory_of_non_results_only_says_what_it_skipped(tmp_path: Path, capsys) -> None:
    (tmp_path / "host.json").write_text('{\n  "p2p": "none"\n}\n')
    rc, _, err = run(capsys, str(tmp_path))
    assert rc == 2 and "no result records found (1 non-result files skipped)" in err


# --------------------------------------------------------------------------------------
# gpuserve compare never writes a record's control characters to the terminal.
#
# Records are plain JSON files anyone can edit; a profile, host or note holding ESC[2J (clear
# screen), a carriage return or a bidi override must show escaped in the text output, while --json
# keeps the data unchanged.


BENCH = Path(__file__).resolve().parents[2] / "fixtures" / "bench"
C1_TEXT = (BENCH / "sglang-serving-composed.jsonl").read_text().splitlines()[0]  # composed

CLEAR, CR, BIDI = "\x1b[2J", "\r", "\u202e"


def hand_edited_records(tmp_path: Path) -> Path:
    """Two real-shaped records, then edited by hand the way a hostile user would."""
    spec = RecordSpec(results_dir="results", profile="base", launch_hash="sha256:" + "0" * 64,
                      sglang_version="0.5.23", model="/m", served_name="m",
                      lock="sglang-0.5.23-cu13-py311")
    line = parse_sglang_line(C1_TEXT, "composed")
    for ts in ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"):
        path = write_record(tmp_path, bench_record(spec, "gpu1", "c1", line, timestamp=ts))
    doc = json.loads(path.read_text())
    doc["profile"] = f"evil{CLEAR}"
    doc["host"] = f"gpu1{CR}spoofed"
    doc["note"] = f"see{BIDI}txt.exe"
    path.write_text(json.dumps(doc))
    return tmp_path


def test_text_output_escapes_control_characters(tmp_path: Path, capsys) -> None:
    rc = main(["compare", str(hand_edited_records(tmp_path))])
    out = capsys.readouterr().out
    assert rc == 0
    assert not any(c in out for c in (CLEAR[0], CR, BIDI))
    assert "evil\\x1b[2J" in out
    assert "gpu1\\rspoofed" in out
    assert "see\\u202etxt.exe" in out


def test_table_columns_stay_aligned_after_escaping(tmp_path: Path, capsys) -> None:
    main(["compare", str(hand_edited_records(tmp_path))])
    lines = capsys.readouterr().out.split("\n\n")[0].splitlines()
    header, rule, *rows = lines
    scenario_col = header.index("scenario")
    assert all(row[scenario_col:].startswith("c1") for row in rows), lines


def strings(value) -> set[str]:
    """Every string anywhere in a JSON document."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(strings(v) for v in value.values()), set())
    if isinstance(value, list):
        return set().union(*(strings(v) for v in value), set())
    return set()


def test_json_output_keeps_the_data(tmp_path: Path, capsys) -> None:
    main(["compare", "--json", "--history", str(hand_edited_records(tmp_path))])
    values = strings(json.loads(capsys.readouterr().out))
    assert f"evil{CLEAR}" in values
    assert f"gpu1{CR}spoofed" in values
    assert not any("\\x1b" in v for v in values)  # never escaped twice


def test_printable_leaves_ordinary_text_alone() -> None:
    assert printable("glm5-nvfp4-tp8 [1]  ü 4.2%") == "glm5-nvfp4-tp8 [1]  ü 4.2%"
    assert printable("a\tb\x07") == "a\\tb\\x07"


# --------------------------------------------------------------------------------------
# gpuserve compare shows the host deploy's measured GPU gates (gpuserve.measure/1 records) side by
# side: all-reduce busbw at the gate size against its expectation or baseline, the small-message
# latency, P2P on/off and why, all-gather/all-to-all on EP hosts; control characters from records
# escaped like the other views.
#
# The records are what the measuring stage writes (gate_runs.evaluate of the composed outputs in
# tests/fixtures/gates, labelled composed there).


RESULTS = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def _slow(records=()) -> gr.Evaluation:
    """A VM measured before (its baseline), now at half speed (the lab's gates-slow)."""
    import tests.unit.doctor.test_doctor as dm

    return dm._evaluation("none", {"p2p_off": OFF, "matrix": MATRIX_NONE},
                          virtualization="kvm", records=records, slow=2)


def _write(root: Path, record: dict, **changes) -> Path:
    return gates.write_measure_record(root, {**record, **changes})


@pytest.fixture
def results(tmp_path: Path) -> Path:
    ep = _evaluate("ok", EP_TEXTS, collectives=gr.COLLECTIVES)  # bare metal, P2P kept on
    _write(tmp_path, ep.record)
    hung = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_NONE})
    _write(tmp_path, hung.record, host="gpu2", timestamp="2026-12-01T09:00:00Z")
    vm = _evaluate("none", {"p2p_off": OFF, "matrix": MATRIX_NONE}, virtualization="kvm")
    _write(tmp_path, vm.record, host="vm1", timestamp="2026-12-01T08:00:00Z")
    slow = _slow(records=[vm.record])
    _write(tmp_path, slow.record, host="vm1", timestamp="2026-12-01T12:00:00Z")
    return tmp_path


def test_latest_per_host_side_by_side(results: Path):
    measures: list[dict] = []
    assert read_results(results, [], measures) == []
    rows = {r.host: r for r in cmp.gate_view(measures)}
    assert list(rows) == ["gpu1", "gpu2", "vm1"]
    gpu1, gpu2, vm1 = rows["gpu1"], rows["gpu2"], rows["vm1"]
    assert (gpu1.p2p, gpu1.busbw_gbs, gpu1.size_bytes) == (True, 38.37, 2147483648)
    assert (gpu1.p2p_on_gbs, gpu1.p2p_off_gbs, gpu1.latency_us) == (38.37, 25.81, 26.4)
    assert (gpu1.all_gather_gbs, gpu1.alltoall_gbs) == (37.3, 28.8) and gpu1.passed
    assert gpu2.p2p_result == "hung" and gpu2.p2p_on_hung and gpu2.env == {
        "NCCL_P2P_DISABLE": "1"}
    assert gpu2.all_gather_gbs is None and gpu2.passed
    assert vm1.runs == 2 and vm1.busbw_gbs == 12.9 and vm1.busbw_status == "fail"
    assert (vm1.busbw_reference, vm1.busbw_reference_kind) == (25.81, "baseline")
    assert not vm1.passed and "all_reduce_busbw@2147483648" in vm1.failed
    history = cmp.gate_view(measures, history=True)
    assert [(r.host, r.timestamp) for r in history][-2:] == [
        ("vm1", "2026-12-01T08:00:00Z"), ("vm1", "2026-12-01T12:00:00Z")]


def test_text_and_json(results: Path, capsys):
    assert main(["compare", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("measured GPU gates, latest per host")
    line = next(x for x in out.splitlines() if x.startswith("gpu1 "))
    for cell in ("pcie-p2p", " on ", "38.37 @2G", "new baseline", "26.4", "38.37/25.81",
                 "37.30", "28.80", "2.30.7", "pass"):
        assert cell in line, (cell, line)
    gpu2 = next(x for x in out.splitlines() if x.startswith("gpu2 "))
    assert "off (hung)" in gpu2 and "hung/25.81" in gpu2 and "-/" not in gpu2
    vm1 = next(x for x in out.splitlines() if x.startswith("vm1 "))
    assert "12.90 @2G" in vm1 and "FAIL (base 25.81)" in vm1 and "-/12.90" in vm1
    assert vm1.rstrip().endswith("FAIL")
    assert "vm1 2026-12-01T12:00:00Z: all_reduce_busbw@2147483648, all_reduce_latency@1024" \
        in out
    assert main(["compare", str(results), "--json", "--history"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["view"] == "history" and len(doc["gates"]) == 4 and doc["skipped"] == []
    first = doc["gates"][0]
    assert first["host"] == "gpu1" and first["all_gather_busbw_gbs"] == 37.3
    assert first["passed"] is True and first["source"].endswith("-measure-gates.json")


def test_beside_result_records_and_filtered_by_host(results: Path, capsys):
    assert main(["compare", str(RESULTS), str(results)]) == 0
    out = capsys.readouterr().out
    assert out.index("out tok/s") < out.index("measured GPU gates")
    assert main(["compare", str(RESULTS), str(results), "--host", "vm1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["host"] for g in doc["gates"]] == ["vm1"] and "rows" not in doc
    assert main(["compare", str(results), "--host", "gpu9"]) == 2
    assert "--host: no record with host 'gpu9' (known: gpu1, gpu2, vm1)" in \
        capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main(["compare", str(results), "--plot", str(results / "x.png")]) == 2
    assert "no result records to plot" in capsys.readouterr().err


def test_control_characters_from_records_are_escaped(results: Path, capsys):
    rec = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_NONE}).record
    _write(results, rec, host="gpu3\x1b[2J", timestamp="2026-12-01T13:00:00Z",
           nccl_version="2.30.7\r\u202espoof")
    assert main(["compare", str(results)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in ("\x1b", "\r", "\u202e"))
    assert "gpu3\\x1b[2J" in out and "2.30.7\\r\\u202espoof" in out
    header, rule = out.splitlines()[1:3]
    row = next(x for x in out.splitlines() if x.startswith("gpu3"))
    assert row.index("2026-12-01T13") == header.index("when"), "columns stay aligned"
    assert main(["compare", str(results), "--json"]) == 0
    hosts = [g["host"] for g in json.loads(capsys.readouterr().out)["gates"]]
    assert "gpu3\x1b[2J" in hosts, "--json keeps the data unchanged"


def test_a_broken_measure_record_names_its_file(tmp_path: Path, capsys):
    bad = tmp_path / "gpu1" / "x-measure-gates.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"schema": "gpuserve.measure/1", "host": "gpu1",
                               "timestamp": "t", "figures": {"bogus@1": 1}, "runs": [],
                               "verdicts": []}))
    assert main(["compare", str(tmp_path)]) == 2  # nothing usable left
    err = capsys.readouterr().err
    assert "no result records found (1 non-result files skipped)" in err
    skipped: list[str] = []
    assert read_results(tmp_path, skipped, []) == []
    assert "x-measure-gates.json: figures: must map" in skipped[0]
    assert "(not a usable gpuserve.measure/1 record)" in skipped[0]
    # without asking for them, measure records are skipped as before
    skipped = []
    assert read_results(tmp_path, skipped) == [] and "gpuserve.measure/1" in skipped[0]


# --------------------------------------------------------------------------------------
# gpuserve compare as the tool read after a profile switch: one row per scenario with its spread,
# the baseline's latest *good* run, history with what changed, filters, JSON.


FIXTURES_VIEWS = Path(__file__).resolve().parents[2] / "fixtures"
BENCH_VIEWS = FIXTURES_VIEWS / "bench"
RESULTS_VIEWS = str(BENCH_VIEWS / "results")  # composed: see tests/fixtures/bench/README.md
C1_TEXT_VIEWS, C64_TEXT = (BENCH_VIEWS / "sglang-serving-composed.jsonl").read_text().splitlines()
BASE, EAGLE = "glm5-nvfp4-tp8", "glm5-nvfp4-tp8-eagle3"


def run_views(capsys, *argv: str) -> tuple[int, str, str]:
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
          text: str = C1_TEXT_VIEWS, gate: dict | None = None, **spec_kw):
    line = {**parse_sglang_line(text, "composed"), "output_throughput": tok_s}
    return bench_record(spec(profile, **spec_kw), host, scenario, line, gate=gate,
                        timestamp=ts)


def test_default_view_one_row_per_scenario_profiles_side_by_side(capsys) -> None:
    rc, out, _ = run_views(capsys, RESULTS_VIEWS)
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
    assert f"skipped {RESULTS_VIEWS}/gpu1/host.json: no result record in it" in out
    assert "measure.json: timestamp: must be a non-empty string (not a usable " \
        "gpuserve.measure/1 record)" in out


def test_twenty_noop_reruns_are_one_row(tmp_path: Path, capsys) -> None:
    sp = spec(BASE)
    for i in range(20):
        smoke = SmokeResult("/v1/completions", 64, 5, 1.9 + i / 100, " Paris")
        write_record(tmp_path, smoke_record(sp, "gpu1", smoke,
                                            timestamp=f"2026-11-29T12:{i:02d}:00Z"))
    rc, out, _ = run_views(capsys, str(tmp_path))
    assert rc == 0
    [row] = table(out)  # nothing else recorded: the smoke group is shown without --smoke
    assert row[:3] == ["gpu1", BASE, "smoke"]
    assert row[5:7] == ["30.6", "20 (30.6-33.7)"]  # 64 tokens in 2.09 s, the latest


def test_smoke_rows_come_after_bench_rows_with_the_flag(capsys) -> None:
    rc, out, _ = run_views(capsys, RESULTS_VIEWS, "--smoke")
    rows = table(out)
    assert [r[2] for r in rows] == ["single", "single", "batch", "batch", "smoke"]
    assert rows[-1][6] == "3 (33.7-33.7)" and "not shown" not in out


def test_failed_gate_is_never_a_reference(capsys) -> None:
    rc, out, _ = run_views(capsys, RESULTS_VIEWS, "--baseline", EAGLE)
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
    rc, out, _ = run_views(capsys, str(tmp_path))
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
    rc, out, _ = run_views(capsys, str(tmp_path), "--history", "--profile", BASE)
    assert rc == 0
    rows = table(out)
    assert [r[0] for r in rows] == ["2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z",
                                    "2026-11-29T12:00:00Z"], "oldest first, one profile"
    assert [r[-2:] for r in rows] == [
        ["-", "-"], ["+10.0%", "sglang 0.5.22->0.5.23, lock"], ["+0.0%", "launch"]]
    assert rows[2][-3] == "FAIL"
    doc = json.loads(run_views(capsys, str(tmp_path), "--history", "--json")[1])
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
    rc, out, _ = run_views(capsys, RESULTS_VIEWS, "--profile", EAGLE, "--scenario", "single")
    assert rc == 0
    [row] = table(out)
    assert row[1:3] == [EAGLE, "single"] and row[11] == "+45.6%"
    rc, out, _ = run_views(capsys, RESULTS_VIEWS, "--host", "gpu1", "--scenario", "smoke")
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
    rc, out, err = run_views(capsys, RESULTS_VIEWS, option, value)
    assert rc == 2 and out == ""
    assert f"gpuserve: error: <input>: {message}" in err


def test_json_latest_view_has_stable_keys(capsys) -> None:
    rc, out, _ = run_views(capsys, RESULTS_VIEWS, "--json")
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
    rc, out, _ = run_views(capsys, RESULTS_VIEWS, str(FIXTURES_VIEWS / "results"),
                           "--baseline", BASE)
    assert rc == 0
    profiles = {(r[0], r[1], r[3]) for r in table(out)}
    assert ("gpu1", EAGLE, "64") in profiles and ("-", EAGLE, "16") in profiles
