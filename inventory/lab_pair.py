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

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from lab import inventories  # noqa: E402

_lab = inventories.lab_inventory()
# no gateway here (inventory/lab_fleet.py has one)
gpu = [(inventories.fleet_host_name(i), inventories.without_gateway(_lab.host_data_for(name)))
       for i, name in enumerate(inventories.fleet_names())]
