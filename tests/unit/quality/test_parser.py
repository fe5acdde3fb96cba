"""gpuserve.quality.parser on replies shaped like SGLang 0.5.x's /generate (fixtures and
their sources: fixtures/SOURCE.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpuserve.quality.parser import (
    MAX_POSITIONS,
    QualityParseError,
    forced_top,
    parse_completion_logprobs,
    parse_generate,
)

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def test_greedy_reply_gives_ids_finish_and_prompt_ids():
    gen = parse_generate(load("generate_greedy.json"))
    assert gen.output_ids == (12095, 13, 1084, 374, 279, 7772, 3283, 304)
    assert gen.finish_type == "length" and gen.completion_tokens == 8
    assert gen.input_ids == (785, 6722, 315, 9625, 374)
    assert gen.input_logprobs[0] is None  # SGLang pads the first input position
    assert gen.output_logprobs[0] == pytest.approx(-0.011)
    assert gen.spec_verify_ct is None


def test_forced_reply_reads_the_forced_positions_only():
    gen = parse_generate(load("generate_forced.json"))
    tops = forced_top(gen, 4)
    assert len(tops) == 4
    assert list(tops[0]) == [12095, 279, 264]  # the first forced token's distribution
    assert tops[3][374] == pytest.approx(-0.05)


def test_orjson_null_logprob_is_nan():
    gen = parse_generate(load("generate_nan.json"))
    assert [math.isnan(v) for v in gen.output_logprobs] == [False] * 3 + [True] * 3


def test_spec_verify_count_is_read():
    gen = parse_generate(load("generate_spec.json"))
    assert gen.spec_verify_ct == 29 and gen.completion_tokens == 32
    assert gen.finish_type == "stop"


def test_abort_finish_type():
    gen = parse_generate(load("generate_abort.json"))
    assert gen.finish_type == "abort" and gen.output_ids == ()


@pytest.mark.parametrize("body, words", [
    ("<html>502 Bad Gateway</html>", "not a JSON object"),
    ({"text": "x"}, "no meta_info"),
    ({"meta_info": {"output_token_logprobs": [["a", 1, None]]}}, "must be a number"),
    ({"meta_info": {"output_token_logprobs": [[-1.0, -3, None]]}}, "token id"),
    ({"meta_info": {"completion_tokens": "8"}}, "integer"),
    ({"meta_info": {"output_top_logprobs": [[[-1.0, 1, None]] * 65]}}, "at most 64"),
])
def test_wrong_shapes_are_named(body, words):
    with pytest.raises(QualityParseError, match=words):
        parse_generate(body)


def test_too_many_positions_is_refused():
    body = {"meta_info": {"output_token_logprobs": [[-1.0, 1, None]] * (MAX_POSITIONS + 1)}}
    with pytest.raises(QualityParseError, match="positions"):
        parse_generate(body)


def test_openai_completion_logprobs():
    body = {"choices": [{"text": " Paris", "finish_reason": "length",
                         "logprobs": {"tokens": [" Paris"], "token_logprobs": [-0.01, None],
                                      "top_logprobs": [{" Paris": -0.01}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    gen = parse_completion_logprobs(body)
    assert gen.finish_type == "length" and gen.completion_tokens == 2
    assert math.isnan(gen.output_logprobs[1])
