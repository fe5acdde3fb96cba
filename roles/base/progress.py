"""A long host command run in the background and polled, with a progress line at least
every ``REPORT_S`` seconds: the weights download's mechanism (roles/weights), for any
command (the venv install; docs/operate.md).

Why: pyinfra runs an operation's command to its end and shows nothing meanwhile, so a
multi-GiB install looked like a hang. The command runs detached on the host with its
output in ``<run_dir>/log`` and its exit status in ``<run_dir>/rc``; the operation polls
one small fact (the status and the log lines the caller selects) and logs a line.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand

from gpuserve.poll import JOB_FIRST_PAUSES_S, Poll
from gpuserve.serve.weights import POLL_S, REPORT_S

#: Where the jobs keep their output, one directory per start: tmpfs on a systemd host, so
#: a job that fills the disk (a venv on a full filesystem) still writes its status.
JOBS_DIR = "/run/gpuserve-jobs"
#: The exit status reported for a job that ended without writing one (killed, no space).
LOST = -1
#: Lines of the log the status carries: the selected ones, and the last ones for errors.
MAX_SELECTED = 4000
TAIL = 20


@dataclass(frozen=True)
class JobState:
    rc: int | None  # None while running; LOST when it ended without a status
    selected: list[str]
    tail: list[str]

    def outcome(self, timeout_s: float) -> str:
        """Why a job that did not exit 0 failed, for the host's error."""
        if self.rc is None:
            return f"not done within {timeout_s:.0f} s"
        if self.rc == LOST:
            return "it ended without an exit status: killed, or no space for its log"
        return f"exit status {self.rc}"


class JobStatus(FactBase):
    """``<run_dir>/rc`` (else ``running`` while its process lives, ``lost`` when it is
    gone), then the log's lines matching ``select`` (an ERE), then its last lines."""

    def command(self, run_dir: str, select: str) -> str:
        d = shlex.quote(run_dir)
        return (f"cat {d}/rc 2>/dev/null || {{ kill -0 \"$(cat {d}/pid 2>/dev/null)\" "
                f"2>/dev/null && echo running || {{ cat {d}/rc 2>/dev/null || echo lost; }}; "
                "}; echo '##'; "
                f"grep -E {shlex.quote(select)} {d}/log 2>/dev/null | tail -n {MAX_SELECTED}; "
                f"echo '##'; tail -n {TAIL} {d}/log 2>/dev/null; true")

    def process(self, output: list[str]) -> JobState:
        parts: list[list[str]] = [[]]
        for line in output:
            if line == "##" and len(parts) < 3:
                parts.append([])
            else:
                parts[-1].append(line)
        parts += [[]] * (3 - len(parts))
        head = (parts[0] or ["running"])[0].strip()
        rc = int(head) if head.lstrip("-").isdigit() else LOST if head == "lost" else None
        return JobState(rc, parts[1], parts[2])


def fresh_dir(name: str) -> str:
    """A run directory of its own for one start: a job left running by an interrupted
    deploy must not write its exit status where the next run's job is polled."""
    return f"{JOBS_DIR}/{name}-{time.time_ns()}"


def start_command(run_dir: str, script: str, before: str = "") -> StringCommand:
    """Start ``script`` (sh) detached, its output in ``run_dir``/log, then its status;
    ``before``: shell run first in the foreground, ending in ``&&`` or ``;``."""
    d = shlex.quote(run_dir)
    job = (f"{{ ( sh -c {shlex.quote(script)} > {d}/log 2>&1; echo $? > {d}/rc.new; "
           f"mv {d}/rc.new {d}/rc ) < /dev/null > /dev/null 2>&1 & echo $! > {d}/pid; }}")
    return StringCommand("sh", "-c", QuoteString(
        f"{before}rm -rf {d} && mkdir -p -m 700 {d} && {job}"))


def wait(run_dir: str, select: str, describe: Callable[[list[str], float], str],
         label: str, timeout: float) -> JobState:
    """Poll the job until it ends (or ``timeout``: then the state so far, rc None),
    logging ``<host>: <label>: <describe(selected lines, elapsed)>`` at least every
    ``REPORT_S`` seconds, and once at the end."""
    last = 0.0
    job = JobState(None, [], [])
    for elapsed in Poll(timeout, POLL_S, first_s=JOB_FIRST_PAUSES_S):
        job = host.get_fact(JobStatus, run_dir=run_dir, select=select) or JobState(
            None, [], [])
        if job.rc is not None:
            break
        if elapsed - last >= REPORT_S:
            logger.info(f"{host.name}: {label}: {describe(job.selected, elapsed)}")
            last = elapsed
    logger.info(f"{host.name}: {label}: {describe(job.selected, elapsed)}")
    return job
