"""deepep-needs-nvlink: DeepEP on a box without NVLink or working P2P is a doctor error
naming the host's verdict, and the serve preflight and the tuner's judge act on it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.doctor.rules import diagnose
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.lock_choice import HostRuntime, PreflightError
from gpuserve.launch.profiles import load_profile
from gpuserve.tune.judge import judge
from gpuserve.tune.snapshot import HostSnapshot
from tests.serve_plans import plan_of

REPO = Path(__file__).resolve().parents[3]
HOSTFACTS = REPO / "tests/fixtures/hostfacts"
BOX = json.loads((HOSTFACTS / "reference-box-kvm.json").read_text())
DEEPEP = REPO / "tests/fixtures/profiles/doctor-deepep-ep8.yaml"
DEEPEP_H200 = REPO / "tests/fixtures/profiles/doctor-deepep-h200.yaml"
RULE = "deepep-needs-nvlink"


def findings(profile, facts: dict) -> dict:
    return {f.id: f for f in diagnose(load_profile(str(profile)), HostFacts.from_dict(facts))}


def test_doctor_cli_exits_non_zero_with_the_error_on_the_reference_box(capsys):
    rc = main(["doctor", "--profile", str(DEEPEP), "--facts",
               str(HOSTFACTS / "reference-box-kvm.json")])
    out = capsys.readouterr().out
    assert rc == 1
    line = next(x for x in out.splitlines() if RULE in x)
    assert line.startswith("ERROR")
    # the host's verdicts: the links topo -m reported, the VM, the driver's P2P verdict
    assert "joined by PHB, no NVLink in a kvm guest" in out
    assert "topo -p2p verdict none" in out


def test_the_measured_verdict_is_named_when_the_host_was_measured():
    facts = copy.deepcopy(BOX)
    facts["measured"] = {"p2p": False, "p2p_result": "not_measured", "driver_p2p": "none",
                         "record": "/etc/gpuserve/measured.json"}
    f = findings(DEEPEP, facts)[RULE]
    assert f.severity == "error"
    assert "measured P2P: P2P was not measured (driver verdict none, or a VM)" in f.evidence
    assert "/etc/gpuserve/measured.json" in f.evidence
    # P2P measured working: DeepEP's peer access is there, no error
    facts["measured"].update(p2p=True, p2p_result="ok")
    assert RULE not in findings(DEEPEP, facts)


def test_nvlink_box_and_other_backends_stay_silent():
    h200 = json.loads((HOSTFACTS / "h200-nvlink.json").read_text())
    assert RULE not in findings(DEEPEP_H200, h200)
    # the same DeepEP profile on the PCIe box: the error, so the rule reads the facts
    assert RULE in findings(DEEPEP_H200, BOX)
    # the shipped EP8 profile (flashinfer all-to-all) is not DeepEP
    assert RULE not in findings("glm5-nvfp4-tp8-ep8", BOX)
    # links unknown (no topo -m): an unknown fact never fires
    unknown = copy.deepcopy(BOX)
    unknown["topology"]["links"] = None
    assert RULE not in findings(DEEPEP, unknown)


def runtime(home):
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8,
                       gpu_list=tuple(BOX["gpus"]))


def test_serve_preflight_refuses_it_before_any_change():
    with pytest.raises(PreflightError, match=f"doctor error {RULE}: moe.a2a_backend deepep"):
        plan_of({"profile": str(DEEPEP)}, "inv.py", runtime, host_facts=lambda: BOX)


def test_tuner_judge_prunes_it():
    snapshot = HostSnapshot(host="gpu1", sglang_version="0.5.23", lock="l", gpus=BOX["gpus"],
                            checkpoint=None, host_facts=BOX, host_json=None)
    verdict = judge(load_profile(str(DEEPEP)), None, snapshot, calibration_gib=None,
                    comm=None, peak_batch=1)
    assert verdict.pruned is not None and verdict.pruned.startswith(f"doctor {RULE}: ")
    assert "fix: set moe.a2a_backend flashinfer" in verdict.pruned
