"""Wait, bounded, until every GPU's NVLink fabric registration is done (NVSwitch hosts).

Run by roles/fabric_manager with the host's python3 after Fabric Manager started:
polls ``nvidia-smi -q`` and reads each GPU's ``Fabric`` block (State, Status). Exits 0
once none is "Not Started"/"In Progress" and every "Completed" one says Status
"Success"; exits 1 at once when one is Completed with another Status (waiting will not
help), and 1 at the deadline naming the GPUs still pending. Stdlib only; the same rules
as gpuserve/host/fabric.py (tests/unit/host/test_fabric.py holds both to the fixtures).
"""

import argparse
import re
import subprocess
import sys
import time

PENDING = ("Not Started", "In Progress")
GPU = re.compile(r"^GPU\s+(\S+)\s*$")
FIELD = re.compile(r"^\s*(State|Status)\s*:\s*(.*?)\s*$")


def blocks(text):
    """[(bus id, state, status)] of every Fabric block."""
    out, bus, depth, cur = [], None, None, None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = GPU.match(line)
        if m:
            bus, cur = m.group(1), None
            continue
        indent = len(line) - len(line.lstrip(" "))
        if cur is not None and indent <= depth:
            cur = None
        if cur is None:
            if line.strip() == "Fabric":
                cur, depth = [bus or f"GPU #{len(out)}", "N/A", "N/A"], indent
                out.append(cur)
            continue
        f = FIELD.match(line)
        if f and indent == depth + 4:
            cur[1 if f.group(1) == "State" else 2] = f.group(2)
    return [tuple(b) for b in out]


def verdict(found):
    failed = [f"{b}: State {s}, Status {st}" for b, s, st in found
              if s == "Completed" and st != "Success"]
    if failed:
        return "failed", "; ".join(failed)
    pending = [f"{b}: State {s}" for b, s, _ in found if s in PENDING]
    if pending:
        return "pending", "; ".join(pending)
    done = sum(1 for _, s, _ in found if s == "Completed")
    return "ready", f"{done} GPU(s) registered with the fabric"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--interval", type=float, default=2.0)
    a = p.parse_args()
    deadline = time.monotonic() + a.timeout
    while True:
        try:
            run = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True,
                                 timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"fabric: nvidia-smi -q could not run: {exc}")
            return 1
        if run.returncode != 0:
            print(f"fabric: nvidia-smi -q exited {run.returncode}: {run.stdout[-300:]}")
            return 1
        state, detail = verdict(blocks(run.stdout))
        if state == "ready":
            print(f"fabric: ready: {detail}")
            return 0
        if state == "failed":
            print(f"fabric: registration failed: {detail}")
            return 1
        if time.monotonic() >= deadline:
            print(f"fabric: still not registered after {a.timeout:.0f} s: {detail} "
                  "(Fabric Manager running at the driver's exact version? "
                  "journalctl -u nvidia-fabricmanager)")
            return 1
        print(f"fabric: waiting: {detail}", flush=True)
        time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main())
