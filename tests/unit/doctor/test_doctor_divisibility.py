"""Doctor rules ep-experts-divisible and tp-heads-divisible (gpuserve/doctor/rules.py).

Violating profiles are fixtures (tests/fixtures/profiles/doctor-*.yaml, each says which
assert of SGLang it trips); the shipped profiles must pass on every shipped facts file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.doctor.rules import diagnose
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.profiles import PROFILES_DIR, load_profile

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HOSTFACTS = sorted((FIXTURES / "hostfacts").glob("*.json"))
H200 = FIXTURES / "hostfacts" / "h200-nvlink.json"
RULES = {"ep-experts-divisible", "tp-heads-divisible"}


def findings(profile: Path, facts: Path = H200) -> dict[str, str]:
    host = HostFacts.from_dict(json.loads(facts.read_text()), facts.name)
    return {f.id: f.evidence for f in diagnose(load_profile(profile), host) if f.id in RULES}


def test_redundant_experts_not_dividing_ep_is_an_error():
    found = findings(FIXTURES / "profiles" / "doctor-ep-experts-redundant.yaml")
    assert set(found) == {"ep-experts-divisible"}
    assert "256 routed experts + 4 redundant = 260" in found["ep-experts-divisible"]
    assert "ep 8 leaves 4 over" in found["ep-experts-divisible"]


def test_heads_not_dividing_tp_is_an_error():
    found = findings(FIXTURES / "profiles" / "doctor-tp-heads-llama70b-tp6.yaml")
    assert set(found) == {"tp-heads-divisible"}
    evidence = found["tp-heads-divisible"]
    # the planner's own words (gpuserve.memory.planner.heads_problems): one check
    assert "num_attention_heads 64 do not split over 6 ranks (64 % 6 = 4)" in evidence
    assert "num_key_value_heads 8 do not split over 6 ranks (8 % 6 = 2)" in evidence


def test_attention_dp_shards_heads_over_attention_tp_only():
    # tp 8 / attention_dp 2 = 4 attention ranks: 64 heads and 4 KV heads both fit.
    assert findings(FIXTURES / "profiles" / "doctor-tp-heads-attn-dp.yaml") == {}


def test_cli_exits_nonzero_with_evidence(capsys):
    rc = main(["doctor", "--profile",
               str(FIXTURES / "profiles" / "doctor-ep-experts-redundant.yaml"),
               "--facts", str(H200)])
    out = capsys.readouterr().out
    assert rc != 0
    assert "ep-experts-divisible" in out and "fused_moe_triton/layer.py" in out


@pytest.mark.parametrize("facts", HOSTFACTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("profile", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_profiles_divide_evenly(profile, facts):
    assert findings(profile, facts) == {}
