"""A locked venv's install from a local wheelhouse: the former pip install, the deploy's
uv install and a bare ``uv pip install``, side by side.

    .venv/bin/python bench/install_speed.py [--lock gpuserve/data/locks/smg-1.13.0-py311.json]
        [--wheelhouse DIR] [--runs 3] [--python PYTHON] [--lab NAME]

The wheelhouse is filled once by ``gpuserve wheelhouse --lock LOCK DIR`` (the lock's
wheels and the pinned uv wheel, hash-checked; kept between runs). The pinned uv is then
installed once by the deploy's own bootstrap step (pip ``--require-hashes`` from the
wheelhouse) into a temporary home (with ``--lab NAME``: /root/install-bench on that
running lab container host, the wheelhouse copied there first, every command run over
ssh and timed by the host's own python3), and timed apart: a host pays it once per uv version.
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
- ``bare uv``: ``uv venv`` and ``uv pip install --compile-bytecode --no-index
  --find-links WH -r LOCK`` with a fresh cache and nothing else (``--compile-bytecode``:
  the deploy's venvs are compiled at install, as pip's always were, so that a server
  whose unit keeps the venv read-only does not compile at every start).

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


#: Run in the guest by its own python3: the wall seconds of ``sh -c SCRIPT`` timed there
#: (ssh's own start stays out of the figure), the script's output only when it fails.
GUEST_TIMER = ("import subprocess, sys, time\n"
               "t = time.perf_counter()\n"
               "r = subprocess.run(['sh', '-c', sys.argv[1]], capture_output=True, text=True)\n"
               "print(f'{time.perf_counter() - t:.4f}')\n"
               "sys.stderr.write(r.stderr[-3000:] if r.returncode else '')\n"
               "sys.exit(r.returncode)\n")


class Host:
    """Where the installs run: this machine in a temporary directory, or a lab container
    host (``--lab NAME``) over ssh, with the wheelhouse and the requirements copied into
    its disk first. ``run`` returns a script's wall seconds on that host."""

    def __init__(self, home: str, lab: str | None = None) -> None:
        self.home, self.lab = home, lab
        if lab is not None:
            sys.path.insert(0, str(REPO))  # lab/ is the checkout's, not an installed package
            from lab.sshutil import ssh_argv
            from lab.state import read_state

            st = read_state(lab)
            if st is None:
                sys.exit(f"bench: lab host {lab!r} is not running: "
                         f"`python -m lab up --name {lab}` first")
            self.ssh = [*ssh_argv(st.ssh_port, st.ssh_key, st.known_hosts)]

    def run(self, script: str) -> float:
        if self.lab is None:
            return sh(script)
        env = "env PIP_CONFIG_FILE=/dev/null UV_NO_CONFIG=1"
        done = subprocess.run([*self.ssh, f"{env} python3 -c {shlex.quote(GUEST_TIMER)} "
                               f"{shlex.quote(script)}"], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"bench: failed on {self.lab} ({done.returncode}): {script[:300]}\n"
                     f"{done.stderr[-3000:]}")
        return float(done.stdout.split()[-1])

    def put(self, house: Path, requirements: str) -> str:
        """The wheelhouse and the requirements on the host; the wheelhouse's path there."""
        if self.lab is None:
            Path(self.home, "lock.txt").write_text(requirements)
            return str(house.resolve())
        q, there = shlex.quote, f"{self.home}/wheelhouse"
        tar = subprocess.Popen(["tar", "-C", str(house), "-cf", "-", "."],
                               stdout=subprocess.PIPE)
        subprocess.run([*self.ssh, f"rm -rf {q(self.home)} && mkdir -p {q(there)} && "
                        f"tar -C {q(there)} -xf -"], stdin=tar.stdout, check=True)
        tar.stdout.close()
        if tar.wait() != 0:
            sys.exit(f"bench: tar of {house} failed")
        subprocess.run([*self.ssh, f"cat > {q(self.home)}/lock.txt"], input=requirements,
                       text=True, check=True)
        return there

    def remove(self, path: str) -> None:
        if self.lab is None:
            shutil.rmtree(path)
        else:
            self.run(f"rm -rf {shlex.quote(path)}")


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
            f"--compile-bytecode --no-index --find-links {q(house)} -r {q(req)}; "
            f"s=$?; rm -rf {cache}; exit $s")


def fill(lock_path: Path, house: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpuserve", "wheelhouse", "--lock",
                           str(lock_path), str(house)], text=True)
    if done.returncode != 0:
        sys.exit(f"bench: gpuserve wheelhouse failed ({done.returncode})")


def measure(args: argparse.Namespace, host: Host) -> dict[str, list[float]]:
    """Install uv once by the deploy's bootstrap, then ``--runs`` interleaved rounds."""
    lock = lock_file(Path(args.lock))
    house = host.put(Path(args.wheelhouse), lock.requirements_text())
    req = f"{host.home}/lock.txt"
    options = pip_args(None, house)
    pin = uv.pin()
    first = f"{host.home}/venvs/first"
    took = host.run(uv.bootstrap_step(first, args.python, options, pin.version,
                                      pin.requirement(), None))
    print(f"pinned uv {pin.version} installed by pip --require-hashes: {took:.2f} s (once "
          "per host and uv version, not in the figures below)")
    uv_bin = uv.uv_path(first, pin.version)
    host.run(pip_script(first, args.python, house, req))  # warms the page cache
    host.remove(first)
    times: dict[str, list[float]] = {"pip": [], "deploy uv": [], "bare uv": []}
    for i in range(args.runs):
        for name in times:
            venv = f"{host.home}/venvs/{name.replace(' ', '-')}-{i}"
            if name == "pip":
                script = pip_script(venv, args.python, house, req)
            elif name == "deploy uv":
                script = "\n".join(build_steps(venv, req, options, None, args.python))
            else:
                script = bare_script(venv, args.python, house, req, uv_bin)
            times[name].append(host.run(script))
            host.remove(venv)
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
              flush=True)
    return times


def report(times: dict[str, list[float]], lock_name: str, count: int, size: int,
           where: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nlock {lock_name}: {count} wheels, {size / 1024**2:.1f} MiB, from a local "
          f"wheelhouse, {where}; medians of {len(times['pip'])} runs")
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
    parser.add_argument("--python", default=None,
                        help="the interpreter of the venvs (the lock's Python; default "
                        "python3 here, /usr/bin/python3 on a lab host)")
    parser.add_argument("--lab", metavar="NAME", default=None,
                        help="run the installs on this running lab container host "
                        "(`python -m lab up --name NAME`), in /root/install-bench")
    args = parser.parse_args(argv)
    if args.python is None:
        args.python = ("/usr/bin/python3" if args.lab
                       else shutil.which("python3") or sys.executable)
    fill(Path(args.lock), Path(args.wheelhouse))
    lock = lock_file(Path(args.lock))
    if args.lab:
        host = Host("/root/install-bench", args.lab)
        times = measure(args, host)
        host.remove(host.home)
        where = f"on lab host {args.lab}"
    else:
        with tempfile.TemporaryDirectory(prefix="gpuserve-install-bench-") as tmp:
            times = measure(args, Host(tmp))
        where = "in a temporary directory on this machine"
    report(times, lock.name, len(lock.packages), lock.download_bytes, where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
