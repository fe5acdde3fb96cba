"""Whether a fleet's hosts are the same box for a tune: what must be equal, and how they
differ.

Why: one search judges every candidate against the incumbent on the host it ran on, at
that host's noise; that holds only where the hosts differ by run-to-run noise and
small clock differences, not by GPU model, GPU count, SGLang build, checkpoint, driver
or CUDA. Checked twice: the host data that chooses these, from the inventory before any
connection; then what each host's read-only snapshot found, before any load.
docs/tune.md, "A fleet in parallel".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gpuserve.errors import InputError
from gpuserve.tune.snapshot import HostSnapshot

#: host data that chooses the SGLang build, its interpreter and the driver/CUDA lane
DATA_FIELDS = ("sglang_version", "sglang_python", "cuda_lane", "nvidia_driver_branch",
               "nvidia_driver_flavour")


def _shown(value: Any) -> str:
    """A value as an error shows it: bounded, control characters escaped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                           sort_keys=True)
    return repr(text[:80] + ("..." if len(text) > 80 else ""))


def data_fields(data: dict[str, Any]) -> dict[str, str]:
    """The host data a fleet's hosts must share (absent: the role's default)."""
    return {key: "(default)" if data.get(key) is None else _shown(data.get(key))
            for key in DATA_FIELDS}


def _checkpoint(text: str | None) -> str:
    """The checkpoint scan's identity: its config and files (name, size, tensors), not
    where it lies on the host."""
    if not text:
        return "none"
    try:
        doc = json.loads(text)
    except ValueError:
        return "unreadable scan"
    files = doc.get("files") if isinstance(doc, dict) else None
    ident = json.dumps({"config": doc.get("config") if isinstance(doc, dict) else None,
                        "files": files}, sort_keys=True, default=str)
    count = len(files) if isinstance(files, list) else 0
    return f"{count} files, scan {hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def _drafts(drafts: dict[str, str]) -> str:
    """The separate draft checkpoints the candidates name, each directory with its scan's
    identity (a directory a host could not read is absent from its snapshot)."""
    if not drafts:
        return "none"
    return "; ".join(f"{path}: {_checkpoint(scan)}" for path, scan in sorted(drafts.items()))


def snapshot_fields(snap: HostSnapshot) -> dict[str, str]:
    """What a host's snapshot found that a fleet's hosts must share."""
    facts = snap.host_facts or {}
    driver = facts.get("driver") if isinstance(facts.get("driver"), dict) else {}
    cuda = facts.get("cuda") if isinstance(facts.get("cuda"), dict) else {}
    names = sorted({str(g.get("name")) for g in snap.gpus})
    memory = sorted({str(g.get("memory_total_mib")) for g in snap.gpus})
    return {"gpu model": _shown(", ".join(names)), "gpu count": str(len(snap.gpus)),
            "gpu memory MiB": _shown(", ".join(memory)),
            "sglang version": _shown(snap.sglang_version), "lock": _shown(snap.lock),
            "checkpoint": _shown(_checkpoint(snap.checkpoint)),
            "draft checkpoints": _shown(_drafts(snap.drafts)),
            "driver": _shown(driver.get("version")), "cuda": _shown(cuda.get("toolkit"))}


def differences(hosts: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Each field where a host differs from the first: host, field and both values."""
    if not hosts:
        return []
    first, mine = hosts[0]
    out = []
    for name, theirs in hosts[1:]:
        for key in mine:
            if theirs.get(key) != mine[key]:
                out.append(f"{name}: {key} is {theirs.get(key)}, {first}'s is {mine[key]}")
    return out


def require_same(source: str, hosts: list[tuple[str, dict[str, str]]], what: str) -> None:
    """An ``InputError`` naming every difference (``what``: where the values came from)."""
    diff = differences(hosts)
    if diff:
        raise InputError(source, "--limit", f"a fleet tunes only hosts that are the same "
                         f"box; these differ ({what}): " + "; ".join(diff[:12])
                         + (f" (and {len(diff) - 12} more)" if len(diff) > 12 else ""))
