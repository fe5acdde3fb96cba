"""Failing a host from inside an operation, with the reason in pyinfra's output.

The checks and the venv verification judge at execute time from facts; when they fail
they yield this one command, which logs the reason and returns False, so pyinfra fails
the host (non-zero exit) without a shell command that could itself print secrets.

Hooks (:func:`on_failure`): an operation that leaves the host in a state a failure must
undo registers a hook; the next failure report of that host runs it and prints what it
did. A rolling switch uses one to put a worker back into its gateway once a failed
switch was rolled back (roles/router/rolling.py). A failure that is not one of these
reports (a command of an ordinary operation failing, e.g. ``systemctl restart``) runs
the hook too, from pyinfra's ``operation_host_error`` callback, so a worker is never left
out of its gateway unsaid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyinfra import logger
from pyinfra.api import FunctionCommand

from gpuserve.facts.compat import (
    BaseStateCallback,
    add_state_callback,
    current_state,
    op_global_argument,
)
from gpuserve.roles.base.run_context import run_context


def _take_hook(host_name: str) -> Callable[[], list[str]] | None:
    """The host's pending hook (the run's context holds it), removed."""
    mine = run_context().host(host_name)
    hook, mine.on_failure = mine.on_failure, None
    return hook


class _HooksOnOperationError(BaseStateCallback):
    """Runs a host's pending hook when one of its operations fails without a report."""

    @staticmethod
    def operation_host_error(state, host, op_hash, retry_count: int = 0,
                             max_retries: int = 0) -> None:
        ignored = op_global_argument(state, host, op_hash, "_ignore_errors")
        hook = None if ignored else _take_hook(host.name)
        if hook is None:
            return
        for line in _run(hook):
            host.log_styled(line, fg="red", log_func=logger.error)


def _run(hook: Callable[[], list[str]]) -> list[str]:
    """The hook's report lines; one line saying what went wrong when it raised (pyinfra
    runs callbacks outside its own error handling: an exception would end the run for
    every host)."""
    try:
        return list(hook())
    except Exception as exc:  # noqa: BLE001 - reported, never raised out of a failure path
        return [f"after the failure, undoing what this run left half done failed too: "
                f"{type(exc).__name__}: {exc}"]


def on_failure(host_name: str, hook: Callable[[], list[str]]) -> None:
    """Run ``hook`` when ``host_name`` next fails (one hook per host: the latest): from
    its next failure report, or when one of its operations fails."""
    run_context().host(host_name).on_failure = hook
    state = current_state()
    if state is not None:
        add_state_callback(state, _HooksOnOperationError, _HooksOnOperationError)


def clear(host_name: str) -> None:
    run_context().host(host_name).on_failure = None


def fail_report(host, message: str, details: Sequence[str],
                footer: Sequence[str] = ()) -> bool:
    """Log ``message`` (red), ``details`` (indented), ``footer`` (red), then what the
    host's failure hook did; return False (the host fails)."""
    hook = _take_hook(host.name)
    after = _run(hook) if hook is not None else []
    host.log_styled(message, fg="red", log_func=logger.error)
    for line in details:
        logger.error(f"    {line}")
    for line in (*footer, *after):
        host.log_styled(line, fg="red", log_func=logger.error)
    return False


def fail_host(message: str, details: Sequence[str], footer: Sequence[str] = ()) -> FunctionCommand:
    """A command that reports ``message`` (red), ``details`` (indented), ``footer`` (red)."""

    def report(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        return fail_report(host, message, details, footer)

    return FunctionCommand(report, (), {})
