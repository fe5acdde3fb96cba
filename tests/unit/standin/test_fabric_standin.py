"""The lab's NVSwitch box (hgx-h100): the nvidia-smi stand-in reports the fabric In
Progress until the Fabric Manager stand-in runs at the driver's exact version, and the
torch stand-in then refuses CUDA with error 802, as real CUDA does (shared reference
hosts.md §1.6); the FM stand-in refuses another driver version and a box without
NVSwitches with the real daemon's messages."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.host import fabric
from gpuserve.parsers import nvidia_smi

REPO = Path(__file__).resolve().parents[3]
NVIDIA_REPO = REPO / "lab" / "nvidia_repo"
DRIVER = "580.126.20"
PROBE = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    out = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count()}
out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""


def _place(guest, tmp_path: Path) -> dict[str, Path]:
    """The stand-in nvidia-smi and nv-fabricmanager with guest paths under tmp_path."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    proc = tmp_path / "proc-version"
    proc.write_text(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  "
                    "Release Build  (lab)\n")

    def fix(text: str) -> str:
        text = re.sub(r"(/var)?/run/nvidia-fabricmanager", f"{run}/nvidia-fabricmanager", text)
        return (text.replace("@DRIVER_VERSION@", DRIVER)
                .replace("/usr/share/gpuserve-lab/boxes", str(NVIDIA_REPO / "boxes"))
                .replace("/etc/gpuserve-lab/box", str(guest.box))
                .replace("/proc/driver/nvidia/version", str(proc)))

    smi = guest.bin / "nvidia-smi"
    smi.write_text(fix((NVIDIA_REPO / "files" / "nvidia-smi").read_text())
                   .replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
    smi.chmod(0o755)
    fm = tmp_path / "nv-fabricmanager"
    fm.write_text(fix((NVIDIA_REPO / "files" / "nv-fabricmanager").read_text()))
    fm.chmod(0o755)
    return {"smi": smi, "fm": fm, "run": run, "proc": proc}


def _smi_q(paths) -> list[nvidia_smi.FabricInfo]:
    out = subprocess.run([str(paths["smi"]), "-q"], capture_output=True, text=True, check=True)
    return nvidia_smi.parse_fabric(out.stdout)


@pytest.fixture
def hgx(guest, tmp_path):
    guest.box.write_text("hgx-h100\n")
    paths = _place(guest, tmp_path)
    yield paths
    pid_file = paths["run"] / "nvidia-fabricmanager" / "nv-fabricmanager.pid"
    if pid_file.exists():
        os.kill(int(pid_file.read_text()), signal.SIGTERM)


def _start(paths) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{paths['smi'].parent}:/usr/bin:/bin"}
    return subprocess.run([str(paths["fm"]), "-c", "cfg"], capture_output=True, text=True,
                          env=env, timeout=30)


def test_without_fabric_manager_cuda_fails_with_802(guest, hgx):
    assert fabric.judge(_smi_q(hgx)).state == "pending"
    out = guest.run(PROBE)
    assert out["available"] is False and out["count"] == 0
    assert any("Error 802: system not yet initialized" in w for w in out["warnings"])


def test_fabric_manager_at_the_drivers_version_registers_the_fabric(guest, hgx):
    started = _start(hgx)
    assert started.returncode == 0, started.stderr
    blocks = _smi_q(hgx)
    assert len(blocks) == 8 and fabric.judge(blocks).state == "ready"
    assert blocks[0]["cluster_uuid"] == "00000000-0000-0000-0000-000000000000"
    out = guest.run(PROBE)
    assert out["available"] is True and out["count"] == 8


def test_fabric_manager_refuses_another_driver_and_a_box_without_nvswitch(guest, hgx):
    hgx["proc"].write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                           "590.48.01  Release Build  (lab)\n")
    refused = _start(hgx)
    assert refused.returncode == 1
    assert (f"fabric manager NVIDIA GPU driver interface version {DRIVER} doesn't match with "
            "driver version 590.48.01") in refused.stderr
    hgx["proc"].write_text(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                           f"{DRIVER}  Release Build  (lab)\n")
    guest.box.write_text("rtxpro6000-kvm\n")
    pcie = _start(hgx)
    assert pcie.returncode == 1 and "[NV_WARN_NOTHING_TO_DO]" in pcie.stderr
    fields = subprocess.run([str(hgx["smi"]), "--query-gpu=fabric.state,fabric.status",
                             "--format=csv,noheader"], capture_output=True, text=True)
    assert set(fields.stdout.split("\n")) - {""} == {"N/A, N/A"}
    assert json.loads(json.dumps(fabric.judge([]).state)) == "ready"
