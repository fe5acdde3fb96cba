"""The fabric-not-ready rule: an NVSwitch host whose GPUs' fabric registration is not
done (CUDA error 802) gets the Fabric Manager fix; PCIe hosts (every field N/A) and
registered ones get nothing. States as nvidia-smi prints them (tests/fixtures/gpuhost)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpuserve.doctor.rules import diagnose
from gpuserve.facts.document import document_from_sections
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.profiles import load_profile

HOSTFACTS = Path(__file__).resolve().parents[2] / "fixtures" / "hostfacts"
PROFILE = "qwen3-235b-a22b-fp8-h200-tp8"


def _facts(states: list[tuple[str, str]] | None) -> HostFacts:
    doc = copy.deepcopy(json.loads((HOSTFACTS / "h200-nvlink.json").read_text()))
    if states is not None:
        doc["fabric"] = [{"bus_id": g["bus_id"], "state": s, "status": st}
                         for g, (s, st) in zip(doc["gpus"], states, strict=False)]
    return HostFacts.from_dict(doc, "h200-nvlink.json")


def _finding(states):
    found = [f for f in diagnose(load_profile(PROFILE), _facts(states))
             if f.id == "fabric-not-ready"]
    return found[0] if found else None


def test_in_progress_fabric_maps_802_to_fabric_manager():
    finding = _finding([("In Progress", "N/A")] * 8)
    assert finding is not None and finding.severity == "error"
    text = json.dumps(finding.to_dict())
    assert "802" in text and "nvidia-fabricmanager" in text and "In Progress" in text


def test_completed_with_error_status_fires():
    finding = _finding([("Completed", "Success")] * 7 + [("Completed",
                                                          "Insufficient Resources")])
    assert finding is not None and "Insufficient Resources" in json.dumps(finding.to_dict())


def test_registered_pcie_and_unknown_are_silent():
    assert _finding([("Completed", "Success")] * 8) is None
    assert _finding([("N/A", "N/A")] * 8) is None
    assert _finding(None) is None


def test_document_carries_the_fabric_query():
    lines = ["00000000:1B:00.0, In Progress, N/A", "00000000:43:00.0, Completed, Success"]
    doc = document_from_sections({"fabric": lines})
    assert doc["fabric"] == [
        {"bus_id": "00000000:1B:00.0", "state": "In Progress", "status": "N/A"},
        {"bus_id": "00000000:43:00.0", "state": "Completed", "status": "Success"}]
    assert document_from_sections({})["fabric"] is None
