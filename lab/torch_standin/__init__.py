"""The torch stand-in: a standard-library ``torch`` wheel for the lab host (not PyTorch).

Why: the serve deploy installs SGLang from a hash-pinned lock (sglang and the torch it
pins) and then imports both as the service user to check that torch sees the GPUs
with the lock's CUDA. The lab VM has no GPU and no room for a 1 GiB torch, so the
mirror carries this stand-in: distribution ``torch``, versions ``<X>+lab`` (versions.yaml),
whose ``torch.version.cuda``, ``torch.cuda.is_available()``, ``device_count()``,
``get_device_capability(i)`` and ``get_device_name(i)`` answer from the lab box's
stand-in ``nvidia-smi``: no CUDA when the box's driver is older than the build's CUDA
needs, or when the fault switch /etc/gpuserve-lab/torch-no-cuda exists on the guest.

``publish(mirror_root)`` writes the wheels to ``mirror_root/"wheels"`` (pip find-links),
byte-identical for identical inputs (lab/wheelfile.py), and skips unchanged ones.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from lab import wheelfile

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
VERSIONS_FILE = HERE / "versions.yaml"
LOCAL = "lab"


class VersionsError(ValueError):
    pass


@cache
def _versions() -> dict:
    data = yaml.safe_load(VERSIONS_FILE.read_text())
    for key in ("torch", "driver_min", "sglang"):
        if not isinstance(data.get(key), dict):
            raise VersionsError(f"{VERSIONS_FILE}: {key}: a mapping is required")
    for version, info in data["torch"].items():
        cuda = info.get("cuda")
        if cuda not in data["driver_min"]:
            raise VersionsError(f"{VERSIONS_FILE}: torch.{version}.cuda: {cuda!r} has no "
                                "driver_min row")
        if not info.get("archs"):
            raise VersionsError(f"{VERSIONS_FILE}: torch.{version}.archs: a list is required")
    for sglang, torch in data["sglang"].items():
        if torch not in data["torch"]:
            raise VersionsError(f"{VERSIONS_FILE}: sglang.{sglang}: torch {torch} is not "
                                "under torch:")
    return data


def standin_versions() -> list[str]:
    """``2.13.0+lab``, ``2.14.1+lab``: every torch build in versions.yaml."""
    return [f"{v}+{LOCAL}" for v in sorted(_versions()["torch"])]


def torch_for_sglang(sglang_version: str) -> str:
    """``0.5.23`` or ``0.5.23+lab`` -> ``2.14.1+lab``: the torch that SGLang stand-in pins."""
    base = sglang_version.split("+", 1)[0]
    pins = _versions()["sglang"]
    if base not in pins:
        raise VersionsError(f"{VERSIONS_FILE}: sglang: no torch for SGLang {base}; add a row "
                            f"'\"{base}\": \"<torch version that SGLang {base} pins>\"'")
    return f"{pins[base]}+{LOCAL}"


def cuda_of(version: str) -> str:
    return str(_versions()["torch"][version.split("+", 1)[0]]["cuda"])


def driver_min(cuda: str) -> str:
    return str(_versions()["driver_min"][cuda])


def wheel_name(version: str) -> str:
    return wheelfile.wheel_name("torch", version)


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
    info = _versions()["torch"][version.split("+", 1)[0]]
    archs = tuple(str(a) for a in info["archs"])
    return (
        '"""Build constants of this torch STAND-IN wheel (written by lab/torch_standin)."""\n\n'
        f"CUDA = {cuda_of(version)!r}\n"
        f"DRIVER_MIN = {driver_min(cuda_of(version))!r}  # the oldest driver for this CUDA\n"
        f"ARCH_LIST = {archs!r}\n"
    ).encode()


def _package_files(version: str) -> dict[str, bytes]:
    files = wheelfile.source_files(SRC, "torch")
    files["torch/version.py"] = _version_py(version)
    files["torch/_standin/build.py"] = _build_py(version)
    return dict(sorted(files.items()))


def _metadata(version: str) -> bytes:
    return wheelfile.metadata(
        "torch", version, license="BSD-3-Clause",
        summary="torch stand-in for the gpuserve lab (device queries from the lab box's "
                "nvidia-smi; not PyTorch)")


def build_wheel_bytes(version: str) -> bytes:
    """The wheel as bytes; identical inputs give identical bytes (fixed timestamps)."""
    return wheelfile.wheel_bytes("torch", version, _package_files(version), _metadata(version))


def _inputs_digest(version: str) -> str:
    return wheelfile.inputs_digest(version, Path(__file__).read_bytes(), _metadata(version),
                                   files=_package_files(version))


def build_wheel(version: str, out_dir: Path) -> Path:
    """Write the wheel for ``version`` into ``out_dir`` unless it is up to date."""
    return wheelfile.build_wheel(out_dir, wheel_name(version), _inputs_digest(version),
                                 lambda: build_wheel_bytes(version))


def publish(mirror_root: Path) -> None:
    """Put the torch stand-in wheels into ``mirror_root/wheels`` (pip --find-links)."""
    out = Path(mirror_root) / "wheels"
    for version in standin_versions():
        build_wheel(version, out)
