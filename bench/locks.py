"""Print the committed SGLang locks side by side: wheels, download size, externals.

    .venv/bin/python bench/locks.py [--locks-dir DIR]

Reads gpuserve/data/locks/ (or DIR) only: no network. The lab's install time per
lock is not measured here; ``extra_columns`` is the hook for it (a function from a
lock to one more column), so a lab run can print its timings in the same table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuserve.launch.locks import Lock, available_locks  # noqa: E402

# (header, lock -> cell text); add one for the lab's install time, e.g.
# ("install s", lambda lk: f"{timings[lk.name]:.0f}").
Column = tuple[str, Callable[[Lock], str]]

COLUMNS: list[Column] = [
    ("lock", lambda lk: lk.name),
    ("torch", lambda lk: f"{lk.torch} (CUDA {lk.torch_cuda})"),
    ("driver >=", lambda lk: lk.driver_min),
    ("glibc >=", lambda lk: lk.glibc_min),
    ("wheels", lambda lk: str(sum(1 for p in lk.packages if not p.external))),
    ("GiB", lambda lk: f"{lk.download_bytes / 2**30:.2f}"),
    ("external", lambda lk: str(len(lk.external))),
    ("hash", lambda lk: lk.hash),
]


def table(locks: Sequence[Lock], extra_columns: Sequence[Column] = ()) -> str:
    """A fixed-width table, one row per lock; ``extra_columns`` are appended."""
    columns = [*COLUMNS, *extra_columns]
    rows = [[header for header, _ in columns]]
    rows += [[cell(lk) for _, cell in columns] for lk in locks]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(text.ljust(w) if i == 0 else text.rjust(w)
                       for i, (text, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locks-dir", type=Path, help="default: the committed locks")
    args = ap.parse_args(argv)
    locks = available_locks(args.locks_dir)
    print(table(locks))
    for lk in locks:
        for ext in lk.external:
            print(f"{lk.name}: external {ext.name}=={ext.version} from {ext.index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
