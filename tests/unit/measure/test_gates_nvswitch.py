"""The measured gates on an NVSwitch box: the lab's hgx-h100 (8x H100 SXM, every pair
NV18: topo -m rows of ThunderKittens#167) is judged against the NVLink 4 figures, not a
PCIe baseline."""

from __future__ import annotations

import json
from pathlib import Path

from gpuserve.host import fabric
from gpuserve.measure import gates
from gpuserve.parsers import nvidia_smi

BOX = Path(__file__).resolve().parents[3] / "lab" / "nvidia_repo" / "boxes" / "hgx-h100"


def _facts() -> dict:
    box = json.loads((BOX / "box.json").read_text())
    links = nvidia_smi.parse_topo_matrix((BOX / "topo-m.txt").read_text()).to_json()["links"]
    gpus = [{k: g[k] for k in ("index", "name", "uuid", "bus_id", "memory_total_mib",
                              "compute_cap")} for g in box["gpus"]]
    return {"virtualization": "none", "gpus": gpus, "topology": {"links": links, "p2p": "ok"}}


def test_hgx_h100_expects_nvlink_bandwidth():
    facts = _facts()
    assert fabric.detect(links=facts["topology"]["links"]).nvswitch
    assert gates.topology_class(facts) == "nvlink4"
    checks = gates.load_expectations().classes["nvlink4"]
    busbw = [c for c in checks if c.metric == "all_reduce_busbw"]
    assert busbw and busbw[0].expected >= 400
