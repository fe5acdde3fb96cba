"""The output-quality check on a lab container host (roles/checks/quality.py, the stand-in's
toy model and its composed perturbations: lab/sglang_standin/README.md).

One module, one host: the inventory profile serves and records the checkpoint's quality
reference; a switch to a profile whose launch is healthy but broken (NaN logprobs) fails
its quality check, rolls back and names the metric; a switch to an FP8-KV-like launch
passes and records its KLD; the good profile is served again at the end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from labhelpers import clean, healthy, host_provisioned, served_profile

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BROKEN = REPO / "tests/fixtures/profiles/lab-quality-broken.yaml"
FP8KV = REPO / "tests/fixtures/profiles/lab-quality-fp8kv.yaml"


def serve(lab, *args: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", *args, check=False)
    return r.returncode, clean(r.stdout)


def quality_runs(lab, profile: str) -> list[dict]:
    folder = lab.results_dir / "quality" / "lab-gpu"
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"*-quality-{profile}.json"))]


@pytest.fixture(scope="module")
def reference(lab) -> Path:
    """The inventory profile served, its quality check passed and the reference written."""
    host_provisioned(lab)
    rc, out = serve(lab)
    assert rc == 0, out[-6000:]
    refs = sorted((lab.results_dir / "quality" / "reference").glob("*.json"))
    assert refs, out[-6000:]
    assert re.search(r"lab-gpu: quality: (ok against|skipped)", out), out[-6000:]
    return refs[-1]


def test_a_broken_launch_fails_its_quality_check_and_is_rolled_back(lab, reference):
    rc, out = serve(lab, "--data", f"profile={BROKEN}")
    assert rc != 0, out[-6000:]
    assert "quality: profile lab-quality-broken failed its quality check: " in out, out[-6000:]
    assert re.search(r"non_finite_logprobs \d+ \(limit 0\).*\[reference "
                     + re.escape(reference.name) + r"\]", out), out[-6000:]
    assert "rolled back to profile glm5-nvfp4-tp8" in out, out[-6000:]
    assert served_profile(lab) == "glm5-nvfp4-tp8" and healthy(lab)
    run = quality_runs(lab, "lab-quality-broken")[-1]
    assert run["verdict"]["passed"] is False and run["reference"] == reference.name


def test_an_fp8_kv_launch_passes_and_records_its_kld(lab, reference):
    rc, out = serve(lab, "--data", f"profile={FP8KV}")
    assert rc == 0, out[-6000:]
    assert re.search(r"lab-gpu: quality: ok against .*KLD mean", out), out[-6000:]
    run = quality_runs(lab, "lab-quality-fp8kv")[-1]
    assert run["verdict"]["passed"] is True
    assert 0 < run["figures"]["kld_mean"] < 0.02
    rc, out = serve(lab)  # leave the host as the other modules expect it
    assert rc == 0 and served_profile(lab) == "glm5-nvfp4-tp8", out[-6000:]
