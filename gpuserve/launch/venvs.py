"""Where each lock's venv lives on a host, and which old venvs may go.

One immutable venv per lock: a switch to another SGLang builds a new venv beside the
live one and then moves the unit to it, so a rollback (which restores the old unit)
finds its venv untouched. pip's in-place upgrades keep dropped dependencies around
(sglang-install.md §4.7); a fresh venv per lock cannot.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
from dataclasses import dataclass

from gpuserve.launch.locks import Lock

# Written inside a venv once the verification passed; a venv without it is unfinished
# (an interrupted install) and is rebuilt, never served.
STAMP = ".gpuserve-verified"


def venvs_dir(home: str) -> str:
    return f"{home}/venvs"


def venv_path(home: str, lock: Lock, interpreter: str | None = None) -> str:
    """``/opt/gpuserve/venvs/0.5.23-1a2b3c4d5e6f``: the version for people, the lock's
    hash so that a regenerated lock of the same version gets a venv of its own; built by
    another ``interpreter`` than python3 (its path), a suffix of that path's hash, so a
    change of interpreter builds a venv beside the old one (which a rollback finds)."""
    return f"{venvs_dir(home)}/{lock.sglang}-{lock.hash}{interpreter_suffix(interpreter)}"


def interpreter_suffix(interpreter: str | None) -> str:
    """``-py1a2b3c4d`` for a venv built by another interpreter than python3 (SGLang's
    and the gateway's venvs alike), else nothing."""
    if not interpreter or interpreter == "python3":
        return ""
    return f"-py{hashlib.sha256(interpreter.encode()).hexdigest()[:8]}"


def requirements_path(home: str, lock: Lock) -> str:
    return f"{home}/locks/{lock.sglang}-{lock.hash}.txt"


def referenced_venvs(texts: list[str], home: str) -> set[str]:
    """Venv directories named in unit files (the live one and the last good one)."""
    pattern = re.compile(re.escape(venvs_dir(home)) + r"/[^/\s'\"]+")
    return {m.group(0) for text in texts for m in pattern.finditer(text)}


@dataclass(frozen=True)
class VenvEntry:
    path: str
    mtime: int
    verified: bool


def venvs_to_prune(entries: list[VenvEntry], keep_paths: set[str], keep: int) -> list[str]:
    """The venvs to delete so that ``keep`` remain: those a unit names first (the live
    unit and the last good one are never pruned, so a rollback always finds its venv),
    then the newest verified ones. Unverified leftovers nobody names go too."""
    kept = set(keep_paths)
    for entry in sorted((e for e in entries if e.verified), key=lambda e: (-e.mtime, e.path)):
        if len(kept) >= keep:
            break
        kept.add(entry.path)
    return sorted(e.path for e in entries if e.path not in kept)


def parse_listing(lines: list[str] | None, home: str) -> list[VenvEntry]:
    """Lines ``MTIME VERIFIED(0|1) PATH`` from :func:`listing_command`. Only directories
    right under ``<home>/venvs`` are entries, whatever a line says: they are the only
    paths a prune may delete."""
    entries = []
    for line in lines or []:
        parts = line.strip().split(" ", 2)
        if (len(parts) == 3 and parts[0].isdigit() and parts[1] in ("0", "1")
                and _in_venvs_dir(parts[2], home)):
            entries.append(VenvEntry(parts[2], int(parts[0]), parts[1] == "1"))
    return entries


def _in_venvs_dir(path: str, home: str) -> bool:
    name = posixpath.basename(path)
    return posixpath.dirname(path) == venvs_dir(home) and name not in ("", ".", "..")


def listing_command(home: str) -> str:
    d = shlex.quote(venvs_dir(home))  # the glob stays outside the quotes
    return (f'for v in {d}/*/; do [ -d "$v" ] || continue; v=${{v%/}}; '
            f'if [ -f "$v/{STAMP}" ]; then s=1; else s=0; fi; '
            f'echo "$(stat -c %Y "$v") $s $v"; done')
