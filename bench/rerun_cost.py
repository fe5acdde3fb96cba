"""What a no-op rerun and a profile switch cost, side by side with a bare pyinfra call.

    python -m lab up                                   # a lab host that serves already
    .venv/bin/python bench/rerun_cost.py [--runs 5] [--deploy serve|host|both]
    .venv/bin/python bench/rerun_cost.py --switch glm5-nvfp4-tp8-eagle3 [--runs 3]
    .venv/bin/python bench/rerun_cost.py --dry-switch glm5-nvfp4-tp8-ep8 [--runs 5]

For each deploy it prints, over ``--runs`` runs (medians, and min-max):

- ``exec -- true``: ``pyinfra -y INVENTORY exec -- true``, the floor: start pyinfra,
  connect, run one command;
- the no-op rerun of the deploy (the host must already be deployed: the first run
  that changes anything is discarded), its ratio to the floor, and the number of remote
  commands it ran (counted from one extra ``--debug`` run, pyinfra's "Running command"
  lines; not timed, the debug output slows it);
- with ``--switch PROFILE``: a profile switch there and back (``--data profile=...
  --data bench=off``: the throughput checks are a measurement of their own), its wall
  time, the server's own start-up (from systemd's start of the process to SGLang's
  "The server is fired up and ready to roll!", read from the journal with microsecond
  times) and the difference, which is what the deploy adds. That difference is then
  split into what any switch pays on this host and what is left to the deploy itself:
  the floor (``exec -- true``, run beside each switch), the restart (from systemd's
  "Stopping" line for the old server to the new process's start: the old server's own
  exit and the new one's sandbox set-up), the smoke completion that proves the new
  server generates (its own time, from the smoke record the deploy writes), the
  output-quality check (its own time on the host, from the quality record the deploy
  writes: docs/quality.md) and the rest (reads, file writes, the health gate's polling,
  the last-good copy, the prune).

- with ``--dry-switch PROFILE``: the preview of a switch (``--dry --diff --data
  profile=...``: roles/base/preview.py), its wall time beside the no-op rerun's and its
  remote commands (the rerun's batch plus the live texts it diffs).

The goals: 1 remote command and at most 3 times ``exec -- true`` for a no-op rerun of
the serve deploy, at most 3 s added to a switch, and the preview of a switch costing at
most a no-op rerun plus the reads it needs (one more batch). On the lab host every process costs
tens of milliseconds (QEMU without KVM), so the ratios are the figures to compare, and
a busy machine (another VM, a test run) inflates everything: run it on a quiet one.
No test asserts on these times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.sshutil import run_in  # noqa: E402
from lab.state import instance_dir  # noqa: E402

PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")
UNIT = "gpuserve-sglang.service"
READY = "The server is fired up and ready to roll!"


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str, int]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    return time.monotonic() - t0, proc.stdout + proc.stderr, proc.returncode


def pyinfra(inventory: str, *args: str, env: dict[str, str]) -> tuple[float, str, int]:
    return run([PYINFRA, "-y", inventory, *args], env)


def guest(cmd: str, name: str) -> str:
    try:
        return run_in(name, cmd, check=False)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def server_startup(name: str) -> tuple[float, float] | None:
    """(restart, start-up) of the newest start: seconds from systemd's "Stopping" line
    for the old server to the new process's start (``ExecMainStartTimestamp``), and from
    there to SGLang's ready line."""
    script = (f"t=$(systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value {UNIT}); "
              f"echo start=$(date -d \"$t\" +%s.%N); "
              f"journalctl -u {UNIT} -o short-unix --no-pager --since \"$t\" "
              f"| grep -F '{READY}' | tail -n 1; "
              f"journalctl -u {UNIT} -o short-unix --no-pager --until \"$t\" "
              f"| grep 'systemd\\[1\\]: Stopping {UNIT}' | tail -n 1")
    out = guest(script, name)
    start = re.search(r"start=([\d.]+)", out)
    ready = re.search(r"^([\d.]+) .*" + re.escape(READY), out, re.M)
    stopping = re.search(r"^([\d.]+) .* Stopping ", out, re.M)
    if not start or not ready or not stopping:
        return None
    restart = float(start.group(1)) - float(stopping.group(1))
    if restart > 60:  # not this start's stop (systemd restarted a crashed server?)
        return None
    return restart, float(ready.group(1)) - float(start.group(1))


def smoke_records(name: str, profile: str) -> list[Path]:
    """The smoke records of ``profile``, oldest first (the deploy writes one per passing
    smoke: inventory/lab.py keeps them per lab instance)."""
    return sorted((instance_dir(name) / "results").glob(f"*/*-smoke-{profile}.json"),
                  key=lambda p: p.name)


def smoke_seconds(records: list[Path]) -> float | None:
    """The newest record's own completion time, None when there is none."""
    if not records:
        return None
    return float(json.loads(records[-1].read_text())["figures"]["seconds"])


def quality_records(name: str, profile: str) -> list[Path]:
    """The quality check records of ``profile``, oldest first (roles/checks/quality.py)."""
    return sorted((instance_dir(name) / "results" / "quality").glob(
        f"*/*-quality-{profile}.json"), key=lambda p: p.name)


def quality_seconds(records: list[Path]) -> float:
    """The newest record's check time on the host (0 when the switch made none)."""
    if not records:
        return 0.0
    return float(json.loads(records[-1].read_text()).get("elapsed_s") or 0.0)


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):6.2f} s  ({min(values):.2f}-{max(values):.2f})"


def noop(deploy: str, inventory: str, runs: int, env: dict[str, str]) -> tuple[float, int]:
    first, out, rc = pyinfra(inventory, deploy, env=env)
    if rc != 0:
        raise SystemExit(f"{deploy} failed ({rc}):\n{out[-3000:]}")
    floor, rerun = [], []
    for _ in range(runs):
        floor.append(pyinfra(inventory, "exec", "--", "true", env=env)[0])
        seconds, out, rc = pyinfra(inventory, deploy, env=env)
        if rc != 0 or re.search(r"\] (Success|Error)\b", out):
            raise SystemExit(f"{deploy}: the rerun changed or failed something:\n"
                             f"{out[-3000:]}")
        rerun.append(seconds)
    _, debug, _ = pyinfra(inventory, "--debug", deploy, env=env)
    commands = len(re.findall(r"Running command on ", debug))
    ratio = statistics.median(rerun) / statistics.median(floor)
    print(f"{deploy}: {runs} runs (first run discarded: {first:.1f} s)")
    print(f"  exec -- true          {fmt(floor)}")
    print(f"  no-op rerun           {fmt(rerun)}   ratio {ratio:.1f}x   (goal <= 3x)")
    print(f"  remote commands       {commands:6d}     (goal: 1 for the serve deploy)")
    return statistics.median(rerun), commands


def dry_switch(profile: str, inventory: str, runs: int, env: dict[str, str],
               rerun: float, rerun_commands: int) -> None:
    """The preview of a switch (nothing changes: repeatable) against the no-op rerun."""
    argv = ("deploy/serve.py", "--dry", "--diff", "--data", f"profile={profile}")
    walls = []
    for _ in range(runs):
        seconds, out, rc = pyinfra(inventory, *argv, env=env)
        if rc != 0 or "preview: changes" not in out:
            raise SystemExit(f"--dry --diff of the switch to {profile} failed or showed "
                             f"no change:\n{out[-3000:]}")
        walls.append(seconds)
    _, debug, _ = pyinfra(inventory, "--debug", *argv, env=env)
    commands = len(re.findall(r"Running command on ", debug))
    ratio = statistics.median(walls) / rerun
    print(f"--dry --diff of a switch to {profile}: {runs} runs")
    print(f"  preview wall time     {fmt(walls)}   {ratio:.2f}x the no-op rerun")
    print(f"  remote commands       {commands:6d}     (no-op rerun: {rerun_commands}; "
          "goal: + the live texts' batch)")


def switch(profile: str, inventory: str, runs: int, name: str, env: dict[str, str]) -> None:
    back = os.environ.get("GPUSERVE_BENCH_PROFILE", "glm5-nvfp4-tp8")
    walls, startups, added = [], [], []
    floors, restarts, smokes, checks, rest = [], [], [], [], []
    for _ in range(runs):
        for target in (profile, back):
            floor = pyinfra(inventory, "exec", "--", "true", env=env)[0]
            before = set(smoke_records(name, target))
            before_q = set(quality_records(name, target))
            seconds, out, rc = pyinfra(inventory, "deploy/serve.py",
                                       "--data", f"profile={target}", "--data", "bench=off",
                                       env=env)
            if rc != 0:
                raise SystemExit(f"deploy/serve.py --data profile={target} failed:\n"
                                 f"{out[-3000:]}")
            times = server_startup(name)
            # only a record this deploy wrote (a failed write is only a warning)
            smoke = smoke_seconds([p for p in smoke_records(name, target) if p not in before])
            if times is None or smoke is None:
                raise SystemExit(f"no '{READY}' or systemd 'Stopping' line in the journal "
                                 f"for this start, or no new smoke record, after the switch "
                                 f"to {target}")
            quality = quality_seconds([p for p in quality_records(name, target)
                                       if p not in before_q])
            restart, own = times
            walls.append(seconds)
            startups.append(own)
            added.append(seconds - own)
            floors.append(floor)
            restarts.append(restart)
            smokes.append(smoke)
            checks.append(quality)
            rest.append(seconds - own - floor - restart - smoke - quality)
    print(f"profile switch {profile} <-> {back}: {len(walls)} switches (bench=off)")
    print(f"  deploy wall time      {fmt(walls)}")
    print(f"  server's own start-up {fmt(startups)}")
    print(f"  added by the deploy   {fmt(added)}   (goal <= 3 s)")
    print("  of which any switch on this host pays:")
    print(f"    exec -- true        {fmt(floors)}")
    print(f"    restart             {fmt(restarts)}   (old server's exit, new sandbox)")
    print(f"    smoke completion    {fmt(smokes)}")
    print(f"    quality check       {fmt(checks)}   (goal <= 2 s in the lab; "
          "docs/quality.md)")
    print(f"  and the deploy's own  {fmt(rest)}   (reads, writes, gate, last-good, prune)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inventory", default="inventory/lab.py")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--deploy", choices=("serve", "host", "both"), default="serve")
    p.add_argument("--switch", metavar="PROFILE",
                   help="also time switches to PROFILE and back (serve deploy)")
    p.add_argument("--dry-switch", metavar="PROFILE",
                   help="also time the preview (--dry --diff) of a switch to PROFILE")
    p.add_argument("--name", default=os.environ.get("GPUSERVE_LAB_NAME", "default"),
                   help="lab instance (for the journal read of --switch)")
    args = p.parse_args()
    env = dict(os.environ, GPUSERVE_LAB_NAME=args.name)
    deploys = {"serve": ["deploy/serve.py"], "host": ["deploy/host.py"],
               "both": ["deploy/host.py", "deploy/serve.py"]}[args.deploy]
    rerun = {deploy: noop(deploy, args.inventory, args.runs, env) for deploy in deploys}
    if args.dry_switch:
        median, commands = rerun.get("deploy/serve.py") or noop(
            "deploy/serve.py", args.inventory, args.runs, env)
        dry_switch(args.dry_switch, args.inventory, args.runs, env, median, commands)
    if args.switch:
        switch(args.switch, args.inventory, args.runs, args.name, env)


if __name__ == "__main__":
    main()
