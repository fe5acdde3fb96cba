"""The output-quality check's own time on loopback: the host script one prompt per
request (as the check sent them before batching: git show of an older revision) against
the current one (batches of 32), side by side.

    .venv/bin/python bench/quality_batch.py --old OLD_SCRIPT [--runs 5]

``OLD_SCRIPT``: a copy of gpuserve/data/scripts/sglang_quality.py from before batching
(``git show cbe0646:gpuserve/data/scripts/sglang_quality.py > /tmp/old/sglang_quality.py``,
with sglang_probe.py copied beside it). Each run starts a fresh SGLang stand-in (the
0.5.23 lab wheel, built here like the unit tests build it; the toy model with its
default rates: 8,000 prompt tokens/s, 60 decode tokens/s per request, 1,500 together;
cold caches, as after a switch) and sends the shipped prompt set once; the two scripts
alternate so drift on a shared machine hits them alike. It prints the median (and
min-max) of the host script's own ``elapsed_s``, the figure the quality record keeps.
Every reply must parse with no request error. No test asserts on these times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit")]

from standin_server import healthy_server, standin_env  # noqa: E402

from gpuserve import paths  # noqa: E402
from gpuserve.quality.collect import read_output, request_spec  # noqa: E402
from gpuserve.quality.prompts import load_prompts  # noqa: E402
from lab import sglang_standin  # noqa: E402


def stand_in(tmp: Path) -> tuple[Path, Path]:
    """(the unpacked 0.5.23 stand-in wheel, a toy model directory)."""
    sglang_standin.publish(tmp / "mirror")
    site = tmp / "site"
    with zipfile.ZipFile(tmp / "mirror" / "wheels" / sglang_standin.wheel_name("0.5.23+lab")) as zf:
        zf.extractall(site)
    model = tmp / "toy"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 263}))
    return site, model


def one(script: str, site: Path, model: Path, spec: str, prompts) -> float:
    """The host script's elapsed seconds against a fresh stand-in."""
    with healthy_server(model, "toy", (), standin_env(site)) as port:
        out = subprocess.run([sys.executable, script, "--port", str(port), "--spec", spec],
                             capture_output=True, text=True, timeout=300, check=True).stdout
    results, elapsed = read_output(out, prompts)
    errors = [r.error for r in results if r.error]
    if errors:
        raise SystemExit(f"{script}: {len(errors)} request errors, first: {errors[0]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="the host script from before batching")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    prompts = load_prompts(32)
    spec = request_spec(prompts, 20, 120)
    scripts = {"one prompt per request": a.old,
               "batches of 32": str(paths.SCRIPTS_DIR / "sglang_quality.py")}
    times: dict[str, list[float]] = {k: [] for k in scripts}
    with tempfile.TemporaryDirectory() as tmp:
        site, model = stand_in(Path(tmp))
        for _ in range(a.runs):
            for name, script in scripts.items():
                times[name].append(one(script, site, model, spec, prompts))
    for name, t in times.items():
        print(f"{name:24s} {statistics.median(t):.2f} s ({min(t):.2f}-{max(t):.2f}), "
              f"{len(t)} runs")


if __name__ == "__main__":
    main()
