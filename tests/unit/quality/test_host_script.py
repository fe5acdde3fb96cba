"""The quality check's host script (gpuserve/data/scripts/sglang_quality.py) against a
local HTTP server that answers like SGLang's batch ``/generate`` or misbehaves: the
prompts go in bounded batches, each answer is validated, and a garbage, short, huge or
silent answer ends as a named error per prompt, never a pass and never a hang.

The good answers are shaped like the toy model's (lab/sglang_standin, itself shaped
like tokenizer_manager.py's ``_handle_batch_output``: docs/quality.md); the server here
only echoes, so what is asserted is the transport.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuserve import paths
from gpuserve.quality.collect import read_output, request_spec
from gpuserve.quality.prompts import Prompt

SCRIPT = paths.SCRIPTS_DIR / "sglang_quality.py"


def _answer(prompt_len: int, new: int) -> dict:
    ids = list(range(100, 100 + new))
    return {"text": " x" * new, "output_ids": ids, "meta_info": {
        "finish_reason": {"type": "length", "length": new}, "prompt_tokens": prompt_len,
        "completion_tokens": new, "output_token_logprobs": [[-0.5, t, None] for t in ids],
        "input_token_logprobs": [[None, 7, None]] + [[-1.0, 7 + i, None]
                                                    for i in range(1, prompt_len)],
        "input_top_logprobs": [None] + [[[-0.1, 1, None]] for _ in range(1, prompt_len)]}}


class Fake:
    """A server answering every POST by ``mode``; records the request bodies."""

    def __init__(self, mode: str) -> None:
        self.mode, self.bodies = mode, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.bodies.append(body)
                if fake.mode == "silent":
                    time.sleep(30)
                    return
                n = len(body.get("text") or body.get("input_ids"))
                data = fake.reply(body, n)
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def reply(self, body: dict, n: int) -> bytes:
        if self.mode == "garbage":
            return b"<html>upstream crashed</html>"
        if self.mode == "huge":
            return b"[" + b" " * (13 * 1024 * 1024) + b"]"
        if self.mode == "short":
            n -= 1
        lens = [len(x) if isinstance(x, list) else 4 for x in
                (body.get("input_ids") or body.get("text"))]
        news = [1 if body.get("input_ids") else 3] * n
        return json.dumps([_answer(lens[i], news[i]) for i in range(n)]).encode()

    def __enter__(self) -> Fake:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def prompts(n: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", kind="completion" if i % 2 == 0 else "arithmetic",
                   text=f"prompt {i} words", max_new_tokens=3, stop=(), answer=None)
            for i in range(n)]


def run(port: int, ps: list[Prompt], timeout_s: float = 30) -> dict:
    spec = request_spec(ps, 5, timeout_s)
    out = subprocess.run([sys.executable, str(SCRIPT), "--port", str(port), "--spec", spec],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


def test_prompts_go_in_bounded_batches_and_come_back_one_result_each():
    ps = prompts(40)
    with Fake("ok") as fake:
        doc = run(fake.port, ps)
    greedy = [b for b in fake.bodies if "text" in b]
    forced = [b for b in fake.bodies if "input_ids" in b]
    # 40 prompts: batches of at most 32, each forced pass one batch of its completions
    assert sorted(len(b["text"]) for b in greedy) == [8, 32]
    assert sorted(len(b["input_ids"]) for b in forced) == [4, 16]
    assert doc["requests"] == 4
    for b in greedy:  # SGLang's batch form: one sampling_params / start per prompt
        assert len(b["sampling_params"]) == len(b["text"])
        assert b["logprob_start_len"] == [0 if t.split()[1] in
                                          {str(i) for i in range(0, 40, 2)} else -1
                                          for t in b["text"]]
    for b in forced:  # prompt ids (4) + forced ids (3), logprobs from the last prompt id
        assert all(len(ids) == 7 for ids in b["input_ids"])
        assert b["logprob_start_len"] == [3] * len(b["input_ids"])
        assert b["top_logprobs_num"] == 5 and b["sampling_params"]["max_new_tokens"] == 1
    results, _ = read_output(json.dumps(doc), ps)
    assert [r.id for r in results] == [p.id for p in ps]
    assert all(r.error is None for r in results)
    assert all(len(r.forced) == 3 for r in results if r.kind == "completion")


@pytest.mark.parametrize("mode, words", [
    ("garbage", "batch reply is str, not a list of"),
    ("short", "batch reply is a list of 2, not a list of 3 answers"),
    ("huge", "reply larger than"),
])
def test_a_bad_batch_answer_is_an_error_for_each_of_its_prompts(mode, words):
    ps = prompts(3)
    with Fake(mode) as fake:
        doc = run(fake.port, ps)
    results, _ = read_output(json.dumps(doc), ps)
    assert all(r.error and words in r.error for r in results), [r.error for r in results]
    assert len(fake.bodies) == 1  # no forced pass after a failed greedy one


def test_a_server_that_never_answers_ends_at_the_checks_deadline():
    ps = prompts(3)
    t0 = time.monotonic()
    with Fake("silent") as fake:
        doc = run(fake.port, ps, timeout_s=2)
    assert time.monotonic() - t0 < 60
    results, _ = read_output(json.dumps(doc), ps)
    assert all(r.error and "TimeoutError" in r.error for r in results), \
        [r.error for r in results]
