"""CUDA toolkit version -> lane ("13.0"), from ``nvcc --version`` or version.json.

The lane (major.minor) names the toolkit the serve deploy points CUDA_HOME at; the
preflight refuses a lock whose torch has another CUDA major (gpuserve.launch.lock_choice).
/usr/local/cuda/version.json is written by the toolkit packages
since CUDA 11.1; older toolkits have version.txt ("CUDA Version 10.2.89").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from gpuserve.parsers.common import ParseError, as_lines

_NVCC_RE = re.compile(r"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_VERSION_TXT_RE = re.compile(r"^CUDA Version (\d+)\.(\d+)(?:\.\d+)*\s*$")


def lane(version: str) -> str:
    """"13.0.88" -> "13.0"."""
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ParseError(f"not a CUDA version: {version!r}")
    return f"{int(parts[0])}.{int(parts[1])}"


def parse_nvcc_version(text: str | Iterable[str]) -> str:
    """Lane from ``nvcc --version`` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    lines = as_lines(text)
    for line in lines:
        match = _NVCC_RE.search(line)
        if match:
            return lane(match.group(1))
    raise ParseError("no 'Cuda compilation tools, release X.Y' line")


def parse_version_json(text: str | Iterable[str]) -> str:
    """Lane from /usr/local/cuda/version.json (``{"cuda": {"version": "13.0.2"}}``)."""
    body = "\n".join(as_lines(text))
    try:
        data = json.loads(body)
        version = data["cuda"]["version"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ParseError(f"not a CUDA version.json ({exc})") from exc
    if not isinstance(version, str):
        raise ParseError("cuda.version is not a string")
    return lane(version)


def parse_toolkit(text: str | Iterable[str]) -> str:
    """Lane from whichever of version.json, version.txt or nvcc output ``text`` is."""
    lines = as_lines(text)
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("{"):
        return parse_version_json(lines)
    match = _VERSION_TXT_RE.match(first)
    if match:
        return f"{int(match.group(1))}.{int(match.group(2))}"
    return parse_nvcc_version(lines)
