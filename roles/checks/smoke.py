"""The smoke completion: one real completion through the served model, judged and
recorded on the controller (the health gate's probe may have made it already). One per
start of the server: a rerun that finds the start its newest record measured still
running makes none (its /health generated a token: docs/reruns.md).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from pyinfra import host, logger, state
from pyinfra.api import FactBase, operation

from gpuserve.measure.results import (
    RecordSpec,
    newest_smoke,
    smoke_record,
    write_record,
)
from gpuserve.measure.smoke import SmokeError, parse_smoke_output, same_start, smoke_line
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.run_context import run_context
from gpuserve.serve.checks import (
    results_root,
)


@dataclass(frozen=True)
class SmokeRequest:
    """The smoke completion's request (sglang_smoke.py's arguments)."""

    port: int
    model: str
    max_tokens: int = 64
    config: str = ""
    # the server start (InvocationID) the newest smoke record measured: the probe makes
    # no completion while that start still runs ("" : always make one)
    unless_start: str = ""
    # the profile the deploy serves: the health gate takes the first batch's probe of it
    # (roles/checks/gate.py); not part of the request (the probe's command lacks it)
    profile: str = field(default="", compare=False)


def smoked_start(results_dir: str | None, host_name: str) -> str:
    """The server start the newest smoke record of ``host_name`` measured, or "" (no
    recording, no record, or one without a start): a :class:`SmokeRequest`'s
    ``unless_start``, the same for the first batch's probe and the gate's."""
    if not results_dir:
        return ""
    record = newest_smoke(results_root(results_dir), host_name)
    return (record.server_start or "") if record is not None else ""


class SglangSmoke(FactBase):
    """One completion request made on the host; JSON text. Reads, never changes state."""

    def command(self, script: str, port: int, model: str, max_tokens: int,
                config: str) -> str:
        return " ".join(shlex.quote(a) for a in (
            "python3", script, "--port", str(port), "--model", model,
            "--max-tokens", str(max_tokens), "--config", config))

    def process(self, output: list[str]) -> str:
        return "\n".join(output)



# A smoke completion the health gate's last probe already made (``SmokeRequest`` ->
# the smoke script's JSON line), per host, for :func:`smoke_completion` to judge.


def smoke_seconds(smoke_line: str) -> float:
    """How long the smoke completion in a probe's output took (0 when unreadable: the
    smoke's own check reports that)."""
    try:
        return max(0.0, float(json.loads(smoke_line)["elapsed_s"]))
    except (ValueError, KeyError, TypeError):
        return 0.0


@operation(is_idempotent=True)
def smoke_completion(port: int, model: str, profile: str, script: str, config: str = "",
                     max_tokens: int = 64, record: RecordSpec | None = None,
                     unless_start: str = ""):
    """One completion on the host; print ``<host>: smoke: N tokens in T s = X tok/s``
    and, with ``record``, write the result on the controller (no host command).

    The completion the health gate's probe made just before, for the same request, is
    judged instead of making another (:func:`wait_healthy` with ``smoke``); when that
    probe found the start ``unless_start`` still running, it made none, and this says
    which record measured it."""
    if not state.is_executing:
        return
    request = SmokeRequest(port=port, model=model, max_tokens=max_tokens, config=config,
                           unless_start=unless_start)
    mine = run_context().host(host.name)
    made, mine.smoke = mine.smoke, None
    if made is not None and made[0] == request:
        out = made[1]
        if unless_start and same_start(out) == unless_start:
            logger.info(_same_start_line(record, unless_start))
            return
    else:
        out = host.get_fact(SglangSmoke, script=script, port=port, model=model,
                            max_tokens=max_tokens, config=config)
    try:
        result = parse_smoke_output(out)
    except SmokeError as e:
        yield fail_host(f"smoke: {e}", [])
        return
    logger.info(smoke_line(host.name, result, model, profile))
    if record is not None:
        try:
            path = write_record(results_root(record.results_dir),
                                smoke_record(record, host.name, result))
        except OSError as e:
            logger.warning(f"{host.name}: smoke: result not recorded: {e}")
        else:
            logger.info(f"{host.name}: smoke: recorded {path}")


def _same_start_line(record: RecordSpec | None, start: str) -> str:
    """``gpu1: smoke: none made, the server has run since its smoke of <time> (X tok/s,
    <record>) and its /health generated a token now``."""
    smoked = newest_smoke(results_root(record.results_dir), host.name) if record else None
    if smoked is None or smoked.server_start != start:  # the record went meanwhile
        return (f"{host.name}: smoke: none made, the server (start {start[:12]}) has "
                "run since its recorded smoke and its /health generated a token now")
    return (f"{host.name}: smoke: none made, the server has run since its smoke of "
            f"{smoked.timestamp} ({smoked.output_tok_s:.1f} tok/s, {smoked.source}) and its "
            "/health generated a token now")
