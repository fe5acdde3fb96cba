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
    # the measured choice turns custom all-reduce off itself (host.json): nothing to say
    assert section["disable_custom_all_reduce"] is True
    assert fired(profile, facts_with(section)) == {}
    # a section that does not say what the host chose (written by hand): the rule fires
    section = {k: v for k, v in section.items() if k not in ("disable_custom_all_reduce",
                                                               "env")}
    found = fired(profile, facts_with(section))
    assert "custom all-reduce" in found[RULE] and "P2P hung" in found[RULE]
    assert "25.81 GB/s" in found[RULE] and "measure-gates.json" in found[RULE]
    severity = {f.id: f.severity for f in diagnose(profile, facts_with(section))}[RULE]
    assert severity == "error"


def test_pcie_ipc_without_measured_p2p(tmp_path):
    slower = _section(_run("all_reduce_pro6000x8_p2p_off_composed.txt"))  # not faster
    assert slower["p2p"] is False and slower["p2p_hang"] is False
    profile = child(tmp_path, {"communication": {"pcie_ipc_allreduce": True}})
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
    off = child(tmp_path, {"communication": {"disable_custom_all_reduce": True,
                                             "insist": "reproducing a report"}})
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


# ----------------------------------------------------------------------------- the document
# measured.json as the measuring stage writes it (gate_runs.measured_json from an
# evaluation of the composed fixtures), read by the document in the same command.

FIX_GATES = FIXTURES / "gates"
OFF_TXT = "all_reduce_pro6000x8_p2p_off_composed.txt"


def _evaluation(driver_p2p: str, texts: dict, virtualization: str = "none", records=(),
                slow: float = 1.0):
    from gpuserve.measure import gate_runs as gr

    runs = gr.run_plan("/n", "/p", 8, driver_p2p, virtualization)
    lines: list[str] = []
    for i, run in enumerate(runs):
        name = texts[run.label]
        if name is None:
            lines += (FIX_GATES / "all_reduce_pro6000x8_hang_composed.txt").read_text() \
                .splitlines()
            lines.append(f"{gr.MARKER} {i} 124")
            continue
        text = (FIX_GATES / name).read_text()
        lines += (_slowed(text, slow) if run.tool == "all_reduce_perf" else text).splitlines()
        lines.append(f"{gr.MARKER} {i} 0")
    links = [["X" if i == j else "NODE" for j in range(8)] for i in range(8)]
    facts = {"gpus": [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
                      for i in range(8)], "virtualization": virtualization,
             "topology": {"links": links, "p2p": driver_p2p}}
    return gr.evaluate(gr.split_runs(lines, runs, 30), host="gpu1",
                       timestamp="2026-12-01T10:00:00Z", facts=facts,
                       driver_p2p=driver_p2p, exp=gates.load_expectations(),
                       sources=gates.load_sources(), records=records)


def _slowed(text: str, factor: float) -> str:
    """The lab's gates-slow switch in Python: times x factor, algbw and busbw / factor."""
    if factor == 1:
        return text
    out = []
    for line in text.splitlines():
        f = line.split()
        if f and f[0].isdigit() and len(f) >= 13:
            for i in (5, 9):
                f[i] = f"{float(f[i]) * factor:.1f}"
            for i in (6, 7, 10, 11):
                f[i] = f"{float(f[i]) / factor:.2f}"
            line = "  ".join(f)
        out.append(line)
    return "\n".join(out)


def _document(measured_text: str | None, facts: Path = BARE) -> dict:
    """The host-facts document as gathered: the fixture's sections plus measured.json."""
    from gpuserve.facts.document import _measured

    doc = json.loads(facts.read_text())
    doc["measured"] = _measured([] if measured_text is None else measured_text.splitlines())
    return doc


def test_document_reads_measured_json_in_the_same_command():
    from gpuserve.facts.document import HostFactsDocument, document_from_sections
    from gpuserve.measure import gate_runs as gr
    from gpuserve.parsers.sections import marker

    script = HostFactsDocument().command().get_raw_value()
    assert marker("measured") in script and gr.MEASURED_JSON in script
    ev = _evaluation("ok", {"p2p_on": None, "p2p_off": OFF_TXT,
                            "matrix": "p2p_bw_full_composed.txt"})
    text = gr.measured_json(ev, "fp1")
    doc = document_from_sections({"measured": text.splitlines()})
    m = doc["measured"]
    assert m["state"] == "measured" and m["p2p"] is False and m["p2p_result"] == "hung"
    assert m["env"] == {"NCCL_P2P_DISABLE": "1"} and m["disable_custom_all_reduce"] is True
    assert m["driver_p2p"] == "ok" and m["topology_class"] == "pcie-no-p2p"
    assert m["all_reduce_busbw_gbs"] == 25.81 and m["all_reduce_size_bytes"] == GIB2
    assert m["all_reduce_status"] == "baseline" and m["record"] == gr.MEASURED_JSON
    facts = HostFacts.from_dict(_document(text), "doc.json")
    assert facts.measured.p2p_result == "hung" and facts.measured.ready is True
    assert HostFacts.from_dict(facts.to_dict()) == facts
    # not gathered (an older document), absent, unreadable, not ours
    assert document_from_sections({})["measured"] is None
    assert document_from_sections({"measured": []})["measured"] == {"state": "none"}
    assert document_from_sections({"measured": ["##gpuserve-unreadable##"]})[
        "measured"] is None
    assert document_from_sections({"measured": ['{"schema": "other"}']})["measured"] is None
    assert document_from_sections({"measured": ["{not json"]})["measured"] is None


def test_measured_hang_names_the_chosen_env_and_is_an_error(tmp_path):
    from gpuserve.measure import gate_runs as gr

    ev = _evaluation("ok", {"p2p_on": None, "p2p_off": OFF_TXT,
                            "matrix": "p2p_bw_full_composed.txt"})
    facts = HostFacts.from_dict(_document(gr.measured_json(ev, "fp1")))
    ipc = child(tmp_path, {"communication": {"pcie_ipc_allreduce": True}})
    findings = {f.id: f for f in diagnose(ipc, facts)}
    evidence = findings[RULE].evidence
    assert findings[RULE].severity == "error"
    assert "P2P hung in the measuring run" in evidence and "25.81 GB/s" in evidence
    assert "NCCL env chosen: NCCL_P2P_DISABLE=1" in evidence
    assert gr.MEASURED_JSON in evidence
    # custom all-reduce alone is silent: the measured choice turns it off (host.json)
    custom = child(tmp_path, {"communication": {"disable_custom_all_reduce": False}})
    assert RULE not in {f.id for f in diagnose(custom, facts)}
    # the driver reads ok, the profile disables P2P: measured right, not "needless"
    no_p2p = child(tmp_path, {"env": {"NCCL_P2P_DISABLE": "1"},
                              "communication": {"insist": "reproducing a report"}})
    ids = {f.id for f in diagnose(no_p2p, facts)}
    assert "nccl-p2p-disabled-needlessly" not in ids
    assert "nccl-p2p-disabled-needlessly" in {
        f.id for f in diagnose(no_p2p, HostFacts.from_dict(_document(None)))}


def test_slower_p2p_says_so_with_both_figures(tmp_path):
    from gpuserve.measure import gate_runs as gr

    ev = _evaluation("ok", {"p2p_on": OFF_TXT, "p2p_off": OFF_TXT,
                            "matrix": "p2p_bw_full_composed.txt"})
    facts = HostFacts.from_dict(_document(gr.measured_json(ev, "fp1")))
    assert facts.measured.p2p_result == "slower"
    ipc = child(tmp_path, {"communication": {"pcie_ipc_allreduce": True}})
    evidence = {f.id: f.evidence for f in diagnose(ipc, facts)}[RULE]
    assert evidence.startswith("PCIe-IPC all-reduce with tp 8")
    assert "not measured working and faster" in evidence


def test_below_expectation_is_a_warning_with_the_numbers(tmp_path):
    from gpuserve.measure import gate_runs as gr

    texts = {"p2p_off": OFF_TXT, "matrix": "p2p_bw_full_composed.txt"}
    first = _evaluation("none", texts, virtualization="kvm")
    slow = _evaluation("none", texts, virtualization="kvm", records=[first.record], slow=2)
    assert not slow.ready
    facts = HostFacts.from_dict(_document(gr.measured_json(slow, "fp2"),
                                          FIXTURES / "hostfacts" / "reference-box-kvm.json"))
    m = facts.measured
    assert m.all_reduce_status == "fail" and m.all_reduce_busbw_gbs == 12.9
    assert m.all_reduce_expected_gbs == 25.81 and m.all_reduce_limit_gbs == pytest.approx(
        18.067)
    profile = load_profile(PROFILES_DIR / "glm5-nvfp4-tp8.yaml")
    found = {f.id: f for f in diagnose(profile, facts)}["measured-below-expectation"]
    assert found.severity == "warn"
    assert "all_reduce_busbw@2147483648: 12.9 GB/s vs baseline 25.81 GB/s" in found.evidence
    assert "below the limit" in found.evidence and "all_reduce_latency@1024" in found.evidence
    assert "class pcie-no-p2p, NCCL env NCCL_P2P_DISABLE=1" in found.evidence
    # the same host measured as before: nothing to say
    ok = HostFacts.from_dict(_document(gr.measured_json(first, "fp1"),
                                       FIXTURES / "hostfacts" / "reference-box-kvm.json"))
    assert "measured-below-expectation" not in {f.id for f in diagnose(profile, ok)}


def test_a_host_not_ready_is_below_expectation_too():
    from gpuserve.measure import gate_runs as gr

    ev = _evaluation("none", {"p2p_off": "all_reduce_pro6000x7_missing_gpu_composed.txt",
                              "matrix": "p2p_bw_full_composed.txt"}, virtualization="kvm")
    facts = HostFacts.from_dict(_document(gr.measured_json(ev, "fp1"),
                                          FIXTURES / "hostfacts" / "reference-box-kvm.json"))
    profile = load_profile(PROFILES_DIR / "glm5-nvfp4-tp8.yaml")
    found = {f.id: f.evidence for f in diagnose(profile, facts)}
    assert "gpus_present: 7 of the host's 8 GPUs took part" in found[
        "measured-below-expectation"]


def test_no_measurement_or_a_stale_one_is_said():
    profile = load_profile(PROFILES_DIR / "glm5-nvfp4-tp8.yaml")
    none = HostFacts.from_dict(_document(None))
    found = {f.id: f for f in diagnose(profile, none)}["gates-not-measured"]
    assert found.severity == "info"
    assert "no measured.json on a host with 8 GPUs" in found.evidence
    assert "driver's P2P verdict (ok)" in found.evidence
    # a document without the section (older, or written by hand) says nothing
    assert "gates-not-measured" not in {f.id for f in diagnose(profile, facts_with(None))}
    # measured under verdict none (the box was a VM then), the driver says ok now
    stale = facts_with({"state": "measured", "p2p": False, "driver_p2p": "none",
                        "record": "/etc/gpuserve/measured.json"})
    evidence = {f.id: f.evidence for f in diagnose(profile, stale)}["gates-not-measured"]
    assert "measured under driver P2P verdict none, the driver now reports ok" in evidence
    current = facts_with({"state": "measured", "p2p": False, "driver_p2p": "ok"})
    assert "gates-not-measured" not in {f.id for f in diagnose(profile, current)}


def test_measured_section_fields_are_checked():
    for bad, field in (({"state": "maybe"}, "measured.state"),
                       ({"p2p_result": "fast"}, "measured.p2p_result"),
                       ({"env": {"A": 1}}, "measured.env"),
                       ({"problems": "x"}, "measured.problems"),
                       ({"failed": [{"check": "x"}]}, r"measured.failed\[0\]")):
        doc = json.loads(BARE.read_text())
        doc["measured"] = bad
        with pytest.raises(InputError, match=f"x.json: {field}"):
            HostFacts.from_dict(doc, "x.json")
