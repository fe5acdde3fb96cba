"""Throughput gate and memory preflight on the lab host (deploy/serve.py).

Runs after test_serve.py (same session `lab` fixture), whose last state is a healthy,
benchmarked glm5-nvfp4-tp8 deploy with secrets. Then: a profile that cannot fit is
refused by the preflight (from the lab checkpoint's safetensors headers) before the
unit changes; a profile whose throughput expectation is missed fails with the numbers
side by side and, with on_regression: rollback, serves glm5-nvfp4-tp8 again;
`gpuserve compare --plot` draws the session's records; a rerun of the good profile
reports no changes and does not benchmark.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from labhelpers import served_profile

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/fixtures/profiles"
UNIT = "gpuserve-sglang.service"
HF_TOKEN = "hf_labTokenNeverOnArgv0123"
API_KEY = "sk-lab-key-never-on-argv-4567"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("group_data")
    (d / "all.py").write_text(f"hf_token = {HF_TOKEN!r}\nsglang_api_key = {API_KEY!r}\n")
    return d


def serve(lab, data: Path, *args: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/serve.py", *args, "--group-data", str(data), check=False)
    return r.returncode, ANSI.sub("", r.stdout)


def unit_state(lab) -> str:
    return lab.ssh(f"sha1sum /etc/systemd/system/{UNIT} /etc/gpuserve/sglang.env; "
                   f"systemctl show -p InvocationID,ActiveState {UNIT}", check=True).stdout


def test_good_profile_is_served(lab, data) -> None:
    rc, out = serve(lab, data)
    assert rc == 0, out[-6000:]


def test_profile_that_cannot_fit_is_refused_before_the_unit_changes(lab, data) -> None:
    before = unit_state(lab)
    rc, out = serve(lab, data, "--data", f"profile={FIXTURES / 'lab-does-not-fit.yaml'}")
    assert rc != 0, out[-6000:]
    assert "lab-does-not-fit" in out and "preflight" in out, out[-6000:]
    # the fraction that would fit: the planner's, or once this host's start is recorded
    # (the serve deploy above), the calibration's
    assert re.search(r"(raise --mem-fraction-static|set mem_fraction_static) to 0\.\d+",
                     out), out[-6000:]
    assert "from the checkpoint" in out or "checkpoint" in out, out[-6000:]
    assert "Beginning operation run" not in out
    assert unit_state(lab) == before


def test_missed_expectation_is_reported_and_rolled_back(lab, data) -> None:
    rc, out = serve(lab, data, "--data",
                    f"profile={FIXTURES / 'lab-missed-expectation.yaml'}")
    assert rc != 0, out[-6000:]
    assert "bench: profile lab-missed-expectation missed its throughput gate" in out, \
        out[-6000:]
    assert re.search(r"single: output_throughput [\d,.]+ tok/s, expected >= 1,000\.0 tok/s",
                     out), out[-6000:]
    assert re.search(r"single: median_ttft_ms [\d,.]+ ms, expected <= 60,000\.0 ms", out)
    assert ("the host was rolled back to profile glm5-nvfp4-tp8, which is healthy again"
            in out), out[-6000:]
    assert HF_TOKEN not in out and API_KEY not in out
    assert served_profile(lab) == "glm5-nvfp4-tp8"
    assert lab.ssh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    missed = list((lab.results_dir / "lab-gpu").glob("*-bench-lab-missed-expectation-*"))
    assert len(missed) == 1, missed  # recorded, not lost
    assert json.loads(missed[0].read_text())["gate"]["passed"] is False


def test_compare_plots_the_recorded_runs(lab, tmp_path) -> None:
    png = tmp_path / "out.png"
    r = subprocess.run([sys.executable, "-m", "gpuserve", "compare", str(lab.results_dir),
                        "--plot", str(png)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "glm5-nvfp4-tp8" in r.stdout and "lab-missed-expectation" in r.stdout


def test_rerun_of_the_good_profile_changes_nothing(lab, data) -> None:
    rc, out = serve(lab, data)
    assert rc == 0, out[-6000:]
    assert "lab-gpu: bench: skipped" in out
    total = [line for line in out.splitlines() if line.strip().startswith("Grand total")]
    assert total and total[-1].split()[3] == "-", total
