"""Profile switching with rollback on the lab host (deploy/serve.py, roles/service/rollback).

Runs after test_serve.py (same session `lab` fixture), whose last state is a healthy
glm5-nvfp4-tp8 deploy with secrets; the first step makes sure of that state (a rerun
that changes nothing there). Then a switch to a profile whose server dies at start must
fail loudly and leave the host serving glm5-nvfp4-tp8 again, and a plain rerun of the
good profile must report no changes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from labhelpers import served_profile

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FAILING = REPO / "tests/fixtures/profiles/lab-oom-at-start.yaml"
UNIT = "gpuserve-sglang.service"
# the same secrets as test_serve.py, so the good configuration is the one it left
HF_TOKEN = "hf_labTokenNeverOnArgv0123"
API_KEY = "sk-lab-key-never-on-argv-4567"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def serve(lab, group_data: Path, *args: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/serve.py", *args, "--group-data", str(group_data),
                        check=False)
    return r.returncode, ANSI.sub("", r.stdout)


def test_failing_profile_is_rolled_back_and_reported(lab, tmp_path) -> None:
    data = tmp_path / "group_data"
    data.mkdir()
    (data / "all.py").write_text(f"hf_token = {HF_TOKEN!r}\nsglang_api_key = {API_KEY!r}\n")
    rc, out = serve(lab, data)
    assert rc == 0, out[-6000:]

    rc, out = serve(lab, data, "--data", f"profile={FAILING}", "--data", "health_timeout=600")
    assert rc != 0, out[-6000:]
    assert re.search(r"health: (unit stopped|fatal error) during 'capturing CUDA graphs'"
                     r".*CUDA out of memory.*; profile lab-oom-at-start failed", out), out[-6000:]
    assert f"last journal lines of {UNIT}" in out
    assert ("the host was rolled back to profile glm5-nvfp4-tp8, which is healthy again"
            in out), out[-6000:]
    assert HF_TOKEN not in out and API_KEY not in out

    assert served_profile(lab) == "glm5-nvfp4-tp8"
    env = lab.ssh("cat /etc/gpuserve/sglang.env", check=True).stdout
    assert "GPUSERVE_LAB_STANDIN_FAIL" not in env and f"HF_TOKEN={HF_TOKEN}" in env
    assert lab.ssh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    health = lab.ssh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health")
    assert health.stdout.strip() == "200"
    modes = lab.ssh("stat -c '%n %a %U' /etc/gpuserve/last-good /etc/gpuserve/last-good/*",
                    check=True).stdout
    assert "/etc/gpuserve/last-good 700 root" in modes
    assert "/etc/gpuserve/last-good/env 600 root" in modes
    assert "/etc/gpuserve/last-good/config 600 sglang" in modes

    rc, out = serve(lab, data)
    assert rc == 0, out[-6000:]
    assert not re.search(r"^\s*\[lab-gpu\]\s+Success\s*$", out, re.M), out[-6000:]
    total = [line for line in out.splitlines() if line.strip().startswith("Grand total")]
    assert total and total[-1].split()[3] == "-", total  # Hosts, Success(-), Error, ...
    assert "lab-gpu: smoke: " in out
