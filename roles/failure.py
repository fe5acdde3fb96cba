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
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

#: host name -> what to run when that host fails; returns lines for the report
_HOOKS: dict[str, Callable[[], list[str]]] = {}


class _HooksOnOperationError(BaseStateCallback):
    """Runs a host's pending hook when one of its operations fails without a report."""

    @staticmethod
    def operation_host_error(state, host, op_hash, retry_count: int = 0,
                             max_retries: int = 0) -> None:
        try:
            ignored = state.get_op_data_for_host(host, op_hash).global_arguments.get(
                "_ignore_errors")
        except (KeyError, AttributeError):
            ignored = False
        hook = None if ignored else _HOOKS.pop(host.name, None)
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
    _HOOKS[host_name] = hook
    state = ctx_state.get()
    if state is not None and not any(isinstance(h, _HooksOnOperationError)
                                     for h in state.callback_handlers):
        state.add_callback_handler(_HooksOnOperationError())


def clear(host_name: str) -> None:
    _HOOKS.pop(host_name, None)


def fail_report(host, message: str, details: Sequence[str],
                footer: Sequence[str] = ()) -> bool:
    """Log ``message`` (red), ``details`` (indented), ``footer`` (red), then what the
    host's failure hook did; return False (the host fails)."""
    hook = _HOOKS.pop(host.name, None)
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
