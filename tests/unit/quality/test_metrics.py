"""gpuserve.quality.metrics: each metric on hand-checkable inputs."""

from __future__ import annotations

import math

import pytest

from gpuserve.quality import metrics as m


def lp(probs: dict[int, float]) -> dict[int, float]:
    return {t: math.log(p) for t, p in probs.items()}


def test_kl_of_identical_distributions_is_zero():
    d = lp({1: 0.6, 2: 0.3})
    assert m.kl_topk(d, d) == pytest.approx(0.0, abs=1e-12)


def test_kl_matches_the_closed_form_with_the_tail_bucket():
    ref, new = lp({1: 0.6, 2: 0.3}), lp({1: 0.5, 2: 0.3})
    # P = (0.6, 0.3, tail 0.1), Q = (0.5, 0.3, tail 0.2)
    want = 0.6 * math.log(0.6 / 0.5) + 0.1 * math.log(0.1 / 0.2)
    assert m.kl_topk(ref, new) == pytest.approx(want)


def test_a_token_missing_from_the_candidate_top_k_gets_at_most_its_smallest_prob():
    ref, new = lp({1: 0.5, 2: 0.4}), lp({1: 0.5, 3: 0.05})
    # token 2 absent: tail of new is 0.45, capped at new's smallest listed prob 0.05
    q2, q_tail = 0.05, 1 - 0.5 - 0.05
    want = 0.4 * math.log(0.4 / q2) + 0.1 * math.log(0.1 / q_tail)
    assert m.kl_topk(ref, new) == pytest.approx(want)


def test_nan_in_gives_nan():
    assert math.isnan(m.kl_topk({1: -0.1}, {1: math.nan}))


def test_kld_summary_counts_missing_and_nan_positions_as_non_finite():
    a = lp({1: 0.9})
    s = m.kld_summary([(a, a), (a, None), (a, {1: math.nan}), (None, a)])
    assert (s.positions, s.non_finite, s.mean) == (1, 2, pytest.approx(0.0, abs=1e-12))


def test_percentile_interpolates_like_numpy():
    assert m.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert m.percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_greedy_agreement_is_the_agreeing_prefix_fraction():
    pairs = [([1, 2, 3, 4], [1, 2, 9, 4]), ([5, 6], [5, 6])]
    assert m.greedy_agreement(pairs, 4) == pytest.approx((2 / 4 + 2 / 2) / 2)


def test_wilson_interval_known_value():
    lo, hi = m.wilson_interval(18, 20)
    assert (round(lo, 3), round(hi, 3)) == (0.699, 0.972)
    assert m.wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_one_sided_exact():
    ref = [True] * 10
    new = [False] * 4 + [True] * 6
    assert m.mcnemar_drop_p(ref, new) == pytest.approx(1 / 16)  # b=4, c=0
    assert m.mcnemar_drop_p(ref, ref) == 1.0
    with pytest.raises(ValueError):
        m.mcnemar_drop_p([True], [True, False])


def test_repetition_loop_found_only_when_it_dominates_the_tail():
    assert m.repetition_loop([7, 8, 9] + [1, 2] * 6) == 2
    assert m.repetition_loop([0] * 10) == 1
    assert m.repetition_loop(list(range(20))) is None
    assert m.repetition_loop(list(range(12)) + [5, 5, 5, 5]) is None  # short tail only


def test_non_finite_counts_nan_and_inf_not_none():
    assert m.non_finite([None, 0.1, math.nan, math.inf, -math.inf]) == 3
    assert m.first_non_finite([-0.1, -0.2, math.nan]) == 2


def test_acceptance_length_pools_tokens_over_verify_steps():
    assert m.acceptance_length([(32, 29), (10, 1), (5, None)]) == pytest.approx(42 / 30)
    assert m.acceptance_length([(5, None)]) is None
