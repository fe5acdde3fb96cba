"""Host-facts document: typed load, errors by JSON path, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.facts.document import document_from_sections
from gpuserve.host.hostfacts import HostFacts

HOSTFACTS = Path(__file__).resolve().parents[2] / "fixtures" / "hostfacts"


@pytest.mark.parametrize("name", ["reference-box-kvm", "bare-metal-p2p", "h200-nvlink"])
def test_fixture_round_trip(name):
    path = HOSTFACTS / f"{name}.json"
    doc = json.loads(path.read_text())
    facts = HostFacts.from_file(path)
    out = facts.to_dict()
    for gpu in out["gpus"]:
        assert gpu.pop("memory_used_mib") is None  # optional key, absent in the fixtures
    assert out == doc
    assert HostFacts.from_dict(facts.to_dict()) == facts


def test_derived_views():
    ref = HostFacts.from_file(HOSTFACTS / "reference-box-kvm.json")
    assert ref.is_vm is True and ref.sm_majors == {12} and ref.min_memory_mib == 97887
    assert ref.topology.nvlink is False and ref.topology.p2p == "none"
    h200 = HostFacts.from_file(HOSTFACTS / "h200-nvlink.json")
    assert h200.topology.nvlink is True and h200.is_vm is False and h200.sm_majors == {9}
    empty = HostFacts.from_dict({})
    assert empty.is_vm is None and empty.topology.nvlink is None and empty.gpus == []


@pytest.mark.parametrize(("doc", "field", "words"), [
    ({"gpus": [{"index": 0}, {"index": 1, "compute_cap": "sm120"}]}, "gpus[1].compute_cap",
     "12.0"),
    ({"gpus": [{"memory_total_mib": "96 GB"}]}, "gpus[0].memory_total_mib", "integer"),
    ({"gpus": {"0": {}}}, "gpus", "list"),
    ({"topology": {"p2p": "yes"}}, "topology.p2p", "ok, none, partial"),
    ({"topology": {"links": [["X", 1]]}}, "topology.links", "rows of strings"),
    ({"driver": {"flavour": "closed"}}, "driver.flavour", "open, proprietary"),
    ({"kernel": {"secure_boot": "no"}}, "kernel.secure_boot", "true/false"),
    ({"kernel": {"iommu_groups": True}}, "kernel.iommu_groups", "integer"),
    ({"kernel": []}, "kernel", "object"),
])
def test_bad_values_name_the_field(doc, field, words):
    with pytest.raises(InputError) as info:
        HostFacts.from_dict(doc, "host.json")
    assert info.value.file == "host.json"
    assert info.value.field == field
    assert words in info.value.message


def test_invalid_json_names_the_line():
    with pytest.raises(InputError) as info:
        HostFacts.from_json('{\n  "hostname": "x",\n  "gpus": [,]\n}', "host.json")
    assert info.value.line == 3 and "invalid JSON" in info.value.message


def test_nulls_and_unknown_keys_are_accepted():
    facts = HostFacts.from_dict({"hostname": None, "cpu_vendor": "AuthenticAMD",
                                 "cuda": {"toolkit": 13.0}, "gpus": []})
    assert facts.hostname is None and facts.cuda.toolkit == "13.0"


def test_document_from_the_facts_side_is_accepted():
    """The facts engineer's builder, with every tool missing, gives a valid document."""
    doc = document_from_sections({})
    facts = HostFacts.from_dict(doc, "gathered")
    assert facts.gpus == [] and facts.topology.p2p is None


def test_unreadable_facts_file_is_an_input_error(tmp_path):
    path = tmp_path / "host.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InputError) as info:
        HostFacts.from_file(path)
    assert info.value.file == str(path) and "not UTF-8" in info.value.message


def _pyinfra_json(docs: dict) -> str:
    """What `pyinfra --json INVENTORY fact gpuserve.facts.document.HostFactsDocument` prints."""
    return json.dumps({"gpuserve.facts.document.HostFactsDocument": docs})


def test_pyinfra_fact_output_is_unwrapped(tmp_path):
    doc = json.loads((HOSTFACTS / "reference-box-kvm.json").read_text())
    path = tmp_path / "facts.json"
    path.write_text(_pyinfra_json({"lab-gpu": doc}))
    facts = HostFacts.from_file(path)
    assert facts.to_dict() == HostFacts.from_dict(doc).to_dict()


def test_pyinfra_fact_output_with_several_hosts_needs_host(tmp_path):
    doc = json.loads((HOSTFACTS / "reference-box-kvm.json").read_text())
    other = json.loads((HOSTFACTS / "h200-nvlink.json").read_text())
    path = tmp_path / "facts.json"
    path.write_text(_pyinfra_json({"gpu1": doc, "gpu2": other}))
    with pytest.raises(InputError, match="choose one with --host"):
        HostFacts.from_file(path)
    assert HostFacts.from_file(path, "gpu2").to_dict() == HostFacts.from_dict(other).to_dict()
    with pytest.raises(InputError, match="no host 'gpu3'"):
        HostFacts.from_file(path, "gpu3")
    path.write_text(_pyinfra_json({"gpu1": None}))
    with pytest.raises(InputError, match="gathered no document"):
        HostFacts.from_file(path)
