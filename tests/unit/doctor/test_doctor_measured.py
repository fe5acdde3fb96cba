"""Doctor rule allreduce-without-measured-p2p and the optional host-facts ``measured`` section.

The driver's P2P verdict can read OK while the P2P transport hangs (RTX PRO 6000:
rtx6kpro#15, nccl#1999), so the rule reads what the measuring run found.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpuserve.doctor.rules import diagnose
from gpuserve.errors import InputError
from gpuserve.host.hostfacts import HostFacts, Measured
from gpuserve.launch.profiles import PROFILES_DIR, load_profile
from gpuserve.measure import gates

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BARE = FIXTURES / "hostfacts" / "bare-metal-p2p.json"
RULE = "allreduce-without-measured-p2p"
GIB2 = 2147483648


def _run(name: str, env: dict | None = None) -> gates.Measurement:
    from gpuserve.parsers.nccl_tests import parse_nccl_tests

    result = parse_nccl_tests((FIXTURES / "gates" / name).read_text())
    return gates.measurement_from(result, GIB2, env)


def facts_with(measured: dict | None) -> HostFacts:
    doc = json.loads(BARE.read_text())
    if measured is not None:
        doc["measured"] = measured
    return HostFacts.from_dict(doc, BARE.name)


def child(tmp_path: Path, body: dict):
    path = tmp_path / "child.yaml"
    path.write_text(yaml.safe_dump({"extends": str(PROFILES_DIR / "glm5-nvfp4-tp8.yaml"),
                                    **body}))
    return load_profile(path)


def fired(profile, facts: HostFacts) -> dict[str, str]:
    return {f.id: f.evidence for f in diagnose(profile, facts) if f.id == RULE}


def _section(on) -> dict:
    off = _run("all_reduce_pro6000x8_p2p_off_composed.txt", {"NCCL_P2P_DISABLE": "1"})
    choice = gates.choose_nccl_env("ok", on, off)
    key = gates.figure_key("all_reduce_busbw", GIB2)
    doc = {"choice": choice.to_dict(),
           "figures": {key: (off if not choice.p2p else on).busbw_gbs}}
    return gates.measured_section(doc, "results/gpu1/20261201T010000Z-measure-gates.json")


def test_hang_measured_with_custom_allreduce_is_an_error(tmp_path):
    # The driver says P2P OK (bare-metal-p2p facts) but P2P hung when measured.
    section = _section(gates.Hang("all_reduce_perf", 300))
    assert section["p2p"] is False and section["p2p_hang"] is True
    profile = child(tmp_path, {"communication": {"disable_custom_all_reduce": False}})
    found = fired(profile, facts_with(section))
    assert "custom all-reduce" in found[RULE] and "P2P hung" in found[RULE]
    assert "25.81 GB/s" in found[RULE] and "measure-gates.json" in found[RULE]
    severity = {f.id: f.severity for f in diagnose(profile, facts_with(section))}[RULE]
    assert severity == "error"


def test_pcie_ipc_without_measured_p2p(tmp_path):
    slower = _section(_run("all_reduce_pro6000x8_p2p_off_composed.txt"))  # not faster
    assert slower["p2p"] is False and slower["p2p_hang"] is False
    profile = child(tmp_path, {"communication": {"disable_custom_all_reduce": True,
                                                 "pcie_ipc_allreduce": True}})
    found = fired(profile, facts_with(slower))
    assert found[RULE].startswith("PCIe-IPC all-reduce with tp 8")
    assert "not measured working and faster" in found[RULE]


def test_silent_when_measured_p2p_works_or_unknown(tmp_path):
    working = _section(_run("all_reduce_pro6000x8_p2p_on_composed.txt"))
    assert working["p2p"] is True
    custom = child(tmp_path, {"communication": {"disable_custom_all_reduce": False}})
    assert fired(custom, facts_with(working)) == {}
    assert fired(custom, facts_with(None)) == {}  # no measuring run yet: unknown
    assert fired(custom, facts_with({"p2p": None})) == {}
    off = child(tmp_path, {"communication": {"disable_custom_all_reduce": True}})
    hung = _section(gates.Hang("all_reduce_perf", 300))
    assert fired(off, facts_with(hung)) == {}  # nothing needs P2P


@pytest.mark.parametrize("profile", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_profiles_on_shipped_facts_stay_silent(profile):
    for facts in sorted((FIXTURES / "hostfacts").glob("*.json")):
        host = HostFacts.from_dict(json.loads(facts.read_text()), facts.name)
        assert fired(load_profile(profile), host) == {}


def test_measured_section_is_optional_and_checked():
    doc = json.loads(BARE.read_text())
    facts = HostFacts.from_dict(doc)
    assert facts.measured is None and "measured" not in facts.to_dict()
    with_m = facts_with({"p2p": False, "p2p_hang": True, "all_reduce_busbw_gbs": 25,
                         "record": "r.json"})
    assert with_m.measured == Measured(False, True, 25.0, "r.json")
    assert HostFacts.from_dict(with_m.to_dict()) == with_m
    bad = copy.deepcopy(doc)
    bad["measured"] = {"p2p": "yes"}
    with pytest.raises(InputError, match=r"x.json: measured.p2p: must be true/false"):
        HostFacts.from_dict(bad, "x.json")
