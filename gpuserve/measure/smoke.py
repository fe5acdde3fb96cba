"""Smoke completion record: did the server generate, and how fast.

Why: ``/health`` proves the server is up; only a real completion proves that the model
produces tokens at a plausible speed. The request runs on the host (script
``data/scripts/sglang_smoke.py``, so no port must be open to the controller and the API
key never leaves the host); this module turns its raw reply into one record and one
line a person can read.

Tokens per second here is end-to-end: completion tokens over the wall time of the one
request, prefill included. It is a smoke figure, not a benchmark (that is ``bench/``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace


class SmokeError(ValueError):
    """The smoke request failed or its reply is not a completion."""


@dataclass(frozen=True)
class SmokeResult:
    endpoint: str
    completion_tokens: int
    prompt_tokens: int | None
    elapsed_s: float
    text: str
    # the unit's InvocationID when the health probe made the completion: which start of
    # the server this measured (None from the smoke script alone, or unreadable)
    server_start: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s


def parse_completion(endpoint: str, body: dict, elapsed_s: float) -> SmokeResult:
    """Read token counts from a completion reply.

    ``/v1/completions`` follows the OpenAI schema: ``usage.completion_tokens`` and
    ``choices[0].text`` (https://platform.openai.com/docs/api-reference/completions/object).
    SGLang's native ``/generate`` puts them in ``meta_info.completion_tokens`` and
    ``text`` (https://docs.sglang.io/basic_usage/native_api.html).
    """
    if elapsed_s <= 0:
        raise SmokeError(f"elapsed time must be positive, got {elapsed_s}")
    try:
        if endpoint == "/v1/completions":
            usage = body["usage"]
            tokens = int(usage["completion_tokens"])
            prompt = usage.get("prompt_tokens")
            text = body["choices"][0]["text"]
        elif endpoint == "/generate":
            meta = body["meta_info"]
            tokens = int(meta["completion_tokens"])
            prompt = meta.get("prompt_tokens")
            text = body["text"]
        else:
            raise SmokeError(f"unknown smoke endpoint {endpoint!r}")
    except (KeyError, IndexError, TypeError, ValueError) as e:
        if isinstance(e, SmokeError):
            raise
        raise SmokeError(f"{endpoint} reply has no token counts ({e!r}): {str(body)[:200]}") from e
    if tokens <= 0:
        raise SmokeError(f"{endpoint} generated no tokens")
    return SmokeResult(endpoint, tokens, int(prompt) if prompt is not None else None,
                       float(elapsed_s), str(text))


def parse_smoke_output(stdout: str) -> SmokeResult:
    """Parse the host script's JSON line: ``{"endpoint", "status", "elapsed_s", "body"}``."""
    if not stdout:  # pyinfra gives a fact's default (None) when the command printed nothing
        raise SmokeError("the smoke script printed nothing (is python3 on the host?)")
    try:
        doc = json.loads(stdout)
        endpoint = doc["endpoint"]
        status = doc["status"]
        elapsed = float(doc["elapsed_s"])
        body = doc["body"]
    except (ValueError, KeyError, TypeError) as e:
        raise SmokeError(f"unreadable smoke output ({e}): {stdout[:200]!r}") from e
    if status != 200:
        detail = doc.get("error") or str(body)[:300]
        raise SmokeError(f"{endpoint} answered HTTP {status}: {detail}")
    if not isinstance(body, dict):
        raise SmokeError(f"{endpoint} reply is not a JSON object: {str(body)[:200]}")
    result = parse_completion(endpoint, body, elapsed)
    start = server_start(doc.get("start"))
    return result if start is None else replace(result, server_start=start)


#: systemd's InvocationID: 128 bits as 32 lower-case hex digits (sd_id128_to_string)
_INVOCATION = re.compile(r"[0-9a-f]{32}")


def server_start(value: object) -> str | None:
    """A unit start's InvocationID as the host sent it, or None when it is not one."""
    return value if isinstance(value, str) and _INVOCATION.fullmatch(value) else None


def same_start(stdout: str | None) -> str | None:
    """The InvocationID of the probe's ``{"same_start": ID}`` line: the server still
    runs the start the newest smoke record measured, so no completion was made; None
    for any other line."""
    try:
        doc = json.loads(stdout or "")
    except ValueError:
        return None
    return server_start(doc.get("same_start")) if isinstance(doc, dict) else None


def smoke_line(host: str, result: SmokeResult, model: str, profile: str) -> str:
    """``gpu1: smoke: 64 tokens in 1.9 s = 33.7 tok/s (glm-5, profile glm5-nvfp4-tp8)``."""
    return (
        f"{host}: smoke: {result.completion_tokens} tokens in {result.elapsed_s:.1f} s"
        f" = {result.tokens_per_s:.1f} tok/s ({model}, profile {profile})"
    )
