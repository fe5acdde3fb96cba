"""gpuserve/poll.py: the one bounded poll every wait on a host uses."""

from __future__ import annotations

import pytest

from gpuserve.poll import Poll


class Clock:
    """A clock that moves only when slept on (``step``: what each read costs)."""

    def __init__(self, step: float = 0.0):
        self.now, self.step, self.sleeps = 0.0, step, []

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def poll(clock: Clock, timeout: float, every: float, **kw) -> Poll:
    return Poll(timeout, every, clock=clock.monotonic, sleep=clock.sleep, **kw)


def test_rounds_are_paced_and_the_last_pause_ends_at_the_deadline() -> None:
    clock = Clock()
    assert list(poll(clock, 150, 60)) == [0, 60, 120, 150]
    assert clock.sleeps == [60, 60, 30]


def test_a_stalled_clock_still_ends_by_the_count() -> None:
    """A clock that never moves (a patched time, a sleep that returns at once) cannot
    keep the poll going: 10 s at 2 s is six rounds at most."""
    stalled = Poll(10, 2, clock=lambda: 0.0, sleep=lambda s: None)
    assert len(list(stalled)) == 6
    assert len(list(Poll(10, 0, max_rounds=3, clock=lambda: 0.0, sleep=lambda s: None))) == 3
    with pytest.raises(ValueError, match="max_rounds"):
        Poll(10, 0)


def test_a_round_that_took_its_time_is_not_paused_after() -> None:
    clock = Clock(step=1.5)  # each clock read costs 1.5 s: a slow host answer
    rounds = list(poll(clock, 10, 2))
    assert rounds[-1] >= 10 and all(b - a >= 2 for a, b in zip(rounds, rounds[1:], strict=False))
    assert all(s < 2 for s in clock.sleeps)


def test_the_caller_sets_the_next_pause() -> None:
    clock = Clock()
    rounds = poll(clock, 100, 1)
    seen = []
    for elapsed in rounds:
        seen.append(elapsed)
        rounds.next_s = 40
    assert seen == [0, 40, 80, 100] and clock.sleeps == [40, 40, 20]


def test_a_break_is_not_a_timeout() -> None:
    clock = Clock()
    for elapsed in poll(clock, 100, 10):
        if elapsed >= 30:
            break
    else:
        pytest.fail("the poll ended the loop before the break")
    assert clock.sleeps == [10, 10, 10]


def test_the_first_pauses_are_shorter_and_the_count_bound_holds_them() -> None:
    """A job that ends within a second is seen then, not at the steady pace; the bound
    still lets the poll reach its timeout."""
    clock = Clock()
    assert list(poll(clock, 10, 2, first_s=(0.25, 0.5, 1.0))) == [
        0, 0.25, 0.75, 1.75, 3.75, 5.75, 7.75, 9.75, 10]
    assert clock.sleeps[:4] == [0.25, 0.5, 1.0, 2]
    stalled = Poll(10, 2, first_s=(0.25, 0.5), clock=lambda: 0.0, sleep=lambda s: None)
    assert len(list(stalled)) == 8
