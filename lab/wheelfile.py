"""Deterministic pure-Python wheels for the lab's stand-ins (standard library only).

The stand-ins (``lab.sglang_standin``, ``lab.torch_standin``) are real wheels that pip
installs from the loopback mirror. Locks (``tools/gen_lock.py``) pin their sha256, so
identical inputs must give identical bytes: every archive member gets the same fixed
timestamp and mode, members are written in the order given, and RECORD is derived
from the contents. ``build_wheel`` writes a wheel only when its inputs changed (a
stamp file ``.<wheel>.inputs`` next to it holds the digest of the inputs).
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip member can carry
GENERATOR = "gpuserve lab"


def wheel_name(name: str, version: str, tag: str = "py3-none-any") -> str:
    """``sglang-kernel`` 0.4.10+lab -> ``sglang_kernel-0.4.10+lab-<tag>.whl`` (PEP 427)."""
    return f"{name.replace('-', '_')}-{version}-{tag}.whl"


def metadata(name: str, version: str, summary: str, requires: list[str] = (),
             license: str = "", requires_python: str = ">=3.11") -> bytes:  # noqa: A002
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             f"Summary: {summary}"]
    if license:
        lines.append(f"License: {license}")
    lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n").encode()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def wheel_bytes(name: str, version: str, files: Mapping[str, bytes], meta: bytes,
                entry_points: bytes | None = None, top_level: str | None = None,
                tag: str = "py3-none-any", generator: str = GENERATOR) -> bytes:
    """The wheel as bytes: ``files`` (archive path -> bytes) plus the dist-info.

    A ``tag`` other than ``py3-none-any`` (a platform wheel) is not pure-lib.
    """
    members = dict(files)
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    purelib = "true" if tag.endswith("-none-any") else "false"
    members[f"{dist}/METADATA"] = meta
    members[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {generator}\nRoot-Is-Purelib: {purelib}\n"
        f"Tag: {tag}\n").encode()
    if entry_points is not None:
        members[f"{dist}/entry_points.txt"] = entry_points
    if top_level is not None:
        members[f"{dist}/top_level.txt"] = f"{top_level}\n".encode()
    record = [_record_line(p, d) for p, d in members.items()] + [f"{dist}/RECORD,,"]
    members[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members.items():
            info = zipfile.ZipInfo(path, date_time=EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()


def source_files(root: Path, package: str) -> dict[str, bytes]:
    """Every ``*.py`` of ``root/package`` by archive path (sorted, no __pycache__)."""
    files: dict[str, bytes] = {}
    for path in sorted((root / package).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def inputs_digest(*parts: bytes | str, files: Mapping[str, bytes] = {}) -> str:  # noqa: B006
    """Digest of what a wheel is built from (this module's source included)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    for path, data in sorted(files.items()):
        h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def build_wheel(out_dir: Path, filename: str, digest: str,
                build: Callable[[], bytes]) -> Path:
    """Write ``out_dir/filename`` from ``build()`` unless its stamp says ``digest``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / filename
    stamp = out_dir / f".{filename}.inputs"
    if wheel.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return wheel
    tmp = wheel.with_suffix(".tmp")
    tmp.write_bytes(build())
    tmp.replace(wheel)
    stamp.write_text(digest + "\n")
    return wheel
