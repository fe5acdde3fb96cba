"""SGLang health gate: startup-phase classification and the wait/fail decision.

Why this exists: a large model takes minutes to come up, and ``/health`` only says 503
until the very end. A user watching a deploy wants to know *where* the server is
(loading weights? capturing CUDA graphs?) and wants a dead start reported at once with
the reason, not after a ten-minute timeout. The phases are recognised from SGLang's own
log lines (rules in ``gpuserve/data/health/sglang_startup.yaml``, with their sources);
the host side only collects raw facts (HTTP status, systemd state, journal lines), and
every decision is made here, so it is testable without a host.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from gpuserve import safeload
from gpuserve.paths import DATA_DIR

RULES_PATH = DATA_DIR / "health" / "sglang_startup.yaml"


@dataclass(frozen=True)
class Phase:
    """One startup phase; ``rank`` orders them (higher = further along)."""

    name: str
    label: str
    rank: int
    patterns: tuple[re.Pattern[str], ...] = field(repr=False, compare=False)


STARTING = Phase("starting", "starting", 0, ())


@dataclass(frozen=True)
class Rules:
    phases: tuple[Phase, ...]
    fatal: tuple[re.Pattern[str], ...]


@lru_cache(maxsize=1)
def load_rules(path: Path = RULES_PATH) -> Rules:
    """Load the phase and fatal-line rules once; they are data, not code."""
    doc = safeload.load_yaml_file(path)
    phases = tuple(
        Phase(p["name"], p["label"], i + 1, tuple(re.compile(x) for x in p["patterns"]))
        for i, p in enumerate(doc["phases"])
    )
    fatal = tuple(re.compile(x) for x in doc["fatal"])
    return Rules(phases, fatal)


@dataclass(frozen=True)
class StartupState:
    """Where one start attempt got to, judged from its log lines."""

    phase: Phase
    fatal_line: str | None = None

    @property
    def failed(self) -> bool:
        return self.fatal_line is not None


def classify(lines: list[str], rules: Rules | None = None) -> StartupState:
    """Return the furthest phase reached and the most telling fatal line, if any.

    The furthest phase (not the last matching line) is used because TP ranks log out
    of order: rank 3 may still print "Load weight begin" after rank 0 finished.
    """
    rules = rules or load_rules()
    best = STARTING
    fatal: tuple[int, str] | None = None  # (pattern priority, line)
    for line in lines:
        for prio, pattern in enumerate(rules.fatal):
            if (fatal is None or prio < fatal[0]) and pattern.search(line):
                fatal = (prio, line.strip())
                break
        for phase in rules.phases:
            if phase.rank > best.rank and any(p.search(line) for p in phase.patterns):
                best = phase
    return StartupState(best, fatal[1] if fatal else None)


@dataclass(frozen=True)
class Probe:
    """What one poll of the host saw (output of ``data/scripts/sglang_probe.py``)."""

    health: int | None  # HTTP status of GET /health, None when nothing listens yet
    active_state: str  # systemd ActiveState
    sub_state: str  # systemd SubState
    n_restarts: int  # systemd NRestarts (auto-restarts since the unit was started)
    exec_main_status: int | None
    lines: list[str]  # journal lines of the current start attempt
    tail: list[str]  # last journal lines of the unit, for the failure report
    # systemd's last "Main process exited, ..." line for the unit, sent only when
    # NRestarts > 0 (after a restart the unit's ExecMain* describe the new process)
    last_exit: str | None = None
    # False for a node that serves no HTTP (multi-node rank > 0; the probe's --port 0)
    serves_http: bool = True
    # NRestarts when the probe began (a probe that waits on the host may see systemd
    # restart the server before it answers); None from a probe script that predates it
    restarts_before: int | None = None


class ProbeError(ValueError):
    """The probe script printed something that is not its JSON document."""


#: SGLang's switch that makes ``/health`` a plain 200 instead of a one-token generation
#: (``sglang/srt/environ.py``, default true; reference sglang.md §4)
HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def health_generates(env: Mapping[str, str]) -> bool:
    """Whether the server's ``/health`` 200 means it has just generated a token: unless
    its environment sets :data:`HEALTH_GENERATION_ENV` to anything but a plain true
    (then a rerun makes its smoke completion every time: roles/checks/smoke.py)."""
    value = env.get(HEALTH_GENERATION_ENV)
    return value is None or str(value).strip().lower() in ("1", "true", "yes", "y")


def _count(value: object) -> int | None:
    """A systemd counter as the probe printed it (a string of digits), else None."""
    return int(value) if isinstance(value, str) and value.isdigit() else None


def parse_probe(stdout: str) -> Probe:
    """Parse the probe script's one JSON line; a malformed reply is an error, not a guess."""
    if not stdout:  # pyinfra gives a fact's default (None) when the command printed nothing
        raise ProbeError("the probe printed nothing (is python3 on the host?)")
    try:
        doc = json.loads(stdout)
        unit = doc["unit"]
        status = unit.get("ExecMainStatus")
        return Probe(
            health=doc["health"],
            active_state=unit.get("ActiveState", "unknown"),
            sub_state=unit.get("SubState", "unknown"),
            n_restarts=int(unit.get("NRestarts") or 0),
            exec_main_status=int(status) if status not in (None, "") else None,
            lines=list(doc.get("lines", [])),
            tail=list(doc.get("tail", [])),
            last_exit=doc.get("last_exit") or None,
            serves_http=doc.get("http", True) is not False,
            restarts_before=_count(doc.get("first_restarts")),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ProbeError(f"unreadable probe output ({e}): {stdout[:200]!r}") from e


class Verdict(StrEnum):
    """The health gate's decision on one poll (a StrEnum: prints and compares as its word)."""

    HEALTHY = "healthy"
    WAIT = "wait"
    FAILED = "failed"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    phase: Phase
    message: str
    # the poll this decision was made on (for what the gate reports beyond its verdict)
    probe: Probe | None = field(default=None, compare=False, repr=False)


def decide(probe: Probe, elapsed: float, timeout: float, baseline_restarts: int = 0) -> Decision:
    """Decide whether to stop waiting.

    Healthy needs both a 200 from ``/health`` (SGLang answers 200 only after its warmup
    request succeeded, ``http_server.py::health_generate``) and an active unit, so a
    stale server from another unit cannot pass. A start attempt is dead as soon as
    systemd has seen it exit (failed, or waiting to auto-restart, or NRestarts grew) or
    SGLang printed a fatal line; waiting on would only burn the timeout.
    """
    state = classify(probe.lines)
    if probe.health == 200 and probe.active_state == "active":
        return Decision(Verdict.HEALTHY, state.phase, "/health 200", probe)
    if (not probe.serves_http and probe.active_state == "active"
            and probe.sub_state == "running" and not state.failed):
        # a multi-node rank > 0 serves no HTTP: its unit runs; node 0's /health is the
        # group's (it answers only once every rank has joined)
        return Decision(Verdict.HEALTHY, state.phase, "unit running (node serves no HTTP)",
                        probe)
    died = (
        probe.active_state == "failed"
        or probe.sub_state == "auto-restart"
        or probe.n_restarts > baseline_restarts
        or probe.active_state == "inactive"
    )
    if died:
        code = f", exit status {probe.exec_main_status}" if probe.exec_main_status else ""
        why = f": {state.fatal_line}" if state.fatal_line else ""
        return Decision(
            Verdict.FAILED,
            state.phase,
            f"unit stopped during '{state.phase.label}' "
            f"({probe.active_state}/{probe.sub_state}{code}){why}",
        )
    if state.failed:
        return Decision(
            Verdict.FAILED, state.phase, f"fatal error during '{state.phase.label}': "
            f"{state.fatal_line}"
        )
    if elapsed >= timeout:
        return Decision(
            Verdict.TIMEOUT,
            state.phase,
            f"not healthy after {elapsed:.0f} s (health_timeout {timeout:.0f} s), "
            f"last phase '{state.phase.label}'",
        )
    status = "no answer" if probe.health is None else str(probe.health)
    return Decision(Verdict.WAIT, state.phase, f"/health {status}")


_EXIT = re.compile(r"Main process exited, (.+?)\.?$")


def restart_warning(host: str, unit: str, probe: Probe) -> str | None:
    """The warning for a healthy unit that systemd had to restart, else None.

    Why: ``Restart=on-failure`` hides a crash. The server dies, systemd starts it again,
    ``/health`` answers 200 and a rerun would look clean, while the crash (a CUDA
    error, an OOM under load, a killed process) is exactly what the operator needs to
    know. systemd counts these restarts (``NRestarts``, reset by an explicit start), so
    a healthy gate with a count above zero says so, with the last exit when known::

        gpu1: health: gpuserve-sglang.service was restarted 1 time by systemd since it
        was started (last exit: code=killed, status=9/KILL); it serves again, see
        journalctl -u gpuserve-sglang.service
    """
    n = probe.n_restarts
    if n <= 0:
        return None
    found = _EXIT.search(probe.last_exit or "")
    last = f" (last exit: {found.group(1)})" if found else ""
    return (f"{host}: health: {unit} was restarted {n} time{'s' if n != 1 else ''} by "
            f"systemd since it was started{last}; it serves again, see journalctl -u {unit}")


def progress_line(host: str, decision: Decision, elapsed: float) -> str:
    """One progress line for the deploy output, e.g. ``gpu1: health: loading weights (42 s)``."""
    return f"{host}: health: {decision.phase.label} ({elapsed:.0f} s, {decision.message})"
