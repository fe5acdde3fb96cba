"""gpuserve compare: the field notes' runs side by side, baselines, JSON, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.commands.compare import compare
from gpuserve.measure.results import read_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"
NOTES = str(FIXTURES / "field-notes.jsonl")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def line_of(out: str, profile: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(profile + " "))


def test_field_notes_eagle3_is_slower_than_the_baseline(capsys) -> None:
    rc, out, _ = run(capsys, NOTES)
    assert rc == 0
    # default baseline: the first record's profile
    assert "baseline" in line_of(out, "glm5-nvfp4-tp8")
    eagle = line_of(out, "glm5-nvfp4-tp8-eagle3")
    assert "54.1" in eagle and "-39.6% vs glm5-nvfp4-tp8 89.5" in eagle
    assert "COMPOSED from the field notes" in out, "composed figures stay labelled"


def test_field_notes_cuda_graph_cut_gain(capsys) -> None:
    rc, out, _ = run(capsys, NOTES, "--baseline", "glm5-nvfp4-tp8-cgbs512")
    assert rc == 0
    assert "+9.1% vs glm5-nvfp4-tp8-cgbs512 82.0" in line_of(out, "glm5-nvfp4-tp8")
    assert "baseline" in line_of(out, "glm5-nvfp4-tp8-cgbs512")
    assert "-34.0% vs glm5-nvfp4-tp8-cgbs512 82.0" in line_of(out, "glm5-nvfp4-tp8-eagle3")


def test_json_output(capsys) -> None:
    rc, out, _ = run(capsys, NOTES, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["baseline"] == "glm5-nvfp4-tp8"
    by = {r["profile"]: r for r in doc["records"]}
    assert by["glm5-nvfp4-tp8"]["is_baseline"] and by["glm5-nvfp4-tp8"]["vs_baseline"] is None
    vs = by["glm5-nvfp4-tp8-eagle3"]["vs_baseline"]
    assert vs["profile"] == "glm5-nvfp4-tp8" and vs["output_tok_s"] == 89.5
    assert vs["change_pct"] == pytest.approx(-39.55, abs=0.01)
    assert by["glm5-nvfp4-tp8-cgbs512"]["vs_baseline"]["change_pct"] < 0
    assert by["glm5-nvfp4-tp8-eagle3"]["source"].endswith("field-notes.jsonl:2")


def test_directory_mixes_sglang_bench_and_smoke_records_by_workload(capsys) -> None:
    rc, out, _ = run(capsys, str(FIXTURES), "--baseline", "glm5-nvfp4-tp8")
    assert rc == 0
    rows = [ln for ln in out.splitlines() if ln.startswith("glm5-")]
    # grouped by (profile, host): both glm5-nvfp4-tp8 runs without a host come first
    assert [r.split()[0] for r in rows[:2]] == ["glm5-nvfp4-tp8"] * 2
    bench_eagle = next(r for r in rows if r.startswith("glm5-nvfp4-tp8-eagle3") and " 16 " in r)
    # compared with the baseline bench of the same concurrency and lengths, not the smoke
    assert "-36.9% vs glm5-nvfp4-tp8 535.4" in bench_eagle
    assert "1204.7" in rows[0] or "1204.7" in rows[1]
    smoke = next(r for r in rows if " smoke " in r)
    assert "gpu1" in smoke and "0f3c1d2e" in smoke and "33.7" in smoke and "baseline" in smoke


def test_run_without_a_comparable_baseline_says_so(tmp_path: Path) -> None:
    recs = read_file(FIXTURES / "sglang-bench.jsonl") + read_file(NOTES)
    rows = compare(recs[2:] + recs[1:2], "glm5-nvfp4-tp8")
    eagle16 = next(r for r in rows if r.record.concurrency == 16)
    assert eagle16.reference is None and eagle16.change_pct is None


def test_latest_baseline_run_is_the_reference(tmp_path: Path) -> None:
    lines = [{"schema": "gpuserve.result/1", "kind": "smoke", "profile": p, "host": "h",
              "timestamp": ts, "figures": {"tok_s": v}}
             for p, ts, v in [("a", "2026-11-29T10:00:00Z", 100.0),
                              ("a", "2026-11-29T11:00:00Z", 50.0),
                              ("b", "2026-11-29T10:30:00Z", 75.0)]]
    f = tmp_path / "runs.jsonl"
    f.write_text("".join(json.dumps(d) + "\n" for d in lines))
    rows = compare(read_file(f), "a")
    b = next(r for r in rows if r.record.profile == "b")
    assert b.reference.output_tok_s == 50.0 and b.change_pct == pytest.approx(50.0)
    older = next(r for r in rows if r.record.output_tok_s == 100.0)
    assert older.change_pct == pytest.approx(100.0), "older baseline runs vs the latest"


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
