"""gpuserve compare: the field notes' runs side by side, baselines, JSON, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.measure.compare import latest_view
from gpuserve.measure.results import read_file

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
