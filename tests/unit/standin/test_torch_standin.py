"""The lab's torch stand-in: a real wheel, deterministic, answering from the lab box.

The module tests unpack the wheel and run it in a subprocess with the lab's own
stand-in nvidia-smi (lab/nvidia_repo/files/nvidia-smi reading the committed boxes) or a
small fake one first on PATH; the guest paths (/etc/gpuserve-lab/...) are rewritten to
temporary files, as test_host_lab_repo does for nvidia-smi.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lab import sglang_standin, torch_standin, wheelfile

REPO = Path(__file__).resolve().parents[3]
NVIDIA_REPO = REPO / "lab" / "nvidia_repo"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    mirror = tmp_path_factory.mktemp("mirror")
    torch_standin.publish(mirror)
    sglang_standin.publish(mirror)
    return mirror / "wheels"


def _unpack(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)


@pytest.fixture
def guest(wheels, tmp_path):
    """A site dir with torch 2.14.1+lab and sglang 0.5.23+lab, and the guest's paths."""
    site = tmp_path / "site"
    for name in (torch_standin.wheel_name("2.14.1+lab"),
                 sglang_standin.wheel_name("0.5.23+lab")):
        _unpack(wheels / name, site)
    standin = site / "torch" / "_standin" / "__init__.py"
    fault = tmp_path / "torch-no-cuda"
    standin.write_text(standin.read_text().replace("/etc/gpuserve-lab/torch-no-cuda",
                                                   str(fault)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return {"site": site, "fault": fault, "bin": bin_dir, "box": tmp_path / "box"}


def _lab_smi(guest, box: str, driver: str = "580.126.20") -> None:
    """Install the lab's stand-in nvidia-smi (recorded box ``box``) as ``nvidia-smi``."""
    script = (NVIDIA_REPO / "files" / "nvidia-smi").read_text()
    script = script.replace("@DRIVER_VERSION@", driver)
    script = script.replace("/usr/share/gpuserve-lab/boxes", str(NVIDIA_REPO / "boxes"))
    script = script.replace("/etc/gpuserve-lab/box", str(guest["box"]))
    script = script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1)
    guest["box"].write_text(box + "\n")
    smi = guest["bin"] / "nvidia-smi"
    smi.write_text(script)
    smi.chmod(0o755)


def _fake_smi(guest, stdout: str, rc: int = 0) -> None:
    smi = guest["bin"] / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{stdout}'\nexit {rc}\n")
    smi.chmod(0o755)


PROBE = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    out = {"version": torch.__version__, "cuda": torch.version.cuda,
           "available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
           "archs": torch.cuda.get_arch_list()}
    out["devices"] = [[torch.cuda.get_device_name(i), list(torch.cuda.get_device_capability(i))]
                      for i in range(out["count"])]
    try:
        torch.cuda.get_device_capability(out["count"])
    except Exception as exc:
        out["beyond"] = type(exc).__name__ + ": " + str(exc)
out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""


def _run(guest, code: str = PROBE, env: dict | None = None, path: str | None = None):
    full = {"PYTHONPATH": str(guest["site"]),
            "PATH": path if path is not None else f"{guest['bin']}:/usr/bin:/bin"}
    full.update(env or {})
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the wheels -------------------------------------------------------------------


def test_publish_writes_the_torch_builds(wheels):
    names = sorted(p.name for p in wheels.glob("torch-*.whl"))
    assert names == ["torch-2.13.0+lab-py3-none-any.whl", "torch-2.14.1+lab-py3-none-any.whl"]


@pytest.mark.parametrize("version", ["2.14.1+lab", "2.13.0+lab"])
def test_torch_wheel_metadata_record_and_version_py(wheels, version):
    with zipfile.ZipFile(wheels / torch_standin.wheel_name(version)) as zf:
        dist = f"torch-{version}.dist-info"
        meta = zf.read(f"{dist}/METADATA").decode()
        assert "Name: torch\n" in meta and f"Version: {version}\n" in meta
        assert "stand-in" in meta and "not PyTorch" in meta
        assert "Requires-Dist" not in meta
        assert "Tag: py3-none-any" in zf.read(f"{dist}/WHEEL").decode()
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist}/RECORD").decode())))
        assert {r[0] for r in rows} == set(zf.namelist())
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + want.decode() and int(size) == len(data)
        version_py = zf.read("torch/version.py").decode()
        assert "STAND-IN" in zf.read("torch/__init__.py").decode()
    # The form real wheels carry, which lock tools read without importing torch.
    assert "cuda: Optional[str] = '13.0'\n" in version_py
    assert f"__version__ = '{version}'\n" in version_py
    assert version_py.startswith("from typing import Optional\n")


def test_wheels_are_deterministic_and_rebuilt_only_when_inputs_change(tmp_path):
    first = torch_standin.build_wheel_bytes("2.14.1+lab")
    assert torch_standin.build_wheel_bytes("2.14.1+lab") == first
    # Another process (another import, another clock) builds the same bytes.
    code = ("import hashlib, sys; from lab import torch_standin, sglang_standin; "
            "print(hashlib.sha256(torch_standin.build_wheel_bytes('2.14.1+lab')).hexdigest(),"
            " hashlib.sha256(sglang_standin.build_wheel_bytes('0.5.23+lab')).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.split() == [hashlib.sha256(first).hexdigest(), hashlib.sha256(
        sglang_standin.build_wheel_bytes("0.5.23+lab")).hexdigest()]
    assert torch_standin.build_wheel_bytes("2.13.0+lab") != first

    torch_standin.publish(tmp_path)
    wheel = tmp_path / "wheels" / torch_standin.wheel_name("2.14.1+lab")
    assert wheel.read_bytes() == first
    mtime = wheel.stat().st_mtime_ns
    torch_standin.publish(tmp_path)
    assert wheel.stat().st_mtime_ns == mtime  # unchanged inputs: not rewritten
    (tmp_path / "wheels" / f".{wheel.name}.inputs").write_text("stale\n")
    torch_standin.publish(tmp_path)
    assert wheel.stat().st_mtime_ns != mtime and wheel.read_bytes() == first


def test_wheel_members_have_fixed_timestamps_and_modes(wheels):
    with zipfile.ZipFile(wheels / torch_standin.wheel_name("2.14.1+lab")) as zf:
        assert {i.date_time for i in zf.infolist()} == {wheelfile.EPOCH}
        assert {i.external_attr >> 16 for i in zf.infolist()} == {0o644}


@pytest.mark.parametrize(("sglang", "torch"), [("0.5.23+lab", "2.14.1+lab"),
                                               ("0.5.19+lab", "2.13.0+lab")])
def test_sglang_standin_pins_its_torch(wheels, sglang, torch):
    with zipfile.ZipFile(wheels / sglang_standin.wheel_name(sglang)) as zf:
        meta = zf.read(f"sglang-{sglang}.dist-info/METADATA").decode()
    assert [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")] == [
        f"Requires-Dist: torch=={torch}"]
    assert torch_standin.torch_for_sglang(sglang) == torch


def test_every_sglang_standin_has_a_torch_pin():
    for version in sglang_standin.standin_versions():
        assert torch_standin.torch_for_sglang(version) in torch_standin.standin_versions()


def test_unknown_sglang_version_names_the_versions_file():
    with pytest.raises(torch_standin.VersionsError, match=r"versions\.yaml: sglang: no torch"):
        torch_standin.torch_for_sglang("0.4.0")


def test_pip_resolves_sglang_with_its_torch_from_the_mirror_wheels(wheels, tmp_path):
    """What a lock generator and the deploy do: resolve from find-links, offline."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--no-index", "--find-links", str(wheels), "--only-binary=:all:",
         "--report", str(report), "--quiet", "sglang==0.5.23+lab"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull})
    assert out.returncode == 0, out.stderr
    got = {i["metadata"]["name"]: i["metadata"]["version"]
           for i in json.loads(report.read_text())["install"]}
    assert got == {"sglang": "0.5.23+lab", "torch": "2.14.1+lab"}


# -- the module, on the lab boxes ---------------------------------------------------


def test_reference_box_eight_blackwell_gpus(guest):
    _lab_smi(guest, "rtxpro6000-kvm")
    out = _run(guest)
    assert out["version"] == "2.14.1+lab" and out["cuda"] == "13.0"
    assert out["available"] is True and out["count"] == 8
    assert out["devices"] == [[RTX, [12, 0]]] * 8
    assert "sm_120" in out["archs"]
    assert out["beyond"] == "AssertionError: Invalid device id"
    assert out["warnings"] == []


def test_h200_box_reports_hopper(guest):
    _lab_smi(guest, "h200-nvlink")
    out = _run(guest)
    assert out["count"] == 8
    assert {tuple(cap) for _, cap in out["devices"]} == {(9, 0)}
    assert all(name.startswith("NVIDIA H200") for name, _ in out["devices"])


def test_driver_575_box_is_too_old_for_cuda_13(guest):
    _lab_smi(guest, "rtxpro6000-kvm-driver575")
    smi = subprocess.run([str(guest["bin"] / "nvidia-smi"), "--query-gpu=driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True)
    assert set(smi.stdout.split()) == {"575.57.08"}
    out = _run(guest)
    assert out["available"] is False and out["count"] == 0 and out["devices"] == []
    assert out["archs"] == []
    assert "driver on your system is too old" in out["beyond"]
    assert len(out["warnings"]) == 1
    assert "too old (found version 575.57.08; this build needs >= 580.65.06)" in \
        out["warnings"][0]


def test_fault_switch_file_turns_cuda_off(guest):
    _lab_smi(guest, "rtxpro6000-kvm")
    guest["fault"].write_text("")
    out = _run(guest)
    assert out["available"] is False and out["count"] == 0
    assert "CUDA unknown error" in out["warnings"][0]
    assert out["beyond"].startswith("RuntimeError: CUDA unknown error")


def test_no_nvidia_smi_means_no_driver(guest):
    out = _run(guest, path=f"{guest['bin']}")  # empty bin: no nvidia-smi at all
    assert out["available"] is False and out["count"] == 0 and out["warnings"] == []
    assert "Found no NVIDIA driver" in out["beyond"]
    assert out["cuda"] == "13.0"  # a CUDA build still says which CUDA it was built for


@pytest.mark.parametrize(("stdout", "rc"), [("", 6), ("No devices were found\\n", 6),
                                            ("garbage\\n", 0)])
def test_failing_or_empty_nvidia_smi_means_no_cuda(guest, stdout, rc):
    _fake_smi(guest, stdout, rc)
    out = _run(guest)
    assert out["available"] is False and out["count"] == 0


def test_cuda_visible_devices_filters_like_cuda(guest):
    _fake_smi(guest, "NVIDIA H200, 9.0, 580.126.20\\nNVIDIA B200, 10.0, 580.126.20\\n")
    out = _run(guest, env={"CUDA_VISIBLE_DEVICES": "1,0"})
    assert out["devices"] == [["NVIDIA B200", [10, 0]], ["NVIDIA H200", [9, 0]]]
    out = _run(guest, env={"CUDA_VISIBLE_DEVICES": ""})
    assert out["available"] is False and out["count"] == 0
    assert out["beyond"] == "RuntimeError: No CUDA GPUs are available"


def test_verification_script_reads_the_standins(guest):
    """gpuserve's own verification script, run against the stand-ins on the lab box."""
    script = REPO / "gpuserve" / "data" / "scripts" / "sglang_verify.py"
    if not script.exists():
        pytest.skip("gpuserve/data/scripts/sglang_verify.py is not there")
    _lab_smi(guest, "rtxpro6000-kvm")
    out = _run(guest, code=script.read_text())
    assert out["error"] is None
    assert (out["sglang"], out["torch"], out["torch_cuda"]) == ("0.5.23+lab", "2.14.1+lab",
                                                               "13.0")
    assert out["cuda_available"] is True and len(out["devices"]) == 8
    _lab_smi(guest, "rtxpro6000-kvm-driver575")
    out = _run(guest, code=script.read_text())
    assert out["error"] is None and out["cuda_available"] is False and out["devices"] == []
