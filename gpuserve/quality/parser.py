"""Read SGLang's ``/generate`` and ``/v1/completions`` replies into what the quality
metrics need: token ids, per-position logprobs, the top-k distributions, finish reason
and the speculative verify counts. Bounded: positions and top-k entries are capped, and
a reply of the wrong shape is a :class:`QualityParseError` naming the field.

Field shapes, read from sgl-project/sglang ``python/sglang/srt/managers/tokenizer_manager.py``
(the 0.5.x line the project locks, 0.5.19 and 0.5.23):

- ``TokenizerManager._handle_batch_output`` builds ``meta_info`` with ``finish_reason``
  (``BaseFinishReason.to_json``: ``{"type": "length", "length": N}``,
  ``{"type": "stop", "matched": ...}``, ``{"type": "abort", ...}``; ``None`` while
  unfinished), ``prompt_tokens`` and ``completion_tokens``;
- ``add_logprob_to_meta_info`` / ``detokenize_logprob_tokens`` write
  ``input_token_logprobs`` and ``output_token_logprobs`` as ``[logprob, token_id, text]``
  triples (text ``None`` unless ``return_text_in_logprobs``); the first input position
  has logprob ``None`` (no context);
- ``detokenize_top_logprobs_tokens`` writes ``input_top_logprobs`` and
  ``output_top_logprobs`` (only when ``top_logprobs_num > 0``): one list of triples per
  position, or ``None`` for a position without any;
- ``scheduler_output_processor_mixin.py`` ``add_input_logprob_return_values`` pads the
  first input entry with ``None`` and drops the last (the sampled token's), so entry k
  is the token at ``logprob_start_len + k`` given the tokens before it;
- ``_calculate_spec_decoding_metrics`` adds ``spec_verify_ct`` (verify steps), and with
  accepted tokens ``spec_accept_length`` = completion tokens / verify steps.

The request fields (``GenerateReqInput`` in ``io_struct.py``): ``text`` or ``input_ids``,
``sampling_params``, ``return_logprob``, ``logprob_start_len`` (first prompt position
whose logprobs come back), ``top_logprobs_num``.

SGLang answers with ``ORJSONResponse``; orjson writes a NaN or infinite float as
``null``, so a ``null`` logprob where a number belongs is read as NaN (non-finite), and
Python-json ``NaN``/``Infinity`` literals (from another writer) as themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: bounds on one reply (a check asks for far fewer: gpuserve/quality/prompts.py)
MAX_POSITIONS = 4096
MAX_TOP_K = 64

#: one position's top-k distribution: token id -> logprob
TopK = dict[int, float]


class QualityParseError(ValueError):
    """A reply that is not the shape SGLang's code writes."""


@dataclass(frozen=True)
class Generation:
    """One ``/generate`` reply, reduced to what the quality metrics read."""

    text: str
    output_ids: tuple[int, ...]
    finish_type: str | None  # "stop", "length", "abort", ... ; None: unfinished
    completion_tokens: int
    prompt_tokens: int | None
    output_logprobs: tuple[float, ...] = ()
    output_top: tuple[TopK | None, ...] = ()
    input_ids: tuple[int, ...] = ()
    input_logprobs: tuple[float | None, ...] = ()
    input_top: tuple[TopK | None, ...] = ()
    spec_verify_ct: int | None = None
    extra: dict = field(default_factory=dict)


def _logprob(value: object, where: str, *, first: bool = False) -> float | None:
    """A logprob: a number, NaN for orjson's ``null``; ``None`` only at the first input
    position (SGLang has no logprob for a token without context)."""
    if value is None:
        return None if first else math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise QualityParseError(f"{where}: logprob must be a number, got {value!r:.60}")
    return float(value)


def _token_id(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise QualityParseError(f"{where}: token id must be an integer >= 0, got {value!r:.60}")
    return value


def _triples(value: object, where: str, *, input_side: bool = False
             ) -> tuple[tuple[float | None, ...], tuple[int, ...]]:
    """``[[logprob, id, text], ...]`` -> (logprobs, ids)."""
    if not isinstance(value, list):
        raise QualityParseError(f"{where}: expected a list, got {type(value).__name__}")
    if len(value) > MAX_POSITIONS:
        raise QualityParseError(f"{where}: {len(value)} positions, more than {MAX_POSITIONS}")
    lps, ids = [], []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) < 2:
            raise QualityParseError(f"{where}[{i}]: expected [logprob, token_id, text]")
        lps.append(_logprob(item[0], f"{where}[{i}]", first=input_side and i == 0))
        ids.append(_token_id(item[1], f"{where}[{i}]"))
    return tuple(lps), tuple(ids)


def _top(value: object, where: str) -> tuple[TopK | None, ...]:
    """``[[[logprob, id, text], ...] | None, ...]`` -> one {id: logprob} per position."""
    if not isinstance(value, list):
        raise QualityParseError(f"{where}: expected a list, got {type(value).__name__}")
    if len(value) > MAX_POSITIONS:
        raise QualityParseError(f"{where}: {len(value)} positions, more than {MAX_POSITIONS}")
    out: list[TopK | None] = []
    for i, pos in enumerate(value):
        if pos is None:
            out.append(None)
            continue
        if not isinstance(pos, list) or len(pos) > MAX_TOP_K:
            raise QualityParseError(f"{where}[{i}]: expected at most {MAX_TOP_K} entries")
        lps, ids = _triples(pos, f"{where}[{i}]")
        out.append({t: lp for t, lp in zip(ids, lps, strict=True)})  # type: ignore[misc]
    return tuple(out)


def _finish_type(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        kind = value.get("type")
        return str(kind) if kind is not None else None
    return str(value)  # the OpenAI reply's plain string


def _count(meta: Mapping, key: str, where: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise QualityParseError(f"{where}.{key}: expected an integer >= 0, got {value!r:.60}")
    return value


def parse_generate(body: object) -> Generation:
    """One non-streaming ``/generate`` reply (a JSON object) as :class:`Generation`."""
    if not isinstance(body, Mapping):
        raise QualityParseError(f"/generate reply is not a JSON object: {str(body)[:120]!r}")
    meta = body.get("meta_info")
    if not isinstance(meta, Mapping):
        raise QualityParseError("/generate reply has no meta_info object")
    text = body.get("text", "")
    if not isinstance(text, str):
        raise QualityParseError("/generate reply: text is not a string")
    ids_raw = body.get("output_ids")
    out_lps: tuple = ()
    out_ids: tuple[int, ...] = ()
    if "output_token_logprobs" in meta:
        out_lps, out_ids = _triples(meta["output_token_logprobs"],
                                    "meta_info.output_token_logprobs")
    if isinstance(ids_raw, list):
        if len(ids_raw) > MAX_POSITIONS:
            raise QualityParseError(f"output_ids: more than {MAX_POSITIONS} tokens")
        out_ids = tuple(_token_id(t, f"output_ids[{i}]") for i, t in enumerate(ids_raw))
    in_lps, in_ids = ((), ())
    if "input_token_logprobs" in meta:
        in_lps, in_ids = _triples(meta["input_token_logprobs"], "meta_info.input_token_logprobs",
                                  input_side=True)
    completion = _count(meta, "completion_tokens", "meta_info")
    return Generation(
        text=text, output_ids=out_ids, finish_type=_finish_type(meta.get("finish_reason")),
        completion_tokens=completion if completion is not None else len(out_ids),
        prompt_tokens=_count(meta, "prompt_tokens", "meta_info"),
        output_logprobs=tuple(math.nan if v is None else v for v in out_lps),
        output_top=(_top(meta["output_top_logprobs"], "meta_info.output_top_logprobs")
                    if meta.get("output_top_logprobs") is not None else ()),
        input_ids=in_ids, input_logprobs=in_lps,
        input_top=(_top(meta["input_top_logprobs"], "meta_info.input_top_logprobs")
                   if meta.get("input_top_logprobs") is not None else ()),
        spec_verify_ct=_count(meta, "spec_verify_ct", "meta_info"),
    )


def parse_completion_logprobs(body: object) -> Generation:
    """One ``/v1/completions`` reply with ``logprobs`` (OpenAI schema, SGLang's
    ``serving_completions.py`` ``_build_completion_response`` via ``to_openai_style_logprobs``:
    ``tokens``, ``token_logprobs``, ``top_logprobs`` as ``{text: logprob}`` per position).
    Token ids are not in this schema: the text's positions stand in for them."""
    if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list) \
            or not body["choices"]:
        raise QualityParseError("/v1/completions reply has no choices")
    choice = body["choices"][0]
    if not isinstance(choice, Mapping):
        raise QualityParseError("/v1/completions: choices[0] is not an object")
    lp = choice.get("logprobs") or {}
    values = lp.get("token_logprobs") or []
    if not isinstance(values, list) or len(values) > MAX_POSITIONS:
        raise QualityParseError("/v1/completions: logprobs.token_logprobs is not a bounded list")
    lps = tuple(_logprob(v, f"logprobs.token_logprobs[{i}]") for i, v in enumerate(values))
    usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else {}
    return Generation(
        text=str(choice.get("text", "")), output_ids=(), finish_type=_finish_type(
            choice.get("finish_reason")),
        completion_tokens=int(usage.get("completion_tokens") or len(lps)),
        prompt_tokens=usage.get("prompt_tokens"), output_logprobs=lps)  # type: ignore[arg-type]


def forced_top(gen: Generation, count: int) -> tuple[TopK | None, ...]:
    """The teacher-forced distributions of ``count`` forced tokens, from a reply made
    with ``input_ids`` = prompt + forced tokens and ``logprob_start_len`` = prompt length
    - 1. SGLang pads the first input entry with ``None`` and entry k is the distribution
    *of* input position ``logprob_start_len + k`` given the tokens before it
    (scheduler_output_processor_mixin.py ``add_input_logprob_return_values``), so the
    forced tokens are entries ``1 .. count``."""
    return tuple(gen.input_top[1:count + 1])
