"""A deterministic toy language model for the stand-in's ``/generate`` with logprobs, so
that greedy decoding, teacher-forced logprobs and few-shot answers mean something in
the lab, and per-launch perturbations (composed) that the quality check must tolerate
or catch.

The model: a vocabulary of 63 words, the numbers 0..199 and an end token; a word
outside it maps to a word id by its CRC. The next-token logits are a sum of fixed
pseudo-random vectors keyed by each of the last three tokens (seeded, so every start
computes the same distributions), and a token of the last eight is less likely (no
short greedy loops). After the last ``A:``/``Answer:`` it answers: "The answer is N ."
then a newline and "Question"; N is the sum or difference of the question's numbers
when the question is within the model's skill (CRC of the question mod 100 below
``SKILL``), one more otherwise.

Perturbations (``GPUSERVE_LAB_STANDIN_QUALITY``, or a surface rule's ``quality:``;
comma-separated, all composed): ``noise:S`` (logit noise of s.d. S; ``fp8_kv`` is
``noise:0.05``), ``nan_after:N`` (every logprob from the N-th generated position on is
NaN, a broken kernel), ``flat`` (a uniform distribution), ``degrade:D`` (skill - D
points), ``draft_mismatch`` (a speculative launch accepts no draft token).
"""

from __future__ import annotations

import math
import random
import re
import threading
import zlib
from collections import deque
from functools import lru_cache

WORDS = ("<eos>", "\n", "the", "a", "of", "and", "to", "is", "in", "it", "that", "was",
         "for", "on", "are", "with", "as", "at", "be", "this", "have", "from", "or", "one",
         "by", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use",
         "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
         "about", "out", "many", "then", "them", "The", "answer", ".", ",", "Q:", "A:",
         "Question", "What", "?", "Answer:", "+", "-")
NUM0 = len(WORDS)
VOCAB = len(WORDS) + 200
WORD_ID = {w: i for i, w in enumerate(WORDS)}
EOS = 0
SKILL = 95
SCALE = 2.5


def tokenize(text: str) -> list[int]:
    ids = []
    for piece in re.findall(r"\n|\d+|[^\s\d]+", text):
        if piece.isdigit() and int(piece) < 200:
            ids.append(NUM0 + int(piece))
        elif piece in WORD_ID:
            ids.append(WORD_ID[piece])
        else:
            ids.append(2 + zlib.crc32(piece.encode()) % (len(WORDS) - 2))
    return ids


def word(t: int) -> str:
    return str(t - NUM0) if t >= NUM0 else WORDS[t]


def detokenize(ids: list[int]) -> str:
    return "".join(w if w == "\n" else " " + w for w in map(word, ids))


@lru_cache(maxsize=4096)
def _vec(k: int, t: int) -> tuple[float, ...]:
    rng = random.Random(f"toylm:{k}:{t}")
    return tuple(rng.gauss(0.0, 1.0) for _ in range(VOCAB))


def _last(ctx: list[int], names: tuple[str, ...], before: int) -> int | None:
    """Index of the last token before ``before`` whose word is one of ``names``."""
    for i in range(before - 1, -1, -1):
        if word(ctx[i]) in names:
            return i
    return None


@lru_cache(maxsize=4096)
def _script(question: tuple[int, ...], skill: int) -> tuple[int, ...]:
    """The answer to ``question`` (its tokens between Q:/Question and A:/Answer:)."""
    nums = [t - NUM0 for t in question if t >= NUM0]
    ops = [word(t) for t in question]
    n = (nums[0] - nums[1] if "-" in ops else nums[0] + nums[1]) if len(nums) >= 2 else \
        zlib.crc32(repr(question).encode()) % 200
    if zlib.crc32(repr(question).encode()) % 100 >= skill:
        n += 1
    n = min(max(n, 0), 199)
    return (WORD_ID["The"], WORD_ID["answer"], WORD_ID["is"], NUM0 + n, WORD_ID["."],
            WORD_ID["\n"], WORD_ID["Question"])


def _answer_next(ctx: list[int], skill: int) -> int | None:
    """The scripted next token inside an answer (after the last A:/Answer:), or None."""
    mark = _last(ctx, ("A:", "Answer:"), len(ctx))
    if mark is None:
        return None
    q = _last(ctx, ("Q:", "Question"), mark)
    script = _script(tuple(ctx[(q or 0) + 1:mark]), skill)
    done = len(ctx) - mark - 1
    return script[done] if done < len(script) else None


@lru_cache(maxsize=65536)
def _base(tail: tuple[int, ...]) -> tuple[float, ...]:
    """Logits from the last three tokens."""
    logits = [0.0] * VOCAB
    for k, t in enumerate(reversed(tail)):
        w = SCALE / (k + 1)
        for j, v in enumerate(_vec(k, t)):
            logits[j] += w * v
    return tuple(logits)


@lru_cache(maxsize=65536)
def _normalised(tail: tuple[int, ...], boost: int | None, noise: float) -> tuple[float, ...]:
    logits = list(_base(tail[-3:]))
    for t in tail:  # a recent token is less likely again: no short greedy loops
        logits[t] -= 4.0
    if boost is not None:
        logits[boost] += 40.0
    if noise:
        rng = random.Random(f"noise:{tail}")
        logits = [x + rng.gauss(0.0, noise) for x in logits]
    top = max(logits)
    z = top + math.log(sum(math.exp(x - top) for x in logits))
    return tuple(x - z for x in logits)


class ToyLM:
    """The model with one launch's perturbations (``spec``: the knob's text)."""

    def __init__(self, spec: str = "") -> None:
        self.noise, self.nan_after, self.flat, self.skill = 0.0, None, False, SKILL
        self.draft_mismatch = False
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, arg = part.partition(":")
            if name == "fp8_kv":
                self.noise = 0.05
            elif name == "noise":
                self.noise = float(arg)
            elif name == "nan_after":
                self.nan_after = int(arg)
            elif name == "flat":
                self.flat = True
            elif name == "degrade":
                self.skill = SKILL - int(arg)
            elif name == "draft_mismatch":
                self.draft_mismatch = True
            else:
                raise ValueError(f"unknown quality perturbation {part!r}")

    def logprobs(self, ctx: list[int], generated: int) -> tuple[float, ...]:
        """log p(next | ctx); ``generated``: how many tokens this request made so far
        (``nan_after`` counts from the request's first generated position)."""
        if self.nan_after is not None and generated >= self.nan_after:
            return (math.nan,) * VOCAB
        if self.flat:
            return (-math.log(VOCAB),) * VOCAB
        return _normalised(tuple(ctx[-8:]), _answer_next(ctx, self.skill), self.noise)


def argmax(lps: list[float]) -> int:
    """The greedy token; a tie (a flat or NaN distribution) goes to the first token that
    is not the end token, as a broken kernel repeats one token."""
    return max(range(len(lps)), key=lambda j: (lps[j] if not math.isnan(lps[j]) else -1e9,
                                               j != EOS))


def topk(lps: list[float], k: int) -> list[list]:
    order = sorted(range(len(lps)), key=lambda j: -(lps[j] if not math.isnan(lps[j]) else -1e9))
    return [[_json(lps[j]), j, None] for j in order[:k]]


def _json(v: float) -> float | None:
    """orjson (SGLang's ORJSONResponse) writes a NaN as null."""
    return None if math.isnan(v) or math.isinf(v) else v


def _stop_hit(out: list[int], stops: list[str]) -> str | None:
    text = detokenize(out)
    return next((s for s in stops if s and s in text), None)


def _strip_stop(text: str, stop: str) -> str:
    return text[:text.index(stop)] if stop in text else text


def generate(model: ToyLM, body: dict, spec_accept: float | None) -> dict:
    """The reply of SGLang's ``/generate`` (non-streaming) for ``body``, with the
    ``meta_info`` fields of tokenizer_manager.py for ``return_logprob``."""
    params = body.get("sampling_params") or {}
    max_new = int(params.get("max_new_tokens") or 128)
    stops = params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    ids = list(body["input_ids"]) if body.get("input_ids") is not None \
        else tokenize(str(body.get("text", "")))
    k = int(body.get("top_logprobs_num") or 0)
    out, out_lp, out_top, finish = [], [], [], {"type": "length", "length": max_new}
    for i in range(max_new):
        lps = model.logprobs(ids + out, i)
        t = argmax(lps)
        out.append(t)
        out_lp.append([_json(lps[t]), t, None])
        out_top.append(topk(lps, k) if k else None)
        if t == EOS:
            finish = {"type": "stop", "matched": EOS}
            break
        hit = _stop_hit(out, stops)
        if hit:
            finish = {"type": "stop", "matched": hit}
            break
    meta = {"id": body.get("rid") or "toylm", "finish_reason": finish,
            "prompt_tokens": len(ids), "weight_version": "default", "total_retractions": 0}
    if body.get("return_logprob"):
        meta.update(_input_logprobs(model, ids, body.get("logprob_start_len"), k))
        meta["output_token_logprobs"] = out_lp
        if k:
            meta["output_top_logprobs"] = out_top
    meta.update({"completion_tokens": len(out), "cached_tokens": 0})
    if spec_accept is not None:
        accept = 1.0 if model.draft_mismatch else spec_accept
        meta["spec_verify_ct"] = max(1, math.ceil(len(out) / max(accept, 1.0)))
        meta["spec_accept_length"] = len(out) / meta["spec_verify_ct"]
    text = detokenize(out[:-1] if finish["type"] == "stop" and finish["matched"] == EOS else out)
    if finish["type"] == "stop" and isinstance(finish["matched"], str):
        text = _strip_stop(text, finish["matched"])
    return {"text": text, "output_ids": out, "meta_info": meta}


def _input_logprobs(model: ToyLM, ids: list[int], start, k: int) -> dict:
    """SGLang's input logprobs from ``logprob_start_len`` (default: the last prompt
    position): the first entry padded with None, entry j the token at start + j
    (scheduler_output_processor_mixin.py add_input_logprob_return_values)."""
    start = len(ids) - 1 if start is None or int(start) < 0 else min(int(start), len(ids) - 1)
    toks, tops = [[None, ids[start], None]], [None]
    for p in range(start + 1, len(ids)):
        lps = model.logprobs(ids[:p], max(0, p - len(ids)))
        toks.append([_json(lps[ids[p]]), ids[p], None])
        tops.append(topk(lps, k) if k else None)
    out = {"input_token_logprobs": toks}
    if k:
        out["input_top_logprobs"] = tops
    return out


def batch_items(body: dict) -> list[dict] | None:
    """The requests of SGLang's batch form of ``/generate`` (a list of ``text``, or a list
    of ``input_ids`` lists), one body each, or None for a single request. Per-prompt
    fields are a list (one per prompt) or one value for all, as GenerateReqInput's
    ``_normalize_batch_inputs`` reads them (python/sglang/srt/managers/io_struct.py of
    sgl-project/sglang at 001067ff); a ValueError like its own otherwise."""
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        prompts, key = text, "text"
    elif text is None and isinstance(ids, list) and ids and isinstance(ids[0], list):
        prompts, key = ids, "input_ids"
    else:
        return None
    n = len(prompts)
    if not n:
        raise ValueError(f"{key} cannot be empty.")
    out = [dict(body, **{key: p}) for p in prompts]
    for name in ("sampling_params", "return_logprob", "logprob_start_len",
                 "top_logprobs_num", "rid"):
        value = body.get(name)
        if not isinstance(value, list):
            continue
        if len(value) != n:
            raise ValueError(f"The length of {name} ({len(value)}) should be equal to "
                             f"the batch size ({n}).")
        for item, v in zip(out, value, strict=True):
            item[name] = v
    return out


def prompt_ids(body: dict) -> list[int]:
    """The prompt's token ids of one request body (``input_ids`` or ``text``)."""
    ids = body.get("input_ids")
    return list(ids) if ids is not None else tokenize(str(body.get("text", "")))


def prompt_length(body: dict) -> int:
    """The prompt's token count of one request body (``input_ids`` or ``text``)."""
    return len(prompt_ids(body))


def max_prefix(body: dict, length: int) -> int:
    """How much of a prompt SGLang may take from its prefix cache: all but the last
    token, and no further than ``logprob_start_len`` when input logprobs are asked for
    (sglang/srt/managers/schedule_batch.py ``Req._compute_max_prefix_len``)."""
    most = length - 1
    start = body.get("logprob_start_len")
    if body.get("return_logprob") and isinstance(start, int) and start >= 0:
        most = min(most, start)
    return max(most, 0)


class PrefixCache:
    """The stand-in's radix cache (COMPOSED: a bounded list of recent prompts, not a
    tree): the prompt tokens a batch must prefill after the longest cached prefix, as
    SGLang's RadixAttention skips them (on by default; ``--disable-radix-cache`` turns
    it off)."""

    def __init__(self, size: int = 512) -> None:
        self.prompts: deque[tuple[int, ...]] = deque(maxlen=size)
        self.lock = threading.Lock()

    def uncached(self, body: dict) -> int:
        """The prompt tokens of ``body`` not in the cache; the prompt is cached after."""
        ids = tuple(prompt_ids(body))
        most = max_prefix(body, len(ids))
        with self.lock:
            hit = max((_common(ids, p, most) for p in self.prompts), default=0)
            self.prompts.append(ids)
        return len(ids) - hit


def _common(a: tuple[int, ...], b: tuple[int, ...], most: int) -> int:
    n = min(len(a), len(b), most)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def max_new(body: dict) -> int:
    """The request's ``max_new_tokens`` (the toy model's default 128)."""
    return int((body.get("sampling_params") or {}).get("max_new_tokens") or 128)
