"""The SGLang stand-in: a standard-library ``sglang`` wheel for the lab host.

Why: the lab VM has no GPU, yet the serve deploy must install ``sglang`` with pip,
start it under systemd, wait for /health and benchmark it. The stand-in is a real
wheel (distribution ``sglang``, versions ``<X>+lab`` for every committed flag
catalog) whose ``sglang serve`` / ``python -m sglang.launch_server`` accepts exactly
the launch flags of version X (the bundled catalog, parsed by gpuserve's own
stdlib-only parser module, vendored into the wheel), logs SGLang's real start-up
lines and serves SGLang's HTTP API with simulated memory and decode speed.

``publish(mirror_root)`` writes the wheels to ``mirror_root/"wheels"`` (pip
find-links) and skips the build when none of its inputs changed.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from importlib import resources
from pathlib import Path

from gpuserve.launch.catalog import available_versions
from gpuserve.paths import PACKAGE_DIR

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
LOCAL = "lab"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _flagparser_source() -> bytes:
    return (PACKAGE_DIR / "launch" / "flagparser.py").read_bytes()


def _catalog_bytes(base_version: str) -> bytes:
    return (resources.files("gpuserve") / "data" / "flags" / f"sglang-{base_version}.json"
            ).read_bytes()


def standin_versions() -> list[str]:
    """``0.5.19+lab``, ``0.5.23+lab``, ...: one per committed flag catalog."""
    return [f"{v}+{LOCAL}" for v in available_versions()]


def wheel_name(version: str) -> str:
    return f"sglang-{version}-py3-none-any.whl"


def _package_files(version: str) -> dict[str, bytes]:
    """Every file of the ``sglang`` package in the wheel, by archive path."""
    files: dict[str, bytes] = {}
    for path in sorted((SRC / "sglang").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        files[path.relative_to(SRC).as_posix()] = path.read_bytes()
    base = version.split("+", 1)[0]
    files["sglang/version.py"] = (
        '"""Version of this SGLang stand-in (the local part marks the lab build)."""\n\n'
        f'__version__ = "{version}"\n'
        f"__version_tuple__ = {tuple(int(p) for p in base.split('.'))!r}\n"
    ).encode()
    files["sglang/_standin/flagparser.py"] = _flagparser_source()
    files["sglang/_standin/flags.json"] = _catalog_bytes(base)
    return files


def _metadata(version: str) -> bytes:
    return (
        "Metadata-Version: 2.1\n"
        "Name: sglang\n"
        f"Version: {version}\n"
        "Summary: SGLang stand-in for the gpuserve lab (simulated GPUs; not SGLang)\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.11\n"
    ).encode()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel_bytes(version: str) -> bytes:
    """The wheel as bytes; identical inputs give identical bytes (fixed timestamps)."""
    files = _package_files(version)
    dist = f"sglang-{version}.dist-info"
    files[f"{dist}/METADATA"] = _metadata(version)
    files[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: gpuserve lab/sglang_standin\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{dist}/entry_points.txt"] = (
        b"[console_scripts]\nsglang = sglang.cli.main:main\n")
    files[f"{dist}/top_level.txt"] = b"sglang\n"
    record = [_record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()


def _inputs_digest(version: str) -> str:
    h = hashlib.sha256(version.encode())
    h.update(Path(__file__).read_bytes())
    for path, data in sorted(_package_files(version).items()):
        h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def build_wheel(version: str, out_dir: Path) -> Path:
    """Write the wheel for ``version`` into ``out_dir`` unless it is up to date."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / wheel_name(version)
    stamp = out_dir / f".{wheel.name}.inputs"
    digest = _inputs_digest(version)
    if wheel.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return wheel
    tmp = wheel.with_suffix(".tmp")
    tmp.write_bytes(build_wheel_bytes(version))
    tmp.replace(wheel)
    stamp.write_text(digest + "\n")
    return wheel


def publish(mirror_root: Path) -> None:
    """Put the stand-in wheels into ``mirror_root/wheels`` (pip --find-links)."""
    out = Path(mirror_root) / "wheels"
    for version in standin_versions():
        build_wheel(version, out)
