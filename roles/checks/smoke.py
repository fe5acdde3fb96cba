"""The smoke completion: one real completion through the served model, judged and
recorded on the controller (the health gate's probe may have made it already).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra import host, logger, state
from pyinfra.api import FactBase, operation

from gpuserve.measure.results import (
    RecordSpec,
    smoke_record,
    write_record,
)
from gpuserve.measure.smoke import SmokeError, parse_smoke_output, smoke_line
from gpuserve.roles.failure import fail_host
from gpuserve.roles.run_context import run_context
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


def _smoke_seconds(smoke_line: str) -> float:
    """How long the smoke completion in a probe's output took (0 when unreadable: the
    smoke's own check reports that)."""
    try:
        return max(0.0, float(json.loads(smoke_line)["elapsed_s"]))
    except (ValueError, KeyError, TypeError):
        return 0.0


@operation(is_idempotent=True)
def smoke_completion(port: int, model: str, profile: str, script: str, config: str = "",
                     max_tokens: int = 64, record: RecordSpec | None = None):
    """One completion on the host; print ``<host>: smoke: N tokens in T s = X tok/s``
    and, with ``record``, write the result on the controller (no host command).

    The completion the health gate's probe made just before, for the same request, is
    judged instead of making another (:func:`wait_healthy` with ``smoke``)."""
    if not state.is_executing:
        return
    request = SmokeRequest(port=port, model=model, max_tokens=max_tokens, config=config)
    mine = run_context().host(host.name)
    made, mine.smoke = mine.smoke, None
    if made is not None and made[0] == request:
        out = made[1]
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
