"""pyinfra inventory for the lab fleet: running lab instances as GPU hosts behind
SGLang's gateway on the first (rolling switches and multi-node launches).

    python -m lab up                                   # instance A (served already)
    python -m lab up --name A-2 --clone-from A         # B: a copy of A's disk
    python -m lab link A A-2                           # 10.77.0.1 / 10.77.0.2
    pyinfra -y inventory/lab_fleet.py deploy/router.py
    pyinfra -y --serial inventory/lab_fleet.py deploy/serve.py --data profile=NAME

Instances: $GPUSERVE_LAB_FLEET ("A,B" or more, in rank order), default
"<GPUSERVE_LAB_NAME>,<same>-2". Each host has the lab host's data (inventory/lab.py) and
its private address on the lab's socket network (lab/fleet.py) as ``private_address``
and ``listen_address``; only the first is the gateway's host.
$GPUSERVE_LAB_FLEET_FAIL="HOST=MODE" makes the SGLang stand-in on that host fail at
start (GPUSERVE_LAB_STANDIN_FAIL: oom or crash): the fleet test's failing second host.
Lab knobs only; product code never reads them.

A rolling switch here is judged by live traffic over 20 s (not 5 minutes), with 10
requests a side: the fleet test's client sends a few a second. The gateway routes round
robin, so every worker gets its share of the client's one-at-a-time requests (cache-aware
routing would keep them on one worker). The stand-ins run the fleet's performance
surface (lab/surfaces/fleet.yaml): every launch decodes at 60 tokens/s except one without
decode CUDA graphs (30 % slower: the fleet test's slower profile), and each request (or
batch) waits a fixed 294 ms before its first token, so the client's 5-word prompt's TTFT
(~295 ms) sits in the middle of one of SGLang's default TTFT buckets (200-400 ms), where
the scheduling noise of a busy 2-core machine (tens of ms) cannot move its p99 into
another (at ~2 ms it did, and an equal profile was rolled back).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from lab import inventories  # noqa: E402
from lab.state import read_state  # noqa: E402

_lab = inventories.lab_inventory()

#: the live judgement of a rolling switch, short for the lab (roles/router/live.py)
_LIVE = {"rolling_live_window": 20, "rolling_live_min_requests": 10,
         "rolling_live_max_wait": 30}


def _fleet_host(index: int, name: str) -> tuple[str, dict]:
    data = _lab.host_data_for(name)
    st = read_state(name)
    address = (st.extra if st else {}).get("fleet_address")
    if not address:
        raise _lab.LabNotRunning(f"lab instance {name!r} has no fleet address: run "
                                 "`python -m lab link A B` first")
    # a multi-node profile's ranks follow this group; NCCL and Gloo talk over the link
    data.update(private_address=address, listen_address=address, sglang_nodes_group="gpu",
                nccl_socket_ifname=st.extra.get("fleet_ifname"), **_LIVE)
    data["sglang_extra_env"] = {**data.get("sglang_extra_env", {}),
                                "GPUSERVE_LAB_STANDIN_SURFACE": "fleet"}
    # the output-quality check is off on the fleet (it adds seconds to every switch of
    # every host); tests/lab/test_fleet.py turns it on (--data quality_check=true) for the
    # rolling switch whose canary it stops, tests/lab/test_quality.py proves the rest
    data["quality_check"] = False
    host = inventories.fleet_host_name(index)
    if index > 0:
        data = inventories.without_gateway(data)
    else:
        data["router_policy"] = "round_robin"
    fail = dict(item.split("=", 1) for item in
                os.environ.get("GPUSERVE_LAB_FLEET_FAIL", "").split(",") if "=" in item)
    if host in fail:
        data["sglang_extra_env"] = {**data.get("sglang_extra_env", {}),
                                    "GPUSERVE_LAB_STANDIN_FAIL": fail[host]}
    return host, data


gpu = [_fleet_host(i, n) for i, n in enumerate(inventories.fleet_names())]
