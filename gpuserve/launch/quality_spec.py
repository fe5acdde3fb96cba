"""A profile's ``quality:`` block, loaded with the profile and applied by
gpuserve/quality: whether its launches are checked, whether this profile is its
checkpoint's quality reference, and the thresholds a launch must meet.

Defaults and their sources: docs/quality.md ("Thresholds"). In short: FP8 KV cache and
FP8/NVFP4 weight paths on a healthy backend give a mean top-k KLD of a few thousandths
and p99 below ~0.1 against BF16 in published measurements; a broken kernel gives NaN or
a KLD of order one and more. The defaults sit between the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from gpuserve.errors import InputError


@dataclass(frozen=True)
class QualitySpec:
    """What a launch's quality check measures and what it must meet."""

    check: bool = True  # false: no quality check for this profile's launches
    reference: bool = False  # this profile's launch is the checkpoint's reference
    kld_mean_max: float = 0.02
    kld_p99_max: float = 0.25
    greedy_agreement_min: float = 0.5  # mean agreeing prefix of the first tokens
    greedy_tokens: int = 16  # how many first tokens greedy agreement compares
    accuracy_alpha: float = 0.01  # one-sided p below this: the accuracy drop is real
    accuracy_drop_max: float = 0.05  # ... and only if the point drop is above this
    max_non_finite: int = 0  # NaN/inf logprobs allowed in the whole check
    max_loops: int = 0  # prompts ending in a repetition loop the reference has not
    max_bad_finish: int = 0  # replies whose finish reason is not stop/length
    max_empty: int = 0  # replies with no output where the reference had some
    accept_length_min_ratio: float = 0.5  # measured / expected spec acceptance length
    expected_accept_length: float | None = None  # None: the launch's own reference
    top_k: int = 20  # top_logprobs_num of the teacher-forced pass
    max_new_tokens: int = 32  # greedy tokens per chat/completion prompt
    timeout_s: float = 600.0  # the whole check on the host: a bound (docs/quality.md)


_FLOATS_0_1 = ("greedy_agreement_min", "accuracy_alpha", "accuracy_drop_max",
               "accept_length_min_ratio")
_POSITIVE = ("kld_mean_max", "kld_p99_max", "timeout_s")
_INTS = {"greedy_tokens": (1, 512), "max_non_finite": (0, 10**6), "max_loops": (0, 10**4),
         "max_bad_finish": (0, 10**4), "max_empty": (0, 10**4), "top_k": (1, 64),
         "max_new_tokens": (1, 1024)}


def _number(value: Any, at: str, error: Callable[[str, str], InputError]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise error(at, f"must be a finite number, got {value!r:.40}")
    return float(value)


def _field(name: str, value: Any, at: str, error: Callable[[str, str], InputError]) -> Any:
    """One key of the block, checked: its type and range."""
    if name in ("check", "reference"):
        if not isinstance(value, bool):
            raise error(at, f"must be true or false, got {value!r:.40}")
        return value
    if name in _INTS:
        lo, hi = _INTS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise error(at, f"must be an integer in [{lo}, {hi}], got {value!r:.40}")
        return value
    if name == "expected_accept_length":
        if value is None:
            return None
        number = _number(value, at, error)
        if number < 1.0:
            raise error(at, f"must be >= 1 (tokens per verify step), got {number}")
        return number
    number = _number(value, at, error)
    if name in _FLOATS_0_1 and not 0.0 <= number <= 1.0:
        raise error(at, f"must be in [0, 1], got {number}")
    if name in _POSITIVE and number <= 0:
        raise error(at, f"must be > 0, got {number}")
    return number


def parse_quality(data: Any, error: Callable[[str, str], InputError]) -> QualitySpec:
    """A profile's ``quality:`` mapping as :class:`QualitySpec`; a wrong key, type or
    range raises ``error(dotted, message)`` (the profile's file and line)."""
    if data is None:
        return QualitySpec()
    if not isinstance(data, dict):
        raise error("quality", "must be a mapping (e.g. quality: {kld_p99_max: 0.2})")
    known = {f.name for f in fields(QualitySpec)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        at = f"quality.{key}"
        if key not in known:
            raise error(at, f"unknown key (valid: {', '.join(sorted(known))})")
        values[key] = _field(str(key), value, at, error)
    return QualitySpec(**values)
