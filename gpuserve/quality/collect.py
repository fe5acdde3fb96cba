"""The host side's request list and the reading of what it brought back.

The host script (``data/scripts/sglang_quality.py``, stdlib only) is transport: it sends
the prompts in batches (SGLang's batch form of ``/generate``) greedily, then, for
completion prompts, once more with ``input_ids`` = the prompt's ids + the forced
continuation (the reference's, or its own for a new reference) and ``logprob_start_len``
= prompt length - 1, keeping only the reply fields the parser reads, one result per
prompt. Everything is judged here, from
the real reply shapes (gpuserve/quality/parser.py). Bounded on both sides: a capped
prompt count, request spec size, reply size and wall time.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping, Sequence

from gpuserve.quality.metrics import first_non_finite, non_finite
from gpuserve.quality.parser import Generation, QualityParseError, forced_top, parse_generate
from gpuserve.quality.prompts import Prompt
from gpuserve.quality.record import PromptResult

#: the request spec travels on the command line: well under Linux's 128 KiB per argument
MAX_SPEC_CHARS = 96_000
#: what the controller accepts back (the script caps each reply at 4 MiB too)
MAX_OUTPUT_CHARS = 32 * 1024 * 1024


class QualityRunError(ValueError):
    """The check could not be made (no answer, garbage, over its limits)."""


def request_spec(prompts: Sequence[Prompt], top_k: int, timeout_s: float,
                 forced: Mapping[str, Sequence[int]] | None = None) -> str:
    """The host script's ``--spec``: zlib-compressed, base64 JSON of the prompts (the
    few-shot heads repeat, so it compresses well). ``forced``: the reference's greedy
    ids per completion prompt; absent, a completion prompt is forced on its own reply."""
    items = []
    for p in prompts:
        item: dict = {"id": p.id, "text": p.text, "max_new": p.max_new_tokens,
                      "stop": list(p.stop), "teacher": p.kind == "completion"}
        if p.kind == "completion" and forced and p.id in forced:
            item["forced"] = list(forced[p.id])
        items.append(item)
    doc = json.dumps({"top_k": top_k, "timeout_s": timeout_s, "prompts": items},
                     separators=(",", ":"))
    spec = base64.b64encode(zlib.compress(doc.encode(), 9)).decode()
    if len(spec) > MAX_SPEC_CHARS:
        raise QualityRunError(f"the prompt set is too large to send ({len(spec)} chars "
                              f"compressed, limit {MAX_SPEC_CHARS}): use fewer prompts")
    return spec


def _result(prompt: Prompt, item: Mapping) -> PromptResult:
    out = PromptResult(id=prompt.id, kind=prompt.kind, answer=prompt.answer)
    if item.get("error") or item.get("status") != 200:
        out.error = str(item.get("error") or f"HTTP {item.get('status')}")[:300]
        return out
    try:
        gen: Generation = parse_generate(item.get("body"))
    except QualityParseError as e:
        out.error = f"reply: {e}"[:300]
        return out
    out.output_ids, out.text, out.finish = list(gen.output_ids), gen.text[:2000], gen.finish_type
    out.completion_tokens, out.verify_ct = gen.completion_tokens, gen.spec_verify_ct
    out.non_finite = non_finite(gen.output_logprobs)
    out.first_non_finite = first_non_finite(gen.output_logprobs)
    out.prompt_ids = list(gen.input_ids)
    forced_item = item.get("forced")
    if isinstance(forced_item, Mapping):
        _add_forced(out, forced_item)
    return out


def _add_forced(out: PromptResult, item: Mapping) -> None:
    """The teacher-forced pass's distributions (``count`` forced tokens)."""
    if item.get("error") or item.get("status") != 200:
        out.error = "teacher-forced pass: " + str(item.get("error") or f"HTTP {item.get('status')}")
        return
    try:
        gen = parse_generate(item.get("body"))
    except QualityParseError as e:
        out.error = f"teacher-forced reply: {e}"[:300]
        return
    count = int(item.get("count") or 0)
    tops = forced_top(gen, count)
    out.forced = [None if t is None else [[tid, lp] for tid, lp in t.items()] for t in tops]
    out.non_finite += sum(non_finite(t.values()) for t in tops if t)


def read_output(stdout: str | None, prompts: Sequence[Prompt]) -> tuple[list[PromptResult], float]:
    """The host script's one JSON document -> one result per prompt, and the elapsed
    seconds; a missing, huge or garbled document is a :class:`QualityRunError`."""
    if not stdout:
        raise QualityRunError("the quality script printed nothing (is python3 on the host?)")
    if len(stdout) > MAX_OUTPUT_CHARS:
        raise QualityRunError(f"the quality script's output is {len(stdout)} chars, "
                              f"more than {MAX_OUTPUT_CHARS}")
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise QualityRunError(f"the quality script's output is not JSON: {stdout[:200]!r}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise QualityRunError(f"the quality script's output has no results: {stdout[:200]!r}")
    if doc.get("error"):
        raise QualityRunError(f"the quality check did not run: {str(doc['error'])[:300]}")
    by_id = {r.get("id"): r for r in doc["results"] if isinstance(r, dict)}
    results = [_result(p, by_id.get(p.id) or {"error": "no reply (the check ran out of time)"})
               for p in prompts]
    return results, float(doc.get("elapsed_s") or 0.0)
