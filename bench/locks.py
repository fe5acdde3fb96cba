"""Print SGLang locks side by side: wheels, download size, externals, and install time.

    .venv/bin/python bench/locks.py [--locks-dir DIR]
    .venv/bin/python bench/locks.py --lab-install [--runs 3]

Without options it reads gpuserve/data/locks/ (or DIR) only: no network. The committed
locks' install time is a real host's (4-5 GiB from PyPI) and is not measured here.

``--lab-install`` publishes a lab mirror (the stand-in wheels and the lab locks, made by
tools/gen_lock.py exactly as ``python -m lab up`` does) into a temporary directory and
times what the serve deploy runs for a fresh venv, on this machine: ``python3 -m venv``,
``pip install --require-hashes --no-deps --only-binary=:all: --no-index --find-links
<wheels> -r <lock>`` and ``pip check``, ``--runs`` times per lock, printing the median
and the spread. It measures the install path's own cost (venv, pip, hash checks) on
tiny stand-in wheels, not a download: inside the lab VM (QEMU without KVM) the same
steps take several times longer.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuserve.launch.locks import Lock, available_locks  # noqa: E402
from gpuserve.table import table as fixed_width  # noqa: E402

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
    return "\n".join(fixed_width(rows, right=range(1, len(columns))))


def install_seconds(lock: Lock, wheels: Path, runs: int) -> list[float]:
    """Seconds for venv + hash-checked install + pip check of ``lock``, ``runs`` times."""
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="gpuserve-bench-venv-") as tmp:
            venv, req = Path(tmp) / "venv", Path(tmp) / "lock.txt"
            req.write_text(lock.requirements_text())
            pip = [str(venv / "bin" / "pip"), "--disable-pip-version-check", "--no-input"]
            start = time.monotonic()
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([*pip, "install", "-q", "--require-hashes", "--no-deps",
                            "--only-binary=:all:", "--no-index", "--find-links", str(wheels),
                            "-r", str(req)], check=True)
            subprocess.run([*pip, "check"], check=True, stdout=subprocess.DEVNULL)
            times.append(time.monotonic() - start)
    return times


def lab_install_table(runs: int) -> str:
    from lab import mirror  # noqa: PLC0415 - the lab only for this measurement
    from lab.locks import locks_dir  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="gpuserve-bench-mirror-") as tmp:
        root = Path(tmp)
        mirror.publish_all(root)
        locks = available_locks(locks_dir(root))
        timings = {lk.name: install_seconds(lk, root / "wheels", runs) for lk in locks}
    cells = {name: f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f})"
             for name, t in timings.items()}
    return table(locks, [(f"install s, median of {runs} (min-max)",
                          lambda lk: cells[lk.name])])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locks-dir", type=Path, help="default: the committed locks")
    ap.add_argument("--lab-install", action="store_true",
                    help="time a fresh venv's install of each lab lock (see above)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    if args.lab_install:
        print(lab_install_table(max(args.runs, 1)))
        return 0
    locks = available_locks(args.locks_dir)
    print(table(locks))
    for lk in locks:
        for ext in lk.external:
            print(f"{lk.name}: external {ext.name}=={ext.version} from {ext.index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
