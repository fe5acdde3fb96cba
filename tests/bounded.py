"""A test's own subprocess bounded by its CPU time, not the wall clock.

The unit tier runs niced beside the lab tiers on two cores, where a scan that takes
3 CPU s on an idle machine once waited over 60 s of wall time for them (a clean clone
beside four busy loops): a wall-clock timeout there fails for the machine's load, not
for the code. ``run`` limits the process's CPU seconds instead (``RLIMIT_CPU``: the
kernel ends it with SIGXCPU past the limit, which the test sees as a failure), and keeps
a wall-clock timeout only for a hang that spends no CPU, far beyond any load seen.
"""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Sequence
from typing import Any

#: a hang that spends no CPU (a blocked read, a lost child) ends here
WALL_S = 900


def run(argv: Sequence[str], *, cpu_s: int = 60, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, **kwargs)`` with at most ``cpu_s`` CPU seconds for the process
    (and each of its children) and :data:`WALL_S` of wall time."""
    def limit() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))

    return subprocess.run(argv, timeout=WALL_S, preexec_fn=limit, **kwargs)
