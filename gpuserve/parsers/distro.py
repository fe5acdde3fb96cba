"""Parsers of a distribution's own answers: ``/etc/os-release`` and ``apt-cache policy``.

os-release: os-release(5), shell-style ``KEY=value`` lines, values optionally quoted.
apt-cache policy: apt-cache(8); per package a ``name:`` line, ``Installed:``,
``Candidate:`` and a version table whose ``500 URL SUITE/COMPONENT ARCH Packages`` lines
name where each version comes from. Recorded outputs: gpuserve/data/distros/SOURCES.md.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

MAX_LINES = 10_000


def parse_os_release(text: str) -> dict[str, str]:
    """``{"ID": "ubuntu", "VERSION_ID": "22.04", ...}``; malformed lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines()[:MAX_LINES]:
        key, sep, value = line.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            continue
        out[key] = words[0] if words else ""
    return out


@dataclass(frozen=True)
class AptCandidate:
    """One package's candidate as apt would install it, and where it comes from."""

    package: str
    candidate: str | None  # "3.11.0~rc1-1~22.04"; None: "(none)"
    installed: str | None
    components: tuple[str, ...]  # of the candidate's origins: ("universe",), ("main",)


def parse_apt_policy(text: str) -> dict[str, AptCandidate]:
    """Every package ``apt-cache policy PKG...`` printed (unknown packages print nothing)."""
    found: dict[str, AptCandidate] = {}
    name: str | None = None
    fields: dict[str, str] = {}
    origins: dict[str, list[str]] = {}
    version: str | None = None
    for line in text.splitlines()[:MAX_LINES] + ["end:"]:
        head = re.fullmatch(r"(\S+):", line.rstrip())
        if head:
            if name is not None:
                found[name] = _candidate(name, fields, origins)
            name, fields, origins, version = head.group(1), {}, {}, None
            continue
        key = re.fullmatch(r"\s+(Installed|Candidate): (\S+)", line)
        row = re.fullmatch(r"\s+(?:\*\*\* )?(\S+) -?\d+", line)
        origin = re.fullmatch(r"\s+-?\d+ \S+ (\S+)/(\S+) \S+ Packages", line)
        if key:
            fields[key.group(1)] = key.group(2)
        elif origin and version is not None:
            origins.setdefault(version, []).append(origin.group(2))
        elif row:
            version = row.group(1)
    return found


def _candidate(name: str, fields: dict[str, str], origins: dict[str, list[str]]) -> AptCandidate:
    def value(key: str) -> str | None:
        v = fields.get(key)
        return None if v in (None, "(none)") else v

    candidate = value("Candidate")
    return AptCandidate(name, candidate, value("Installed"),
                        tuple(dict.fromkeys(origins.get(candidate or "", []))))
