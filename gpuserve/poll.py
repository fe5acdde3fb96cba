"""One bounded poll: the rounds of a wait on a host, paced, and bounded by time and count.

Why one: the deploy waits on host jobs (a download, an install, a benchmark), on a
server's health and on a gateway's traffic. Every such wait must end even when a check
answers at once or the clock stalls (the count bound), must not outlast its timeout by
a pause (the last pause is cut to the deadline), and must keep a steady pace for its
progress lines. docs/architecture.md ("Waiting on a host").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: The first pauses of a wait on a host job (then its steady pace): most of a tune's jobs
#: (a benchmark run of a few requests, an install with nothing to fetch) end within two
#: seconds, and three more small status reads cost the host less than the wait they save.
JOB_FIRST_PAUSES_S = (0.25, 0.5, 1.0)


@dataclass
class Poll:
    """Iterate for the rounds: each yields the seconds elapsed when it began.

    Rounds begin at least ``every_s`` apart (or ``next_s``, when the caller sets it for
    the next pause alone); the first pauses may be the shorter ``first_s`` (a host job
    that ends within a second or two is seen when it ends, not up to ``every_s`` later:
    a tune runs dozens of short benchmarks). The last round is the first one that begins
    at or past ``timeout_s`` (the pause before it ends at the deadline), or the
    ``max_rounds``-th (default: as many as ``timeout_s`` holds at ``every_s``, plus that
    last one and one for each of ``first_s``). A loop that the poll ends without a
    ``break`` or ``return`` timed out (``for ... else``)."""

    timeout_s: float
    every_s: float
    max_rounds: int | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    next_s: float | None = None
    first_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.every_s <= 0 and self.max_rounds is None:
            raise ValueError("a poll with no pause needs max_rounds")

    def rounds(self) -> int:
        """The count bound."""
        if self.max_rounds is not None:
            return self.max_rounds
        return math.ceil(max(0.0, self.timeout_s) / self.every_s) + 1 + len(self.first_s)

    def __iter__(self) -> Iterator[float]:
        start = self.clock()
        limit = self.rounds()
        for n in range(limit):
            began = self.clock()
            elapsed = began - start
            yield elapsed
            if elapsed >= self.timeout_s or n == limit - 1:
                return
            pause = (self.next_s if self.next_s is not None
                     else self.first_s[n] if n < len(self.first_s) else self.every_s)
            self.next_s = None
            left = self.timeout_s - (self.clock() - start)
            self.sleep(max(0.0, min(pause - (self.clock() - began), left)))
