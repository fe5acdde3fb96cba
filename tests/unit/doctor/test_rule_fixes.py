"""Every doctor rule's fix, on every shipped SGLang version, names only flags and choices
that version has: what it sets (``sets``: profile field and value, rendered through the
dialect and judged by the version's flag catalog from the real wheel), the flags its text
names (present in the catalog, or removed by it: ``drops``) and the profile fields its text
names (the version has them, or the fix turns them off). The bug this guards: on the
0.5.10.post1 lane dsa-backend-sm120 recommended flashinfer_sparse_mla, a choice that
version's --nsa-*-backend does not have (``gpuserve render`` refuses it).
"""

from __future__ import annotations

import re

import pytest

from gpuserve.doctor.rules import diagnose, load_rules
from gpuserve.launch.catalog import available_versions, load_catalog
from gpuserve.launch.dialect import load_dialect
from gpuserve.memory.memory_defaults import KNOWN_VERSIONS
from tests.unit.doctor.test_doctor import REF, child, facts

FLAG_RE = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
FIELD_RE = re.compile(
    r"\b((?:memory|attention|moe|communication|parallel|speculative)\.[a-z0-9_]+)")
CASES = [(m.id, v) for m in load_rules() for v in available_versions()]
#: Every flag some shipped version has: a fix naming one of these names SGLang's.
SGLANG_FLAGS = frozenset().union(*(load_catalog(v).flags for v in available_versions()))


def _rule_of(field: str, version: str):
    """The dialect's rule for ``field`` on ``version``; None when the version lacks it."""
    rule = next((r for r in load_dialect()[field] if r.applies(version)), None)
    return None if rule is None or rule.absent else rule


def _problems(rule_id: str, version: str) -> list[str]:
    meta = next(m for m in load_rules() if m.id == rule_id).for_version(version)
    catalog, fields, out = load_catalog(version), load_dialect(), []
    for item in meta.sets:
        field, value = item["field"], item.get("value")
        if field not in fields:
            out.append(f"sets {field}: no such profile field")
            continue
        rule = _rule_of(field, version)
        if rule is None or rule.kind in ("env", "none"):
            if rule is None and value not in (False, None):
                out.append(f"sets {field} = {value}: SGLang {version} has no such setting")
            continue
        if not catalog.has_flag(rule.flag):
            out.append(f"sets {field}: {rule.flag} not in the {version} catalog")
        elif rule.kind == "value" and value is not None:
            try:
                catalog.validate([rule.flag, str(value), *rule.also])
            except Exception as exc:  # the catalog's own argparse verdict
                out.append(f"sets {field} = {value}: {exc}")
        if value is not None and str(value).lower() not in meta.fix.lower():
            out.append(f"sets {field} = {value}, which the fix text does not say")
    for flag in FLAG_RE.findall(meta.fix):  # SGLang's flags; deploy/host.py --data is not
        if flag in SGLANG_FLAGS and flag not in meta.drops and not catalog.has_flag(flag):
            out.append(f"fix names {flag}, not in the {version} catalog")
    named = {item["field"] for item in meta.sets}
    for field in FIELD_RE.findall(meta.fix):
        if field not in fields:
            out.append(f"fix names {field}: no such profile field")
        elif field not in named and _rule_of(field, version) is None:
            out.append(f"fix names {field}, which SGLang {version} lacks")
    return out


def test_every_shipped_version_is_walked():
    assert set(KNOWN_VERSIONS) <= set(available_versions())
    assert len(CASES) == len(load_rules()) * len(available_versions())


@pytest.mark.parametrize(("rule_id", "version"), CASES)
def test_a_rule_fix_names_only_what_the_version_has(rule_id, version):
    assert _problems(rule_id, version) == []


def test_the_walk_catches_a_choice_the_version_lacks():
    """The old dsa-backend-sm120 fix (flashinfer_sparse_mla everywhere) fails the walk on
    0.5.10.post1 only: the check is not vacuous."""
    meta = next(m for m in load_rules() if m.id == "dsa-backend-sm120")
    newest = meta.for_version("0.5.23")
    assert any(s.get("value") == "flashinfer_sparse_mla" for s in newest.sets)
    old = load_catalog("0.5.10.post1")
    with pytest.raises(Exception, match="flashinfer_sparse_mla"):
        old.validate(["--nsa-prefill-backend", "flashinfer_sparse_mla"])
    assert old.validate(["--nsa-prefill-backend", "trtllm"]) is not None
    assert meta.for_version("0.5.10.post1").sets != newest.sets


def _bare(tmp_path, lane: str, **attention):
    body = {"sglang_versions": [lane],
            "attention": {"dsa_prefill_backend": None, "dsa_decode_backend": None,
                          **attention}}
    return child(tmp_path, "glm5-nvfp4-tp8", body)


def _finding(profile, version: str):
    return next((f for f in diagnose(profile, facts(REF), version)
                 if f.id == "dsa-backend-sm120"), None)


def test_dsa_backend_sm120_knows_the_lane(tmp_path):
    """trtllm on the CUDA 12 lane is the field notes' fix (no warning there); on 0.5.23 it
    is the backend SM120 cannot run. Unset on the old lane: pin trtllm, or move up."""
    trtllm = _bare(tmp_path, "0.5.10.post1", dsa_prefill_backend="trtllm",
                   dsa_decode_backend="trtllm")
    assert _finding(trtllm, "0.5.10.post1") is None
    on_new = _finding(trtllm, "0.5.23")
    assert on_new is not None and "flashinfer_sparse_mla" in on_new.fix
    unset = _finding(_bare(tmp_path, "0.5.10.post1"), "0.5.10.post1")
    assert unset is not None and "trtllm" in unset.fix and "0.5.19+" in unset.fix
    fa3 = _finding(_bare(tmp_path, "0.5.10.post1", dsa_decode_backend="fa3"), "0.5.10.post1")
    assert fa3 is not None and "fa3 on SM120 with SGLang 0.5.10.post1" in fa3.evidence
