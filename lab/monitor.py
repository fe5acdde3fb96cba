"""``python -m lab monitor``: the monitor view of a lab host in one command.

The lab host (inventory/lab_monitor.py: its own monitor host) gets the monitor deploy
(deploy/monitor.py: Prometheus, node exporter, rules), its Prometheus port is forwarded
to this machine (``lab forward``), and ``gpuserve fleet status`` prints the host's row
with the live figures from that Prometheus. The same commands a real fleet runs, with
the lab's addresses filled in: docs/metrics.md, "In the lab".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lab import fleet

REPO_ROOT = Path(__file__).resolve().parent.parent
INVENTORY = "inventory/lab_monitor.py"
PROMETHEUS_PORT = 9090


def _bin(name: str) -> str:
    """The tool beside this interpreter (the repository's .venv/bin)."""
    return str(Path(sys.executable).with_name(name))


def monitor(name: str, timeout: float = 1800) -> int:
    """Deploy the monitor on instance ``name``, forward Prometheus, print the fleet
    status; the exit status of the first step that fails."""
    env = {**os.environ, "GPUSERVE_LAB_NAME": name}
    deploy = [_bin("pyinfra"), "-y", INVENTORY, "deploy/monitor.py"]
    print(f"lab {name}: {' '.join(deploy[1:])}", flush=True)
    rc = subprocess.run([*deploy], cwd=REPO_ROOT, env=env, timeout=timeout).returncode
    if rc != 0:
        return rc
    port = fleet.forward(name, PROMETHEUS_PORT)
    url = f"http://127.0.0.1:{port}"
    print(f"lab {name}: Prometheus at {url} (the guest's port {PROMETHEUS_PORT})", flush=True)
    status = [_bin("gpuserve"), "fleet", "status", INVENTORY, "--prometheus", url]
    print(f"lab {name}: gpuserve {' '.join(status[1:])}", flush=True)
    return subprocess.run(status, cwd=REPO_ROOT, env=env, timeout=120).returncode
