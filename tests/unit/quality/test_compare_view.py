"""gpuserve compare shows the latest quality check per host and profile beside the
throughput records of the same results directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpuserve.cli import main
from gpuserve.launch.quality_spec import QualitySpec
from gpuserve.quality.judge import judge
from gpuserve.quality.record import PromptResult, QualityRun, write_reference, write_run

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def qrun(profile: str, stamp: str, ids: list[int], nan: int = 0) -> QualityRun:
    prompts = [PromptResult(id="completion-0", kind="completion", output_ids=ids, text="x",
                            finish="length", completion_tokens=len(ids), non_finite=nan,
                            forced=[[[t, -0.1], [t + 1, -2.5]] for t in ids])]
    return QualityRun(host="gpu1", profile=profile, model="m", revision=None,
                      sglang_version="0.5.23", launch_hash=profile, timestamp=stamp,
                      prompts=prompts, elapsed_s=1.5)


def test_compare_prints_the_quality_table_and_its_json(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    ref = qrun("glm5-nvfp4-tp8", "2026-12-06T10:00:00Z", list(range(10, 26)))
    judge(ref, None, QualitySpec(), None)
    write_reference(results, ref)
    write_run(results, ref)
    bad = qrun("glm5-broken", "2026-12-06T10:05:00Z", [7] * 16, nan=12)
    judge(bad, ref, QualitySpec(), "m.json")
    write_run(results, bad)

    assert main(["compare", str(results), "--baseline", "glm5-nvfp4-tp8"]) == 0
    out = capsys.readouterr().out
    assert "quality (the latest check per host and profile" in out
    [line] = [ln for ln in out.splitlines() if ln.startswith("gpu1") and "glm5-broken" in ln]
    assert "FAIL" in line and "non_finite_logprobs" in line and "m.json" in line
    assert "gpuserve.quality/1" not in out  # not reported as a skipped file

    assert main(["compare", str(results), "--baseline", "glm5-nvfp4-tp8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["profile"]: r for r in doc["quality"]}
    assert rows["glm5-nvfp4-tp8"]["passed"] and not rows["glm5-broken"]["passed"]
