"""Print how long hostile-size inputs take to validate, side by side, with the ratio.

    .venv/bin/python bench/input_limits.py [--version 0.5.23] [--runs 3]

Rows: ``FlagCatalog.validate`` of 10k / 100k / 1M extra_args (repeated real flags, and
distinct ones, which are refused), plus the bounded loader refusing a billion-laughs
YAML and a 1M-deep JSON. Columns: median seconds over ``--runs`` and the ratio to the
previous size (about 10 for linear work, 100 for quadratic). For comparison the last
row runs argparse itself on 4k and 8k repeated args (the quadratic path gpuserve now
avoids). The unit tier checks the same property by counting operations
(tests/unit/launch/test_linear_validation.py); this script is where time is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuserve import safeload  # noqa: E402
from gpuserve.errors import InputError  # noqa: E402
from gpuserve.launch.catalog import load_catalog  # noqa: E402


def median_seconds(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with contextlib.suppress(InputError):
            fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def repeated(n: int) -> list[str]:
    pattern = ["--enable-metrics", "--log-level", "info", "--tp-size", "2"]
    return (pattern * (n // len(pattern) + 1))[:n]


def row(name: str, sizes: list[int], make: Callable[[int], Callable[[], object]],
        runs: int) -> None:
    cells, previous = [], None
    for n in sizes:
        seconds = median_seconds(make(n), runs)
        ratio = f" (x{seconds / previous:.1f})" if previous else ""
        cells.append(f"{n:>9,}: {seconds:8.4f} s{ratio}")
        previous = seconds
    print(f"{name:<34} " + "   ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.5.23")
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args()
    flags = load_catalog(opts.version)
    sizes = [10_000, 100_000, 1_000_000]
    print(f"# median of {opts.runs} runs; (xN) = ratio to the previous size "
          "(10x size: ~10 linear, ~100 quadratic)")
    row("validate repeated extra_args", sizes,
        lambda n: partial(flags.validate, repeated(n)), opts.runs)
    row("validate distinct (refused)", sizes,
        lambda n: partial(flags.validate, [f"--tp-size={i}" for i in range(n)]), opts.runs)
    row("YAML billion laughs (refused)", [3, 6, 9],
        lambda depth: partial(safeload.load_yaml, laughs(depth), "laughs.yaml"), opts.runs)
    row("JSON nesting (refused)", sizes,
        lambda n: partial(safeload.loads_json, "[" * n + "]" * n, "deep.json"), opts.runs)
    bare = flags.parser(False)
    row("argparse alone (quadratic)", [2_000, 4_000, 8_000],
        lambda n: partial(bare.parse_args, repeated(n)), opts.runs)


def laughs(levels: int) -> str:
    """``levels`` anchors of ten aliases each: expands to 10**levels nodes."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
