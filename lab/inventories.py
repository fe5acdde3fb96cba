"""What the lab's extra inventories share (inventory/lab_pair.py, lab_fleet.py,
lab_monitor.py): the lab host's own inventory as a module, the fleet's instance names
and host names, and the lab host's data without the gateway's keys.

inventory/ is data, not a package, so inventory/lab.py is loaded from its file.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

from lab.state import instance_name

_LAB_INVENTORY = Path(__file__).resolve().parent.parent / "inventory" / "lab.py"


def lab_inventory() -> ModuleType:
    """inventory/lab.py, loaded once per caller (it reads the lab's state on load)."""
    spec = importlib.util.spec_from_file_location("gpuserve_lab_inventory", _LAB_INVENTORY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fleet_names() -> list[str]:
    """The fleet's lab instances: $GPUSERVE_LAB_FLEET ("A,B" or more, in order), default
    "<GPUSERVE_LAB_NAME>,<same>-2"."""
    env = os.environ.get("GPUSERVE_LAB_FLEET")
    if env:
        return [instance_name(n.strip()) for n in env.split(",") if n.strip()]
    first = instance_name()
    return [first, f"{first}-2"]


def fleet_host_name(index: int) -> str:
    """lab-gpu, lab-gpu-2, lab-gpu-3, ..."""
    return "lab-gpu" if index == 0 else f"lab-gpu-{index + 1}"


def without_gateway(data: dict) -> dict:
    """Host data without the gateway's keys (``router_*``): a host that runs no smg."""
    return {k: v for k, v in data.items() if not k.startswith("router_")}
