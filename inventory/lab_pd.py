"""pyinfra inventory for the lab's PD fleet: the first lab instance prefills (and runs
SGLang's gateway in PD mode), the second decodes (docs/disaggregation.md).

    python -m lab up                                   # instance A
    python -m lab up --name A-2 --clone-from A         # B: a copy of A's disk
    python -m lab link A A-2                           # 10.77.0.1 / 10.77.0.2
    pyinfra -y --serial inventory/lab_pd.py deploy/serve.py
    pyinfra -y inventory/lab_pd.py deploy/router.py

Instances: $GPUSERVE_LAB_FLEET ("A,B" or "A,B,C"), default "<GPUSERVE_LAB_NAME>,<same>-2".
Groups: ``prefill`` (lab-gpu), ``decode`` (lab-gpu-2, and lab-gpu-3 with a third
instance) and ``gpu`` (all: the gateway's workers). Every host serves
tests/fixtures/profiles/lab-pd.yaml from the mirror's PD locks (lab/locks.py: the newest
stand-in with the Mooncake stand-in resolved in); $GPUSERVE_LAB_PD_DECODE_PROFILE gives
the decode hosts another profile (an edit of the decode group's data, as a user makes
it for a decode-only switch). The live judgement of a rolling switch is off
(``rolling_live_window`` 0): the fleet lab test (inventory/lab_fleet.py) covers it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from lab import inventories  # noqa: E402
from lab.locks import pd_locks_dir  # noqa: E402
from lab.state import read_state  # noqa: E402

_lab = inventories.lab_inventory()
PROFILE = "tests/fixtures/profiles/lab-pd.yaml"


def _pd_host(index: int, name: str) -> tuple[str, dict]:
    data = _lab.host_data_for(name)
    st = read_state(name)
    address = (st.extra if st else {}).get("fleet_address")
    if not address:
        raise _lab.LabNotRunning(f"lab instance {name!r} has no fleet address: run "
                                 "`python -m lab link A B` first")
    profile = PROFILE if index == 0 else \
        os.environ.get("GPUSERVE_LAB_PD_DECODE_PROFILE") or PROFILE
    data.update(private_address=address, listen_address=address, profile=profile,
                rolling_live_window=0,
                sglang_prefill_group="prefill", sglang_decode_group="decode",
                sglang_locks_dir=str(pd_locks_dir(st.mirror_root)))
    if index > 0:
        data = inventories.without_gateway(data)
    else:
        data["router_policy"] = "round_robin"
    return inventories.fleet_host_name(index), data


_hosts = [_pd_host(i, n) for i, n in enumerate(inventories.fleet_names())]
prefill = _hosts[:1]
decode = _hosts[1:]
gpu = _hosts
