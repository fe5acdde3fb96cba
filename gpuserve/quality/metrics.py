"""The quality metrics, pure functions of parsed replies: KL divergence of teacher-forced
top-k distributions, greedy agreement, few-shot accuracy with its interval and a paired
test for a drop, and sanity (non-finite logprobs, empty or cut output, repetition loops,
finish reasons, speculative acceptance length).

Why these: a KLD of the next-token distributions on the same tokens is how llama.cpp
(``perplexity --kl-divergence``) and the quantisation community compare a changed
numerics path with a reference; it moves with tiny kernel drift only a little, while
task accuracy and greedy text catch what KLD averages away. Definitions and their
limits: docs/quality.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: probability floor: a token the candidate gives no mass keeps a finite KLD
EPS = 1e-10


def _probs(top: Mapping[int, float]) -> dict[int, float]:
    return {t: math.exp(lp) for t, lp in top.items()}


def kl_topk(ref: Mapping[int, float], new: Mapping[int, float]) -> float:
    """KL(P_ref || P_new) over the reference's top-k tokens plus one "tail" bucket.

    P: the reference's top-k probabilities and its remaining mass ``1 - sum`` as the
    tail. Q: the candidate's probability for each of those tokens; a token missing from
    the candidate's top-k gets an equal share of the candidate's own tail mass, capped
    at its smallest listed probability (it ranked below all of them); Q's tail is what
    is left. Both tails are floored at ``EPS``. NaN in, NaN out (sanity names it)."""
    if any(math.isnan(v) for v in (*ref.values(), *new.values())):
        return math.nan
    p, q_top = _probs(ref), _probs(new)
    q_tail_avail = max(1.0 - sum(q_top.values()), 0.0)
    missing = [t for t in p if t not in q_top]
    share = q_tail_avail / len(missing) if missing else 0.0
    if q_top and missing:
        share = min(share, min(q_top.values()))
    q = {t: q_top.get(t, share) for t in p}
    p_tail = max(1.0 - sum(p.values()), EPS)
    q_tail = max(1.0 - sum(q.values()), EPS)
    kl = sum(pv * math.log(pv / max(q[t], EPS)) for t, pv in p.items() if pv > 0)
    return max(kl + p_tail * math.log(p_tail / q_tail), 0.0)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default), NaN on an empty list."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * pct / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True)
class KldSummary:
    mean: float
    p99: float
    positions: int
    non_finite: int  # positions whose KLD is NaN (non-finite logprobs)


def kld_summary(pairs: Iterable[tuple[Mapping[int, float] | None, Mapping[int, float] | None]]
                ) -> KldSummary:
    """Mean and p99 KLD over all positions where both sides have a distribution; a
    position the candidate leaves empty (``None``) or NaN counts as non-finite."""
    values, bad = [], 0
    for ref, new in pairs:
        if ref is None:
            continue
        kl = math.nan if new is None else kl_topk(ref, new)
        if math.isnan(kl):
            bad += 1
        else:
            values.append(kl)
    mean = sum(values) / len(values) if values else math.nan
    return KldSummary(mean, percentile(values, 99.0), len(values), bad)


def prefix_match(ref: Sequence[int], new: Sequence[int], n: int) -> int:
    """How many of the first ``n`` tokens agree before the first difference."""
    k = 0
    for a, b in zip(ref[:n], new[:n], strict=False):
        if a != b:
            break
        k += 1
    return k


def greedy_agreement(pairs: Iterable[tuple[Sequence[int], Sequence[int]]], n: int) -> float:
    """Mean over prompts of the agreeing prefix of the first ``n`` greedy tokens, as a
    fraction of the tokens compared (the shorter side bounds a prompt's count)."""
    fracs = []
    for ref, new in pairs:
        span = min(n, len(ref))
        if span == 0:
            continue
        fracs.append(prefix_match(ref, new, span) / span)
    return sum(fracs) / len(fracs) if fracs else math.nan


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (95 % at z = 1.96)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_drop_p(ref_right: Sequence[bool], new_right: Sequence[bool]) -> float:
    """One-sided exact McNemar p-value that the candidate is worse than the reference
    on the same questions: of the discordant pairs, b = reference right and candidate
    wrong, c = the opposite; p = P(X >= b) for X ~ Binomial(b + c, 1/2). 1.0 with no
    discordant pair."""
    if len(ref_right) != len(new_right):
        raise ValueError("accuracy: reference and candidate answered different question sets")
    b = sum(1 for r, c in zip(ref_right, new_right, strict=True) if r and not c)
    c = sum(1 for r, cc in zip(ref_right, new_right, strict=True) if cc and not r)
    n = b + c
    if n == 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(b, n + 1)) / 2 ** n


def non_finite(values: Iterable[float | None]) -> int:
    """How many logprobs are NaN or infinite (``None`` is not counted: SGLang's first
    input position)."""
    return sum(1 for v in values if v is not None and not math.isfinite(v))


def first_non_finite(values: Sequence[float]) -> int | None:
    return next((i for i, v in enumerate(values) if not math.isfinite(v)), None)


def repetition_loop(ids: Sequence[int], max_period: int = 8, min_repeats: int = 4,
                    min_share: float = 0.5) -> int | None:
    """The period of a loop that ends the output: the last ``period`` tokens repeated at
    least ``min_repeats`` times back to back, covering at least ``min_share`` of the
    output. None when there is none."""
    n = len(ids)
    for period in range(1, max_period + 1):
        if n < period * min_repeats:
            break
        tail = list(ids[n - period:])
        reps, end = 1, n - period
        while end - period >= 0 and list(ids[end - period:end]) == tail:
            reps, end = reps + 1, end - period
        if reps >= min_repeats and reps * period >= min_share * n:
            return period
    return None


#: SGLang's finish types that end a healthy greedy request (BaseFinishReason subclasses
#: FINISH_MATCHED_TOKEN / FINISH_MATCHED_STR -> "stop", FINISH_LENGTH -> "length")
GOOD_FINISH = ("stop", "length")


def acceptance_length(replies: Iterable[tuple[int, int | None]]) -> float | None:
    """Mean tokens per verify step over replies of (completion_tokens, spec_verify_ct),
    as SGLang's ``spec_accept_length`` (completion tokens / verify steps), pooled; None
    when no reply carries verify counts (not a speculative launch)."""
    tokens = steps = 0
    for completion, verify in replies:
        if verify is None:
            continue
        tokens += completion
        steps += verify
    if steps == 0:
        return None
    return tokens / steps
