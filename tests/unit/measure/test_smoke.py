"""Smoke record: token counts from real completion replies, speed math, the output line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.measure.smoke import SmokeError, parse_completion, parse_smoke_output, smoke_line

RESP = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_responses"


def body(name: str) -> dict:
    doc = json.loads((RESP / name).read_text())
    assert doc.pop("_source").count("https://") >= 1
    return doc


def test_openai_completion_object() -> None:
    r = parse_completion("/v1/completions", body("openai_completion.json"), 0.5)
    assert (r.completion_tokens, r.prompt_tokens, r.text) == (6, 5, "\n\nThis is a test")
    assert r.tokens_per_s == pytest.approx(12.0)


def test_sglang_usage_block() -> None:
    r = parse_completion("/v1/completions", body("sglang_usage_pr10925.json"), 0.2)
    assert (r.completion_tokens, r.prompt_tokens) == (4, 516)
    assert r.tokens_per_s == pytest.approx(20.0)


def test_generate_meta_info() -> None:
    reply = {"text": " Paris.", "meta_info": {"prompt_tokens": 6, "completion_tokens": 64}}
    r = parse_completion("/generate", reply, 2.0)
    assert r.tokens_per_s == pytest.approx(32.0)


def test_smoke_line_format() -> None:
    r = parse_completion("/generate", {"text": "x", "meta_info": {"completion_tokens": 64}}, 1.9)
    assert smoke_line("lab-gpu", r, "glm-5", "glm5-nvfp4-tp8") == (
        "lab-gpu: smoke: 64 tokens in 1.9 s = 33.7 tok/s (glm-5, profile glm5-nvfp4-tp8)"
    )


def script_out(**kw) -> str:
    doc = {"endpoint": "/v1/completions", "status": 200, "elapsed_s": 0.5,
           "body": body("openai_completion.json")}
    doc.update(kw)
    return json.dumps(doc)


def test_parse_script_output() -> None:
    assert parse_smoke_output(script_out()).completion_tokens == 6


@pytest.mark.parametrize(
    ("out", "needle"),
    [
        (script_out(status=401, body={"error": "Unauthorized"}), "HTTP 401"),
        (script_out(status=None, body=None, error="URLError: refused"), "refused"),
        (script_out(body={"usage": {}}), "no token counts"),
        (script_out(body={"choices": [{"text": ""}], "usage": {"completion_tokens": 0}}),
         "no tokens"),
        ("not json", "unreadable"),
        (None, "printed nothing"),  # pyinfra's default for a fact with no output
        ("", "printed nothing"),
    ],
)
def test_failures_are_errors_with_the_reason(out: str, needle: str) -> None:
    with pytest.raises(SmokeError, match=needle):
        parse_smoke_output(out)


def test_zero_elapsed_is_rejected() -> None:
    with pytest.raises(SmokeError):
        parse_completion("/v1/completions", body("openai_completion.json"), 0.0)
