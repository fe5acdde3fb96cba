"""The start records among ``gpuserve compare``'s inputs, as a table of where each
start's time went (gpuserve/measure/start_phases.py), newest last per host.

Why: after a switch or a version change the user asks what the start cost and whether
the JIT caches were reused (a second start of the same launch has a short JIT phase).
"""

from __future__ import annotations

from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.measure.start_phases import PHASES
from gpuserve.measure.starts import MAX_BYTES, StartRecord, parse_start
from gpuserve.table import table

_SHORT = {"to_weights": "to-weights", "weights": "weights", "kv_pool": "kv-pool",
          "graphs": "graphs", "jit": "jit", "warmup": "warm-up",
          "first_healthy": "healthy"}
#: start records read from one compare (each is a few KiB)
MAX_FILES = 2000


def read_start_records(paths: list[str], host: str | None = None) -> list[StartRecord]:
    """Every readable ``gpuserve.start/1`` file under ``paths`` (files or folders) that
    carries phases, oldest first; a file that does not read is passed over (compare
    already names it among the skipped)."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        files += sorted(p.rglob("*-start-*.json")) if p.is_dir() else [p]
    found = []
    for path in files[:MAX_FILES]:
        if not path.name.endswith(".json") or "-start-" not in path.name:
            continue
        try:
            doc = safeload.loads_json(safeload.read_text(path, MAX_BYTES), str(path))
            record = parse_start(doc, str(path))
        except (InputError, OSError):
            continue
        if record.phases and (host is None or record.host == host):
            found.append(record)
    return sorted(found, key=lambda r: (r.host, r.timestamp))


def starts_table(records: list[StartRecord]) -> str:
    """The records as a text table, one start a row, seconds per phase."""
    if not records:
        return ""
    head = ["host", "when", "profile", "sglang", "outcome", *(_SHORT[k] for k in PHASES)]
    rows = [[r.host, r.timestamp, str(r.launch.get("profile") or "-"), r.sglang_version,
             r.outcome, *(f"{r.phases[k]:.1f}" if k in r.phases else "-" for k in PHASES)]
            for r in records]
    return "\n".join(["starts (seconds per phase; jit overlaps the others)",
                      *table([[str(c) for c in row] for row in [head, *rows]], rule=False)])


def starts_json(records: list[StartRecord]) -> list[dict]:
    return [{"host": r.host, "timestamp": r.timestamp, "profile": r.launch.get("profile"),
             "sglang_version": r.sglang_version, "outcome": r.outcome, "phases": r.phases}
            for r in records]
