"""The lab's torch stand-in: a real wheel, deterministic, answering from the lab box.

The module tests unpack the wheels and run them in a subprocess with the lab's own
stand-in nvidia-smi (lab/nvidia_repo/files/nvidia-smi reading the committed boxes) or a
small fake one first on PATH; the guest paths (/etc/gpuserve-lab/...) are rewritten to
temporary files, as test_host_lab_repo does for nvidia-smi (conftest.py: ``guest``).
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
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.fixture(scope="module")
def wheels(standin_mirror) -> Path:
    return standin_mirror / "wheels"


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


# -- the wheels -------------------------------------------------------------------


def test_publish_writes_the_stack(wheels):
    from lab import locks

    hub_client = {w.name for w, _ in locks.hub_client_wheels()}  # real PyPI wheels
    names = sorted(p.name for p in wheels.glob("*.whl") if p.name not in hub_client)
    assert names == [
        "mooncake_transfer_engine-0.3.11.post1+lab-py3-none-any.whl",
        "nvidia_cuda_runtime-13.0.96+lab-py3-none-any.whl",
        "sglang-0.5.19+lab-py3-none-any.whl",
        "sglang-0.5.23+lab-py3-none-any.whl",
        "sglang_kernel-0.4.10+lab-cp310-abi3-manylinux_2_28_x86_64.whl",
        "sglang_kernel-0.4.6.post1+lab-cp310-abi3-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+lab-py3-none-any.whl",
        "torch-2.14.1+lab-py3-none-any.whl",
    ]


def _check_record(zf: zipfile.ZipFile, dist: str) -> None:
    rows = list(csv.reader(io.StringIO(zf.read(f"{dist}/RECORD").decode())))
    assert {r[0] for r in rows} == set(zf.namelist())
    for name, digest, size in rows:
        if name.endswith("RECORD"):
            continue
        data = zf.read(name)
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        assert digest == "sha256=" + want.decode() and int(size) == len(data)


@pytest.mark.parametrize("version", ["2.14.1+lab", "2.13.0+lab"])
def test_torch_wheel_metadata_record_and_version_py(wheels, version):
    with zipfile.ZipFile(wheels / torch_standin.wheel_name(version)) as zf:
        dist = f"torch-{version}.dist-info"
        meta = zf.read(f"{dist}/METADATA").decode()
        assert "Name: torch\n" in meta and f"Version: {version}\n" in meta
        assert "stand-in" in meta and "not PyTorch" in meta
        assert [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")] == [
            'Requires-Dist: nvidia-cuda-runtime==13.0.96+lab; platform_system == "Linux"']
        assert "Tag: py3-none-any" in zf.read(f"{dist}/WHEEL").decode()
        _check_record(zf, dist)
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
    for name in torch_standin.wheel_names():  # every wheel of the stack: same bytes again
        built = (tmp_path / "wheels" / name).read_bytes()
        (tmp_path / "wheels" / f".{name}.inputs").unlink()
        torch_standin.publish(tmp_path)
        assert (tmp_path / "wheels" / name).read_bytes() == built, name
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


@pytest.mark.parametrize(("sglang", "torch", "kernel"), [
    ("0.5.23+lab", "2.14.1+lab", "0.4.10+lab"), ("0.5.19+lab", "2.13.0+lab", "0.4.6.post1+lab")])
def test_sglang_standin_pins_its_torch_and_kernel(wheels, sglang, torch, kernel):
    with zipfile.ZipFile(wheels / sglang_standin.wheel_name(sglang)) as zf:
        meta = zf.read(f"sglang-{sglang}.dist-info/METADATA").decode()
    assert [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")] == [
        f"Requires-Dist: torch=={torch}", f"Requires-Dist: sglang-kernel=={kernel}",
        "Requires-Dist: huggingface_hub"]  # like the real wheel: the Hub client
    assert torch_standin.torch_for_sglang(sglang) == torch
    assert torch_standin.kernel_for_sglang(sglang) == kernel


def test_kernel_wheel_is_a_platform_wheel_whose_so_lists_the_sm_archs(wheels):
    name = "sglang_kernel-0.4.10+lab-cp310-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheels / name) as zf:
        dist = "sglang_kernel-0.4.10+lab.dist-info"
        wheel = zf.read(f"{dist}/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel
        assert "Tag: cp310-abi3-manylinux_2_28_x86_64" in wheel
        assert "Name: sglang-kernel\n" in zf.read(f"{dist}/METADATA").decode()
        _check_record(zf, dist)
        so = zf.read("sgl_kernel/common_ops.abi3.so")
    assert so[:5] == b"\x7fELF\x02"
    assert _fatbin_archs(so) == ({80, 89, 90, 100, 120}, set())


def _fatbin_archs(elf: bytes) -> tuple[set[int], set[int]]:
    """Read the .nv_fatbin entries the way cuobjdump lists them (independent reader)."""
    import struct

    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", elf, 0x3C)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + 64 * i) for i in range(shnum)]
    names = elf[heads[shstrndx][4]:heads[shstrndx][4] + heads[shstrndx][5]]
    sass, ptx = set(), set()
    for name, _t, _f, _a, off, _size in heads:
        if names[name:names.index(b"\0", name)] != b".nv_fatbin":
            continue
        magic, _v, hsize, payload = struct.unpack_from("<IHHQ", elf, off)
        assert magic == 0xBA55ED50
        pos, end = off + hsize, off + hsize + payload
        while pos < end:
            kind, _ev, ehsize, padded = struct.unpack_from("<HHIQ", elf, pos)
            arch, = struct.unpack_from("<I", elf, pos + 28)
            (sass if kind == 2 else ptx).add(arch)
            pos += ehsize + padded
    return sass, ptx


def test_runtime_wheel_carries_no_library(wheels):
    with zipfile.ZipFile(wheels / "nvidia_cuda_runtime-13.0.96+lab-py3-none-any.whl") as zf:
        assert not [n for n in zf.namelist() if ".so" in n]
        assert "stand-in" in zf.read(
            "nvidia_cuda_runtime-13.0.96+lab.dist-info/METADATA").decode()


def test_every_sglang_standin_has_a_torch_pin():
    for version in sglang_standin.standin_versions():
        assert torch_standin.torch_for_sglang(version) in torch_standin.standin_versions()


def test_driver_minimum_agrees_with_the_lock_tool():
    """The stand-in refuses CUDA below the same driver the locks require."""
    import importlib.util

    path = REPO / "tools" / "gen_lock.py"
    if not path.exists():
        pytest.skip("tools/gen_lock.py is not there")
    spec = importlib.util.spec_from_file_location("gen_lock_for_test", path)
    gen_lock = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen_lock  # its dataclasses look their module up
    try:
        spec.loader.exec_module(gen_lock)
    finally:
        del sys.modules[spec.name]
    for version in torch_standin.standin_versions():
        cuda = torch_standin.cuda_of(version)
        assert torch_standin.driver_min(cuda) == gen_lock.DRIVER_MIN[cuda][0]


def test_unknown_sglang_version_names_the_versions_file():
    with pytest.raises(torch_standin.VersionsError, match=r"versions\.yaml: sglang: no torch"):
        torch_standin.torch_for_sglang("0.4.0")


def test_pip_resolves_sglang_with_its_torch_from_the_mirror_wheels(wheels, tmp_path):
    """What a lock generator and the deploy do: resolve from find-links, offline."""
    report = tmp_path / "report.json"
    # The guest: CPython 3.11 on glibc 2.36 (pip takes each manylinux tag it may use).
    platforms = [a for m in range(36, 16, -1) for a in ("--platform", f"manylinux_2_{m}_x86_64")]
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--python-version", "3.11", *platforms,
         "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
         "--no-index", "--find-links", str(wheels), "--only-binary=:all:",
         "--report", str(report), "--quiet", "sglang==0.5.23+lab"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull})
    assert out.returncode == 0, out.stderr
    got = {i["metadata"]["name"]: i["metadata"]["version"]
           for i in json.loads(report.read_text())["install"]}
    hub = {k: got.pop(k) for k in list(got) if k not in (
        "sglang", "torch", "sglang-kernel", "nvidia-cuda-runtime")}
    assert got == {"sglang": "0.5.23+lab", "torch": "2.14.1+lab",
                   "sglang-kernel": "0.4.10+lab", "nvidia-cuda-runtime": "13.0.96+lab"}
    assert hub["huggingface_hub"] == "1.33.0" and "httpx" in hub  # the real client's closure


# -- the module, on the lab boxes ---------------------------------------------------


def test_reference_box_eight_blackwell_gpus(guest):
    guest.lab_smi("rtxpro6000-kvm")
    out = guest.run(PROBE)
    assert out["version"] == "2.14.1+lab" and out["cuda"] == "13.0"
    assert out["available"] is True and out["count"] == 8
    assert out["devices"] == [[RTX, [12, 0]]] * 8
    assert "sm_120" in out["archs"]
    assert out["beyond"] == "AssertionError: Invalid device id"
    assert out["warnings"] == []


def test_h200_box_reports_hopper(guest):
    guest.lab_smi("h200-nvlink")
    out = guest.run(PROBE)
    assert out["count"] == 8
    assert {tuple(cap) for _, cap in out["devices"]} == {(9, 0)}
    assert all(name.startswith("NVIDIA H200") for name, _ in out["devices"])


def test_driver_575_box_is_too_old_for_cuda_13(guest):
    guest.lab_smi("rtxpro6000-kvm-driver575")
    smi = subprocess.run([str(guest.bin / "nvidia-smi"), "--query-gpu=driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True)
    assert set(smi.stdout.split()) == {"575.57.08"}
    out = guest.run(PROBE)
    assert out["available"] is False and out["count"] == 0 and out["devices"] == []
    assert out["archs"] == []
    assert "driver on your system is too old" in out["beyond"]
    assert len(out["warnings"]) == 1
    assert "too old (found version 575.57.08; this build needs >= 580.65.06)" in \
        out["warnings"][0]


def test_fault_switch_file_turns_cuda_off(guest):
    guest.lab_smi("rtxpro6000-kvm")
    guest.fault.write_text("")
    out = guest.run(PROBE)
    assert out["available"] is False and out["count"] == 0
    assert "CUDA unknown error" in out["warnings"][0]
    assert out["beyond"].startswith("RuntimeError: CUDA unknown error")


def test_no_nvidia_smi_means_no_driver(guest):
    out = guest.run(PROBE, path=f"{guest.bin}")  # empty bin: no nvidia-smi at all
    assert out["available"] is False and out["count"] == 0 and out["warnings"] == []
    assert "Found no NVIDIA driver" in out["beyond"]
    assert out["cuda"] == "13.0"  # a CUDA build still says which CUDA it was built for


@pytest.mark.parametrize(("stdout", "rc"), [("", 6), ("No devices were found\\n", 6),
                                            ("garbage\\n", 0)])
def test_failing_or_empty_nvidia_smi_means_no_cuda(guest, stdout, rc):
    guest.fake_smi(stdout, rc)
    out = guest.run(PROBE)
    assert out["available"] is False and out["count"] == 0


def test_cuda_visible_devices_filters_like_cuda(guest):
    guest.fake_smi("NVIDIA H200, 9.0, 580.126.20\\nNVIDIA B200, 10.0, 580.126.20\\n")
    out = guest.run(PROBE, env={"CUDA_VISIBLE_DEVICES": "1,0"})
    assert out["devices"] == [["NVIDIA B200", [10, 0]], ["NVIDIA H200", [9, 0]]]
    out = guest.run(PROBE, env={"CUDA_VISIBLE_DEVICES": ""})
    assert out["available"] is False and out["count"] == 0
    assert out["beyond"] == "RuntimeError: No CUDA GPUs are available"


def test_verification_script_reads_the_standins(guest):
    """gpuserve's own verification script, run against the stand-ins on the lab box."""
    script = REPO / "gpuserve" / "data" / "scripts" / "sglang_verify.py"
    if not script.exists():
        pytest.skip("gpuserve/data/scripts/sglang_verify.py is not there")
    guest.lab_smi("rtxpro6000-kvm")
    out = guest.run(script.read_text())
    assert out["error"] is None
    assert (out["sglang"], out["torch"], out["torch_cuda"]) == ("0.5.23+lab", "2.14.1+lab",
                                                               "13.0")
    assert out["cuda_available"] is True and len(out["devices"]) == 8
    guest.lab_smi("rtxpro6000-kvm-driver575")
    out = guest.run(script.read_text())
    assert out["error"] is None and out["cuda_available"] is False and out["devices"] == []
