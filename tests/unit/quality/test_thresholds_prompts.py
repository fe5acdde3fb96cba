"""The profile's quality block and the shipped prompt set."""

from __future__ import annotations

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.quality_spec import QualitySpec, parse_quality
from gpuserve.quality.prompts import answer_value, arithmetic_items, load_prompts


def err(dotted: str, message: str) -> InputError:
    return InputError("profiles/x.yaml", dotted, message)


def test_defaults_and_overrides():
    assert parse_quality(None, err) == QualitySpec()
    spec = parse_quality({"kld_p99_max": 0.5, "reference": True}, err)
    assert spec.kld_p99_max == 0.5 and spec.reference


@pytest.mark.parametrize("data, field, words", [
    ({"kld_p99": 1}, "quality.kld_p99", "unknown key"),
    ({"kld_mean_max": -1}, "quality.kld_mean_max", "> 0"),
    ({"greedy_agreement_min": 2}, "quality.greedy_agreement_min", r"\[0, 1\]"),
    ({"top_k": 0}, "quality.top_k", "integer"),
    ({"check": "yes"}, "quality.check", "true or false"),
    ({"expected_accept_length": 0.5}, "quality.expected_accept_length", ">= 1"),
    ([1], "quality", "mapping"),
])
def test_bad_quality_blocks_name_the_field(data, field, words):
    with pytest.raises(InputError, match=words) as e:
        parse_quality(data, err)
    assert e.value.field == field


def test_shipped_prompt_set():
    prompts = load_prompts(32)
    kinds = [p.kind for p in prompts]
    assert kinds.count("completion") >= 24 and kinds.count("gsm8k") == 20
    assert kinds.count("arithmetic") == 40
    gsm = [p for p in prompts if p.kind == "gsm8k"]
    assert gsm[0].answer == "64" and gsm[0].text.count("Question:") == 6  # 5 shots + 1


def test_arithmetic_answers_are_right():
    for q, a in arithmetic_items(50):
        x, op, y = q.removeprefix("What is ").removesuffix("?").split()
        assert eval(f"{x}{op}{y}") == a and 0 <= a < 200  # noqa: S307 - digits only


def test_answer_value_takes_the_last_integer():
    assert answer_value("so 1,150 x 50 = 57,500 dollars") == "57500"
    assert answer_value("no number") is None
