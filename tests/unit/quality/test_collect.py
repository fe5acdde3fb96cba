"""gpuserve.quality.collect: the host script's document -> per-prompt results, from the
composed /generate replies in fixtures/ (SOURCE.md)."""

from __future__ import annotations

import base64
import json
import random
import zlib
from pathlib import Path

import pytest

from gpuserve.quality.collect import QualityRunError, read_output, request_spec
from gpuserve.quality.prompts import Prompt

FIX = Path(__file__).parent / "fixtures"
P = Prompt(id="completion-0", kind="completion", text="The capital of France is",
           max_new_tokens=8)


def body(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def doc(*results: dict, **extra) -> str:
    return json.dumps({"elapsed_s": 0.5, "results": list(results), **extra})


def test_greedy_and_forced_replies_become_one_result():
    out, elapsed = read_output(doc({"id": P.id, "status": 200, "body": body("generate_greedy.json"),
                                    "forced": {"status": 200, "count": 4,
                                               "body": body("generate_forced.json")}}), [P])
    r = out[0]
    assert elapsed == 0.5 and r.error is None and r.finish == "length"
    assert r.prompt_ids == [785, 6722, 315, 9625, 374]
    assert [t[0][0] for t in r.forced] == [12095, 13, 1084, 374]
    assert r.non_finite == 0


def test_nan_reply_counts_and_locates_non_finite_logprobs():
    out, _ = read_output(doc({"id": P.id, "status": 200, "body": body("generate_nan.json")}), [P])
    assert (out[0].non_finite, out[0].first_non_finite) == (3, 3)


def test_a_prompt_without_reply_is_an_error_not_a_pass():
    out, _ = read_output(doc(), [P])
    assert "ran out of time" in out[0].error


def test_http_error_and_garbage_bodies_are_request_errors():
    out, _ = read_output(doc({"id": P.id, "status": 500, "body": "oops"}), [P])
    assert out[0].error == "HTTP 500"
    out, _ = read_output(doc({"id": P.id, "status": 200, "body": "<html>"}), [P])
    assert "not a JSON object" in out[0].error


@pytest.mark.parametrize("stdout, words", [
    ("", "printed nothing"),
    ("Traceback (most recent call last)", "not JSON"),
    ('{"results": 3}', "no results"),
    ('{"results": [], "error": "connection refused"}', "did not run"),
])
def test_unusable_script_output_is_a_clear_failure(stdout, words):
    with pytest.raises(QualityRunError, match=words):
        read_output(stdout, [P])


def test_request_spec_round_trips_and_carries_forced_ids():
    spec = request_spec([P], top_k=10, timeout_s=60, forced={P.id: [1, 2, 3]})
    doc_ = json.loads(zlib.decompress(base64.b64decode(spec)))
    assert doc_["prompts"][0]["forced"] == [1, 2, 3] and doc_["top_k"] == 10


def test_request_spec_is_bounded():
    rng = random.Random(7)  # incompressible text
    big = [Prompt(id=f"p{i}", kind="completion", max_new_tokens=8,
                  text=base64.b64encode(rng.randbytes(2000)).decode()) for i in range(60)]
    with pytest.raises(QualityRunError, match="too large"):
        request_spec(big, 10, 60)
