"""Failing a host from inside an operation, with the reason in pyinfra's output.

The checks and the venv verification judge at execute time from facts; when they fail
they yield this one command, which logs the reason and returns False, so pyinfra fails
the host (non-zero exit) without a shell command that could itself print secrets.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra import logger
from pyinfra.api import FunctionCommand


def fail_host(message: str, details: Sequence[str], footer: Sequence[str] = ()) -> FunctionCommand:
    """A command that reports ``message`` (red), ``details`` (indented), ``footer`` (red)."""

    def report(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        host.log_styled(message, fg="red", log_func=logger.error)
        for line in details:
            logger.error(f"    {line}")
        for line in footer:
            host.log_styled(line, fg="red", log_func=logger.error)
        return False

    return FunctionCommand(report, (), {})
