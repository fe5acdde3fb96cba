"""The serve preflight calibrated by the host's own start, on the reference box.

The lab host's SGLang stand-in prints the field notes' memory lines on the reference box
(lab/sglang_standin/README.md, "Memory on the lab's box"): 94 GB free before weights,
21.7 after TP8's. The serve deploy keeps that start's figures on the controller
(gpuserve.start/1 under the instance's results directory); a switch to EP8 at
mem_fraction_static 0.78, the notes' failing launch, is then refused by ``--dry --diff``
and by the real deploy, naming the measured numbers, before anything changes on the
host; at 0.83 it proceeds with its margin shown. The composed checkpoint's headers alone
put 38 GiB free after TP8's weights, where 0.78 "fits".

Reuses the host the serve modules leave (glm5-nvfp4-tp8); one restart records its start
in this module's own results directory.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from labhelpers import ENV_PATH, UNIT, UNIT_PATH, clean, serve_inventory_profile, served_profile

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
EP8 = REPO / "profiles" / "glm5-nvfp4-tp8-ep8.yaml"
#: nvidia-smi memory.total of the reference box's RTX PRO 6000 (lab/nvidia_repo/boxes)
REFERENCE_CARD_MIB = 97887


def live(lab) -> tuple[str, str, str]:
    """The unit's and env file's hashes and the server's PID."""
    out = lab.ssh(f"sha256sum {UNIT_PATH} {ENV_PATH}; systemctl show -p MainPID --value {UNIT}",
                  check=True).stdout.split()
    return out[0], out[2], out[4]


def tp8_starts(results: Path) -> list[dict]:
    """The recorded starts of glm5-nvfp4-tp8 on the lab host, newest last."""
    folder = results / "lab-gpu"
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("*-start-*.json"))]
    return [d for d in docs if d["launch"]["profile"] == "glm5-nvfp4-tp8"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """This module's own results directory (host data ``results_dir``): the host's only
    measured start is the TP8 one this module makes, whatever other modules recorded
    (an EP8 start of theirs would be the closer one to calibrate EP8 from)."""
    return tmp_path_factory.mktemp("calibrated-results")


def ep8_at(tmp: Path, fraction: float) -> Path:
    """The shipped EP8 profile with ``fraction`` as its static fraction."""
    path = tmp / f"glm5-ep8-mfs{int(fraction * 100)}.yaml"
    path.write_text(f"extends: {EP8}\nmemory:\n  mem_fraction_static: {fraction}\n")
    return path


@pytest.fixture(scope="module")
def measured(lab, results) -> dict:
    """The host serving TP8 with that start recorded on the controller."""
    serve_inventory_profile(lab)
    # a variable the stand-in ignores, new each time: the unit's env changes, so the
    # deploy restarts the server and records this start in the module's directory
    env = json.dumps({"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "2",
                      "GPUSERVE_LAB_START": str(time.time_ns())})
    lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", "--data",
                    f"results_dir={results}", "--data", f"sglang_extra_env={env}")
    starts = tp8_starts(results)
    assert starts, "the serve deploy recorded no start"
    start = starts[-1]
    assert start["outcome"] == "ready" and len(start["ranks"]) == 8
    assert start["gpu"]["memory_total_mib"] == REFERENCE_CARD_MIB
    after = min(r["free_after_weights_gib"] for r in start["ranks"])
    assert after == pytest.approx(21.7, abs=0.05)
    return start


def deploy(lab, results: Path, *args: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", "--data",
                        f"results_dir={results}", *args, check=False)
    return r.returncode, clean(r.stdout)


def refused_with_the_measured_numbers(out: str) -> None:
    assert "preflight" in out and "does not fit" in out, out[-6000:]
    # the measured TP8 start, and what it says of EP8
    assert re.search(r"free after weights 16\.2\d \+- 1\.50 of \d+\.\d+ GiB/GPU", out), \
        out[-6000:]
    assert re.search(r"21\.6\d GiB free after weights measured\n\s+start record: \S+"
                     r"-start-glm5-nvfp4-tp8\.json", out), out[-6000:]
    # one minimum, the one that clears the uncertainty (the rest reaches 0 at 0.827)
    assert re.search(r"minimum viable mem_fraction_static 0\.84\d", out), out[-6000:]
    assert "pyinfra error" not in out, out[-6000:]
    assert "nothing on the host was changed" in out, out[-6000:]
    assert "Beginning operation run" not in out


def test_dry_diff_of_ep8_at_0_78_is_refused_with_the_measured_numbers(
        lab, results, measured, tmp_path) -> None:
    before = live(lab)
    rc, out = deploy(lab, results, "--dry", "--diff", "--data",
                     f"profile={ep8_at(tmp_path, 0.78)}")
    assert rc != 0, out[-6000:]
    refused_with_the_measured_numbers(out)
    assert live(lab) == before


def test_the_real_deploy_of_ep8_at_0_78_refuses_without_touching_the_host(
        lab, results, measured, tmp_path) -> None:
    before = live(lab)
    rc, out = deploy(lab, results, "--data", f"profile={ep8_at(tmp_path, 0.78)}")
    assert rc != 0, out[-6000:]
    refused_with_the_measured_numbers(out)
    assert live(lab) == before  # unit, env file and server PID unchanged
    assert served_profile(lab) == "glm5-nvfp4-tp8"


def test_dry_diff_of_ep8_at_0_83_proceeds_with_its_margin(lab, results, measured,
                                                          tmp_path) -> None:
    before = live(lab)
    rc, out = deploy(lab, results, "--dry", "--diff", "--data",
                     f"profile={ep8_at(tmp_path, 0.83)}")
    assert rc == 0, out[-6000:]
    assert "calibrated by this host's start of" in out, out[-6000:]
    assert re.search(r"\(margin \+0\.\d\d \+- 1\.50 GiB\)", out), out[-6000:]
    assert "lab-gpu: preview: changes (nothing on the host was changed)" in out
    assert live(lab) == before
