"""A locked venv's install from a local wheelhouse: the former pip install, the deploy's
uv install and a bare ``uv pip install``, side by side.

    .venv/bin/python bench/install_speed.py [--lock gpuserve/data/locks/smg-1.13.0-py311.json]
        [--wheelhouse DIR] [--runs 3] [--python PYTHON]

The wheelhouse is filled once by ``gpuserve wheelhouse --lock LOCK DIR`` (the lock's
wheels and the pinned uv wheel, hash-checked; kept between runs). The pinned uv is then
installed once by the deploy's own bootstrap step (pip ``--require-hashes`` from the
wheelhouse) into a temporary home, and timed apart: a host pays it once per uv version.
Each run builds a fresh venv in that home, the three ways interleaved (pip, deploy,
bare) so drift on a shared machine hits them alike, after one untimed pip install that
warms the page cache. Every command runs without the machine's own pip and uv
settings (no config file, no PIP_*/UV_* variables):

- ``pip``: the commands the deploy ran before uv (``python -m venv``, ``pip install
  --require-hashes --no-deps --only-binary=:all: --no-index --find-links WH -r LOCK``,
  ``pip check``);
- ``deploy uv``: ``roles/sglang.build_steps`` as the deploy renders them (the pinned uv's
  version check, ``uv venv``, ``uv pip install --require-hashes --no-deps`` with a fresh
  cache beside the venvs, removed after, ``uv pip check``), run by ``sh -c``;
- ``bare uv``: ``uv venv`` and ``uv pip install --no-index --find-links WH -r LOCK`` with
  a fresh cache and nothing else.

It prints the median (and min-max) of ``--runs`` runs of each and the ratios; the goals
are the deploy's install at most 1.2x bare uv and at least 3x faster than pip. The
figures depend on the machine and its load: docs/performance.md says where each was
taken. No test asserts on them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuserve.commands.wheelhouse import lock_file
from gpuserve.roles.sglang import build_steps
from gpuserve.serve import uv
from gpuserve.serve.install import pip_args

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCK = REPO / "gpuserve" / "data" / "locks" / "smg-1.13.0-py311.json"
DEFAULT_HOUSE = Path.home() / ".cache" / "gpuserve" / "bench" / "wheelhouse"


def clean_env() -> dict[str, str]:
    """This machine's environment without its pip and uv settings (a find-links or an
    extra index of the developer's would be searched too): pip reads no config file,
    uv none either, as on a host the deploy prepared."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1"}


def sh(script: str) -> float:
    """Wall seconds of ``sh -c script``; its output only when it fails."""
    start = time.perf_counter()
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          env=clean_env())
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench: failed ({done.returncode}): {script[:300]}\n{done.stderr[-3000:]}")
    return took


def pip_script(venv: str, python: str, house: str, req: str) -> str:
    """The deploy's install before uv (roles/sglang build_steps up to 2026-12-05)."""
    q = shlex.quote
    return (f"{q(python)} -m venv {q(venv)} && {q(venv)}/bin/pip install "
            "--disable-pip-version-check --no-input --require-hashes --no-deps "
            f"--only-binary=:all: --no-index --find-links {q(house)} -r {q(req)} && "
            f"{q(venv)}/bin/pip check --disable-pip-version-check")


def bare_script(venv: str, python: str, house: str, req: str, uv_bin: str) -> str:
    q = shlex.quote
    cache = q(f"{venv}.cache")
    return (f"UV_CACHE_DIR={cache} {q(uv_bin)} venv {q(venv)} --python {q(python)} && "
            f"UV_CACHE_DIR={cache} {q(uv_bin)} pip install --python {q(venv)}/bin/python "
            f"--no-index --find-links {q(house)} -r {q(req)}; s=$?; rm -rf {cache}; exit $s")


def fill(lock_path: Path, house: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpuserve", "wheelhouse", "--lock",
                           str(lock_path), str(house)], text=True)
    if done.returncode != 0:
        sys.exit(f"bench: gpuserve wheelhouse failed ({done.returncode})")


def measure(args: argparse.Namespace, home: Path) -> dict[str, list[float]]:
    """Install uv once by the deploy's bootstrap, then ``--runs`` interleaved rounds."""
    lock = lock_file(Path(args.lock))
    house = str(Path(args.wheelhouse).resolve())
    req = home / "lock.txt"
    req.write_text(lock.requirements_text())
    options = pip_args(None, house)
    pin = uv.pin()
    first = str(home / "venvs" / "first")
    took = sh(uv.bootstrap_step(first, args.python, options, pin.version, pin.requirement(),
                                None))
    print(f"pinned uv {pin.version} installed by pip --require-hashes: {took:.2f} s (once "
          "per host and uv version, not in the figures below)")
    uv_bin = uv.uv_path(first, pin.version)
    sh(pip_script(first, args.python, house, str(req)))  # warms the page cache
    shutil.rmtree(first)
    times: dict[str, list[float]] = {"pip": [], "deploy uv": [], "bare uv": []}
    for i in range(args.runs):
        for name in times:
            venv = str(home / "venvs" / f"{name.replace(' ', '-')}-{i}")
            if name == "pip":
                script = pip_script(venv, args.python, house, str(req))
            elif name == "deploy uv":
                script = "\n".join(build_steps(venv, str(req), options, None, args.python))
            else:
                script = bare_script(venv, args.python, house, str(req), uv_bin)
            times[name].append(sh(script))
            shutil.rmtree(venv)
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
              flush=True)
    return times


def report(times: dict[str, list[float]], lock_name: str, count: int, size: int) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nlock {lock_name}: {count} wheels, {size / 1024**2:.1f} MiB, from a local "
          f"wheelhouse; medians of {len(times['pip'])} runs")
    print(f"{'install':<10} {'median s':>9} {'min-max s':>13} {'/ bare uv':>10} {'pip /':>7}")
    for name, values in times.items():
        print(f"{name:<10} {med[name]:>9.2f} {min(values):>6.2f}-{max(values):<6.2f} "
              f"{med[name] / med['bare uv']:>10.2f} {med['pip'] / med[name]:>7.2f}")
    print(f"goals: deploy uv <= 1.2x bare uv: {med['deploy uv'] / med['bare uv']:.2f}x; "
          f"pip >= 3x deploy uv: {med['pip'] / med['deploy uv']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", default=str(DEFAULT_LOCK))
    parser.add_argument("--wheelhouse", default=str(DEFAULT_HOUSE))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--python", default=shutil.which("python3") or sys.executable,
                        help="the interpreter of the venvs (the lock's Python)")
    args = parser.parse_args(argv)
    fill(Path(args.lock), Path(args.wheelhouse))
    lock = lock_file(Path(args.lock))
    with tempfile.TemporaryDirectory(prefix="gpuserve-install-bench-") as tmp:
        times = measure(args, Path(tmp))
    report(times, lock.name, len(lock.packages), lock.download_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
