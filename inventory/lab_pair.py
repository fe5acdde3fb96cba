"""pyinfra inventory for a fleet's tune in the lab: lab instances as GPU hosts of their own,
each with the lab host's data (inventory/lab.py), no private network between them.

    python -m lab up                                   # instance A (served already)
    python -m lab up --name A-2 --clone-from A         # B: a copy of A's disk
    gpuserve tune inventory/lab_pair.py TUNE.yaml --limit lab-gpu,lab-gpu-2

Instances: $GPUSERVE_LAB_FLEET ("A,B" or more), default "<GPUSERVE_LAB_NAME>,<same>-2";
hosts lab-gpu, lab-gpu-2, ... (inventory/lab_fleet.py is the same pair on a private
network, for the gateway and multi-node launches).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from lab.state import instance_name  # noqa: E402

_spec = importlib.util.spec_from_file_location("gpuserve_lab_inventory", _HERE / "lab.py")
_lab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lab)


def _names() -> list[str]:
    env = os.environ.get("GPUSERVE_LAB_FLEET")
    if env:
        return [instance_name(n.strip()) for n in env.split(",") if n.strip()]
    first = instance_name()
    return [first, f"{first}-2"]


#: the gateway's keys: no gateway here (inventory/lab_fleet.py has one)
_ROUTER_KEYS = tuple(k for k in _lab.LAB_HOST_DATA if k.startswith("router_"))


def _host(index: int, name: str) -> tuple[str, dict]:
    data = _lab.host_data_for(name)
    for key in _ROUTER_KEYS:
        data.pop(key, None)
    return ("lab-gpu" if index == 0 else f"lab-gpu-{index + 1}"), data


gpu = [_host(i, name) for i, name in enumerate(_names())]
