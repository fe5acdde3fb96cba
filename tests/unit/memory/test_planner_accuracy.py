"""Planner accuracy against measured SGLang start-ups (tests/fixtures/memory_cases.jsonl).

Run with ``pytest -s`` to see the per-case table (bench/planner_accuracy.py prints the same).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.memory.planner_cases import evaluate, format_table, load_cases

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def results():
    res = evaluate(FIXTURES / "memory_cases.jsonl", FIXTURES / "memory_cases_inputs.yaml", ROOT)
    print("\n" + format_table(res))
    return res


def test_every_case_is_reported(results):
    ids = [c["id"] for c in load_cases(FIXTURES / "memory_cases.jsonl")]
    assert [r.case_id for r in results] == ids
    for r in results:
        assert r.status == "checked" or r.reason, r.case_id


def test_weights_within_5_percent(results):
    errors = [e for r in results for e in r.errors("weights GiB/GPU")]
    assert errors, "no case with a weights figure was checked"
    assert all(abs(e) <= 0.05 for e in errors), errors


def test_free_after_weights_within_5_percent(results):
    errors = [e for r in results for e in r.errors("free after weights GiB")]
    assert errors
    assert all(abs(e) <= 0.05 for e in errors), errors


def test_kv_tokens_within_10_percent(results):
    errors = [e for r in results for e in r.errors("KV tokens")]
    assert len(errors) >= 3
    assert all(abs(e) <= 0.10 for e in errors), errors


def test_kv_bytes_per_token_within_1_percent(results):
    errors = [e for r in results for e in r.errors("KV B/token")]
    assert len(errors) >= 6
    assert all(abs(e) <= 0.01 for e in errors), errors


def test_excluded_rows_say_why(results):
    for r in results:
        for row in r.rows:
            if row.get("excluded"):
                assert len(row.get("note", "")) > 20
