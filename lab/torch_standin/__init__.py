"""The torch stand-in: standard-library wheels of SGLang's CUDA stack for the lab (not
PyTorch, not CUDA, not sgl-kernel).

Why: the serve deploy installs SGLang from a hash-pinned lock (sglang, the torch it pins
and their CUDA wheels) and then imports sglang and torch as the service user to check
that torch sees the GPUs with the lock's CUDA. The lab VM has no GPU and no room for
4 GiB of wheels, so the mirror carries stand-ins (versions.yaml, all ``+lab``):

- ``torch``: ``torch.version.cuda``, ``torch.cuda.is_available()``, ``device_count()``,
  ``get_device_capability(i)``, ``get_device_name(i)``, answered from the lab box's
  stand-in ``nvidia-smi``: no CUDA when the box's driver is older than the build's CUDA
  needs, or when the fault switch /etc/gpuserve-lab/torch-no-cuda exists on the guest;
- ``nvidia-cuda-runtime``: metadata and a marker file only (torch requires it; lock
  tools check that torch's CUDA runtime wheels match its CUDA);
- ``sglang-kernel``: a platform wheel whose ``sgl_kernel/common_ops.abi3.so`` is an ELF
  file listing cubins for the real release's SM architectures (fatbin.py), where lock
  tools read ``cuda_archs`` from. Nothing imports it.

``publish(mirror_root)`` writes the wheels to ``mirror_root/"wheels"`` (pip find-links),
byte-identical for identical inputs (lab/wheelfile.py), and skips unchanged ones.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import yaml

from lab import wheelfile
from lab.torch_standin.fatbin import elf_with_fatbin

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
VERSIONS_FILE = HERE / "versions.yaml"
LOCAL = "lab"
RUNTIME = "nvidia-cuda-runtime"
KERNEL = "sglang-kernel"
# The real sglang-kernel wheels are CPython-3.10+ stable-ABI manylinux wheels; the
# manylinux tag also gives the lab lock a glibc floor to check, as real locks have.
KERNEL_TAG = "cp310-abi3-manylinux_2_28_x86_64"


class VersionsError(ValueError):
    pass


def _base(version: str) -> str:
    return version.split("+", 1)[0]


def _lab(version: str) -> str:
    return f"{version}+{LOCAL}"


@cache
def _versions() -> dict:
    data = yaml.safe_load(VERSIONS_FILE.read_text())
    for key in ("sglang", "torch", "kernel", "driver_min"):
        if not isinstance(data.get(key), dict):
            raise VersionsError(f"{VERSIONS_FILE}: {key}: a mapping is required")
    for version, info in data["torch"].items():
        for field in ("cuda", "cuda_runtime", "archs"):
            if not info.get(field):
                raise VersionsError(f"{VERSIONS_FILE}: torch.{version}.{field}: required")
        if info["cuda"] not in data["driver_min"]:
            raise VersionsError(f"{VERSIONS_FILE}: torch.{version}.cuda: {info['cuda']!r} "
                                "has no driver_min row")
    for version, info in data["kernel"].items():
        if not info.get("sass"):
            raise VersionsError(f"{VERSIONS_FILE}: kernel.{version}.sass: required")
    for sglang, info in data["sglang"].items():
        for field, table in (("torch", "torch"), ("kernel", "kernel")):
            if (info or {}).get(field) not in data[table]:
                raise VersionsError(f"{VERSIONS_FILE}: sglang.{sglang}.{field}: "
                                    f"{(info or {}).get(field)!r} is not under {table}:")
    return data


def _sglang_row(sglang_version: str) -> dict:
    base = _base(sglang_version)
    rows = _versions()["sglang"]
    if base not in rows:
        raise VersionsError(
            f"{VERSIONS_FILE}: sglang: no torch for SGLang {base}; add a row "
            f"'\"{base}\": {{torch: <its torch pin>, kernel: <its sglang-kernel pin>}}'")
    return rows[base]


def covered_sglang_versions() -> set[str]:
    """The SGLang releases the lab has a torch and kernel stand-in for."""
    return set(_versions()["sglang"])


def torch_for_sglang(sglang_version: str) -> str:
    """``0.5.23`` or ``0.5.23+lab`` -> ``2.14.1+lab``: the torch that SGLang stand-in pins."""
    return _lab(_sglang_row(sglang_version)["torch"])


def kernel_for_sglang(sglang_version: str) -> str:
    """``0.5.23+lab`` -> ``0.4.10+lab``: the sglang-kernel that SGLang stand-in pins."""
    return _lab(_sglang_row(sglang_version)["kernel"])


def standin_versions() -> list[str]:
    """``2.13.0+lab``, ``2.14.1+lab``: every torch build in versions.yaml."""
    return [_lab(v) for v in sorted(_versions()["torch"])]


def _torch_row(version: str) -> dict:
    return _versions()["torch"][_base(version)]


def cuda_of(version: str) -> str:
    return str(_torch_row(version)["cuda"])


def driver_min(cuda: str) -> str:
    return str(_versions()["driver_min"][cuda])


def wheel_name(version: str) -> str:
    return wheelfile.wheel_name("torch", version)


# -- torch ------------------------------------------------------------------------


def _version_py(version: str) -> bytes:
    """torch/version.py in the form real torch wheels carry (2.11: with ``rocm``)."""
    return (
        "from typing import Optional\n"
        "\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']\n"
        f"__version__ = '{version}'\n"
        "debug = False\n"
        f"cuda: Optional[str] = '{cuda_of(version)}'\n"
        "git_version = 'gpuserve-lab-standin'\n"
        "hip: Optional[str] = None\n"
        "rocm: Optional[str] = None\n"
        "xpu: Optional[str] = None\n"
    ).encode()


def _build_py(version: str) -> bytes:
    archs = tuple(str(a) for a in _torch_row(version)["archs"])
    return (
        '"""Build constants of this torch STAND-IN wheel (written by lab/torch_standin)."""\n\n'
        f"CUDA = {cuda_of(version)!r}\n"
        f"DRIVER_MIN = {driver_min(cuda_of(version))!r}  # the oldest driver for this CUDA\n"
        f"ARCH_LIST = {archs!r}\n"
    ).encode()


def _torch_files(version: str) -> dict[str, bytes]:
    files = wheelfile.source_files(SRC, "torch")
    files["torch/version.py"] = _version_py(version)
    files["torch/_standin/build.py"] = _build_py(version)
    return dict(sorted(files.items()))


def _runtime_requirement(version: str) -> str:
    runtime = _lab(str(_torch_row(version)["cuda_runtime"]))
    return f'{RUNTIME}=={runtime}; platform_system == "Linux"'


def _torch_metadata(version: str) -> bytes:
    return wheelfile.metadata(
        "torch", version, license="BSD-3-Clause", requires=[_runtime_requirement(version)],
        summary="torch stand-in for the gpuserve lab (device queries from the lab box's "
                "nvidia-smi; not PyTorch)")


def build_wheel_bytes(version: str) -> bytes:
    """The torch wheel as bytes; identical inputs give identical bytes (fixed timestamps)."""
    return wheelfile.wheel_bytes("torch", version, _torch_files(version),
                                 _torch_metadata(version), top_level="torch",
                                 generator="gpuserve lab/torch_standin")


# -- nvidia-cuda-runtime and sglang-kernel -------------------------------------------


def _runtime_files(version: str) -> dict[str, bytes]:
    return {"nvidia/cu13/GPUSERVE-LAB-STANDIN.txt": (
        f"nvidia-cuda-runtime {version}: gpuserve lab stand-in, no libcudart inside.\n"
    ).encode()}


def _runtime_metadata(version: str) -> bytes:
    return wheelfile.metadata(RUNTIME, version, license="NVIDIA Proprietary Software",
                              summary="CUDA Runtime stand-in for the gpuserve lab (no "
                                      "libraries; not NVIDIA's wheel)", requires_python=">=3")


def runtime_versions() -> list[str]:
    return sorted({_lab(str(r["cuda_runtime"])) for r in _versions()["torch"].values()})


def kernel_versions() -> list[str]:
    return [_lab(v) for v in sorted(_versions()["kernel"])]


def _kernel_files(version: str) -> dict[str, bytes]:
    sass = [int(a) for a in _versions()["kernel"][_base(version)]["sass"]]
    return {
        "sgl_kernel/__init__.py": (
            '"""sgl_kernel STAND-IN (gpuserve lab): no kernels. Only lock tools read this\n'
            'wheel (the SM list in common_ops.abi3.so); nothing in the lab imports it."""\n\n'
            f'__version__ = "{version}"\n').encode(),
        "sgl_kernel/common_ops.abi3.so": elf_with_fatbin(sass),
    }


def _kernel_metadata(version: str) -> bytes:
    return wheelfile.metadata(KERNEL, version, license="Apache-2.0",
                              summary="sglang-kernel stand-in for the gpuserve lab (an ELF "
                                      "file listing SM architectures; no kernels)",
                              requires_python=">=3.10")


# -- building and publishing -----------------------------------------------------------


def _wheels() -> list[tuple[str, Callable[[], bytes], str]]:
    """(filename, build, inputs digest) of every wheel this module publishes."""
    me = Path(__file__).read_bytes() + (HERE / "fatbin.py").read_bytes()
    out = []
    for v in standin_versions():
        out.append((wheel_name(v), lambda v=v: build_wheel_bytes(v),
                    wheelfile.inputs_digest(v, me, _torch_metadata(v), files=_torch_files(v))))
    for v in runtime_versions():
        out.append((wheelfile.wheel_name(RUNTIME, v),
                    lambda v=v: wheelfile.wheel_bytes(RUNTIME, v, _runtime_files(v),
                                                      _runtime_metadata(v), top_level="nvidia"),
                    wheelfile.inputs_digest(v, me, _runtime_metadata(v),
                                            files=_runtime_files(v))))
    for v in kernel_versions():
        out.append((wheelfile.wheel_name(KERNEL, v, KERNEL_TAG),
                    lambda v=v: wheelfile.wheel_bytes(KERNEL, v, _kernel_files(v),
                                                      _kernel_metadata(v), top_level="sgl_kernel",
                                                      tag=KERNEL_TAG),
                    wheelfile.inputs_digest(v, me, _kernel_metadata(v), files=_kernel_files(v))))
    return out


def wheel_names() -> list[str]:
    return [name for name, _, _ in _wheels()]


def build_wheel(version: str, out_dir: Path) -> Path:
    """Write the torch wheel for ``version`` into ``out_dir`` unless it is up to date."""
    name = wheel_name(version)
    for filename, build, digest in _wheels():
        if filename == name:
            return wheelfile.build_wheel(out_dir, filename, digest, build)
    raise VersionsError(f"{VERSIONS_FILE}: torch: no build {version}")


def publish(mirror_root: Path) -> None:
    """Put the stand-in wheels into ``mirror_root/wheels`` (pip --find-links)."""
    out = Path(mirror_root) / "wheels"
    for filename, build, digest in _wheels():
        wheelfile.build_wheel(out, filename, digest, build)
