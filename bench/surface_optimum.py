"""Each lab performance surface's true optimum over a launch space, per objective.

    .venv/bin/python bench/surface_optimum.py [--space lab/surfaces/spaces/reference.yaml]
                                              [--surface lab/surfaces/field-notes.yaml ...]
                                              [--input-len 1024] [--output-len 256]

For every surface (default: every lab/surfaces/*.yaml) it evaluates every launch of the
space (the product of its ``vary`` values over ``fixed``; lab/surface.py, no server
started) and prints, for ``single_stream`` and ``throughput``: the best launch, its
decode tok/s (and bench_serving's output tok/s for the given lengths), the concurrency,
how many launches are within 2% of it, and how many fail at start or crash. A tuner's
own bench prints its best found beside these figures.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab import surface  # noqa: E402


def launches(space_file: Path) -> tuple[list[dict], list[int], dict]:
    """Every launch of a space file (fixed + one value of each ``vary`` entry)."""
    space = surface.parse_yaml(space_file.read_text())
    fixed, vary = space.get("fixed") or {}, space.get("vary") or {}
    out = []
    for combo in itertools.product(*vary.values()):
        launch = dict(fixed)
        for key, value in zip(vary, combo, strict=True):
            if isinstance(value, dict):
                launch.update(value)
            elif value is not None:
                launch[key] = value
        out.append(launch)
    return out, [int(c) for c in space.get("concurrency") or [1, 4, 16, 64]], fixed


def _short(launch: dict, fixed: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in launch.items() if fixed.get(k) != v) or "(defaults)"


def report(path: Path, space: list[dict], levels: list[int], fixed: dict, args) -> None:
    surf = surface.load(path)
    print(f"{surf.name} ({path.relative_to(REPO) if path.is_relative_to(REPO) else path}): "
          f"{len(space)} launches")
    for objective in ("single_stream", "throughput"):
        t0 = time.monotonic()
        best = surface.true_optimum(surf, space, objective, concurrencies=tuple(levels),
                                    input_len=args.input_len, output_len=args.output_len)
        out = surface.true_optimum(surf, space, objective, concurrencies=tuple(levels),
                                   input_len=args.input_len, output_len=args.output_len,
                                   metric="output")
        elapsed = time.monotonic() - t0
        if best.launch is None:
            print(f"  {objective:13s} no launch runs")
            continue
        runner = next((r for r in best.ranking if r[0] < best.value * 0.98), None)
        print(f"  {objective:13s} {best.value:8.1f} decode tok/s at concurrency "
              f"{best.concurrency:<4d} {_short(best.launch, fixed)}")
        print(f"  {'':13s} {out.value:8.1f} output tok/s ({args.input_len} in, "
              f"{args.output_len} out) {_short(out.launch, fixed)}")
        print(f"  {'':13s} within 2%: {len(best.near)}, failing: {len(best.failed)}, "
              f"next below 2%: {runner[0] if runner else 0:.1f} "
              f"({_short(runner[2], fixed) if runner else '-'}); {elapsed:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", type=Path,
                        default=REPO / "lab" / "surfaces" / "spaces" / "reference.yaml")
    parser.add_argument("--surface", type=Path, action="append")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    args = parser.parse_args()
    space, levels, fixed = launches(args.space)
    paths = args.surface or sorted((REPO / "lab" / "surfaces").glob("*.yaml"))
    for path in paths:
        report(path.resolve(), space, levels, fixed, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
