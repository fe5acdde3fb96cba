"""The measuring stage of deploy/host.py (roles/gpu_gates) on the lab host.

On the container lab host: its stand-ins need no kernel, and a container host measures
as any host does (test_container_host.py provisioned it just before).

The lab's nccl-tests and cuda-samples are stand-in source archives on the mirror
(lab/gate_tools) whose builds print recorded, composed outputs of the lab's boxes. One
module-scoped sequence: the reference box (a KVM guest without P2P) measures P2P off
only and records it -> the bare-metal box measures P2P on and off and keeps P2P on
(with an EP profile in host data: all-gather and all-to-all too) ->
a P2P transport that hangs is killed at its timeout and leaves P2P off -> the rerun
measures nothing and reports no changes -> a slow run fails the host and
``pytest tests/host --inventory inventory/lab.py`` with the numbers, and passes again
once the box is back to its recorded speed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.host import nccl_env

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_HEADERS = ("--data", "nvidia_install_headers=False")  # as in test_host_deploy.py
REMEASURE = ("--data", "gates_remeasure=True")


def host_deploy(lab, *extra: str, check: bool = True) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/host.py", *NO_HEADERS, *extra, check=check)
    return r.returncode, ANSI.sub("", r.stdout)


def records(lab) -> list[Path]:
    return sorted((lab.results_dir / "lab-gpu").glob("*-measure-gates.json"))


def host_file(lab, path: str) -> str:
    return lab.ssh(f"cat {path}").stdout


@pytest.fixture(scope="module", autouse=True)
def reference_box(lab):
    # (a fresh guest has no /etc/gpuserve-lab until the driver role installs the boxes)
    reset = ("if [ -d /etc/gpuserve-lab ]; then rm -f /etc/gpuserve-lab/gates-hang "
             "/etc/gpuserve-lab/gates-slow; echo rtxpro6000-kvm > /etc/gpuserve-lab/box; fi")
    lab.ssh(reset, check=True)
    yield
    lab.ssh(reset)


def test_measuring_stage_records_results_and_picks_the_nccl_env(lab):
    before = records(lab)
    rc, out = host_deploy(lab, *REMEASURE)
    assert rc == 0, out[-4000:]
    assert "gates: measuring 2 runs on 8 GPUs (driver P2P verdict none" in out
    assert "gates: NCCL env chosen from measurement: driver P2P verdict is none" in out
    new = [p for p in records(lab) if p not in before]
    assert len(new) == 1, out[-3000:]
    doc = json.loads(new[0].read_text())
    assert doc["schema"] == "gpuserve.measure/1" and doc["host"] == "lab-gpu"
    assert doc["topology_class"] == "pcie-no-p2p"
    assert [r["label"] for r in doc["runs"]] == ["p2p_off", "matrix"]
    assert doc["figures"]["all_reduce_busbw@2147483648"] == 25.81
    assert doc["tools"]["nccl-tests"]["sha256"], "the lab pins its archive by sha256"
    measured = json.loads(host_file(lab, "/etc/gpuserve/measured.json"))
    assert measured["choice"]["p2p"] is False and measured["ready"] is True
    env = nccl_env.parse_env_file(host_file(lab, nccl_env.NCCL_ENV_PATH))
    assert env == {"NCCL_P2P_DISABLE": "1"}
    host_json = json.loads(host_file(lab, nccl_env.HOST_JSON_PATH))
    assert host_json["p2p"] == "none" and host_json["disable_custom_all_reduce"] is True
    assert host_json["measured_nccl"]["env"] == {"NCCL_P2P_DISABLE": "1"}
    tools = doc["tools"]
    dirs = (f"/opt/gpuserve/gates/nccl-tests-2.19.6-{tools['nccl-tests']['sha256'][:12]}-system",
            f"/opt/gpuserve/gates/cuda-samples-13.0-{tools['cuda-samples']['sha256'][:12]}")
    built = lab.ssh(f"cd / && stat -c '%U %a %n' {dirs[0]}/bin/* {dirs[1]}/bin/*").stdout
    assert sorted(line.split()[2].rsplit("/", 1)[1] for line in built.splitlines()
                  if line.startswith("root 755 ")) == [
        "all_gather_perf", "all_reduce_perf", "alltoall_perf", "p2pBandwidthLatencyTest"], built


def test_bare_metal_measured_faster_with_p2p_keeps_p2p_on(lab):
    lab.ssh("echo rtxpro6000-baremetal > /etc/gpuserve-lab/box", check=True)
    before = records(lab)
    # the driver's verdict changed: the stage measures again; an EP profile in host data
    # adds all-gather and all-to-all, each with P2P on and off
    rc, out = host_deploy(lab, "--data", "profile=glm5-nvfp4-tp8-ep8")
    assert rc == 0, out[-4000:]
    assert "gates: measuring 7 runs" in out
    assert "P2P on is faster (38.37 vs 25.81 GB/s at 2147483648 B" in out
    new = [p for p in records(lab) if p not in before]
    assert len(new) == 1, out[-3000:]
    figures = json.loads(new[0].read_text())["figures"]
    assert figures["all_gather_busbw@2147483648"] == 37.3
    assert figures["alltoall_busbw@2147483648"] == 28.8
    env = nccl_env.parse_env_file(host_file(lab, nccl_env.NCCL_ENV_PATH))
    assert "NCCL_P2P_DISABLE" not in env
    host_json = json.loads(host_file(lab, nccl_env.HOST_JSON_PATH))
    assert host_json["disable_custom_all_reduce"] is False
    assert host_json["measured_nccl"]["p2p"] is True


def test_a_p2p_hang_is_reported_with_its_timeout_and_leaves_p2p_off(lab):
    lab.ssh("echo 'all_reduce_perf p2p' > /etc/gpuserve-lab/gates-hang", check=True)
    rc, out = host_deploy(lab, *REMEASURE)
    assert rc == 0, out[-4000:]
    assert "gates: all_reduce_perf (NCCL defaults) hung: killed after 15 s" in out
    assert "P2P on hung (all_reduce_perf, killed after 15 s)" in out
    env = nccl_env.parse_env_file(host_file(lab, nccl_env.NCCL_ENV_PATH))
    assert env == {"NCCL_P2P_DISABLE": "1"}
    assert json.loads(host_file(lab, nccl_env.HOST_JSON_PATH))[
        "disable_custom_all_reduce"] is True
    doc = json.loads(records(lab)[-1].read_text())
    assert doc["runs"][0]["hang"] == {"timeout_s": 15}


def test_rerun_measures_nothing_and_reports_no_changes(lab):
    rc, out = host_deploy(lab)
    assert rc == 0, out[-4000:]
    assert "gates: the last measurement still holds" in out
    assert "[lab-gpu] No changes" in out and not re.search(r"\[lab-gpu\] (Success|Error)", out)


def run_tests_host(lab, *args: str) -> subprocess.CompletedProcess:
    """``pytest tests/host --inventory inventory/lab.py`` against this lab instance."""
    return subprocess.run([sys.executable, "-m", "pytest", "tests/host", "--inventory",
                           "inventory/lab.py", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=900)


def test_a_run_below_expectation_fails_the_host_and_tests_host_with_the_numbers(lab):
    lab.ssh("rm -f /etc/gpuserve-lab/gates-hang; echo 4 > /etc/gpuserve-lab/gates-slow",
            check=True)
    rc, out = host_deploy(lab, *REMEASURE, check=False)
    assert rc != 0
    assert "gates: lab-gpu is not ready (measured vs expected):" in out
    assert "all_reduce_busbw@2147483648: 9.59 GB/s is below the floor 10 GB/s" in out
    r = run_tests_host(lab, "-k", "gates")
    text = r.stdout + r.stderr
    assert r.returncode == 1, text[-3000:]
    assert "below expectation" in text and "9.59 GB/s" in text
    lab.ssh("rm -f /etc/gpuserve-lab/gates-slow", check=True)
    rc, out = host_deploy(lab, *REMEASURE)
    assert rc == 0, out[-4000:]
    r = run_tests_host(lab)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
