"""roles/base/failure: a host's pending hook (a rolling switch's put-back) runs when the host
fails, whether through a failure report or an ordinary operation failing (a command's
non-zero exit), and only once. Real pyinfra operations on the @local connector."""

from __future__ import annotations

import logging

import pytest
from pyinfra import host as context_host
from pyinfra.api import Config, FunctionCommand, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.operations import server

from gpuserve.roles.base import failure
from gpuserve.roles.base.run_context import run_context


def _state() -> State:
    state = State(Inventory((["@local"], {})), Config())
    state.current_stage = StateStage.Connect
    connect_all(state)
    state.current_stage = StateStage.Prepare
    return state


def _register(calls: list[str]):
    def hook_setter(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        # the hook reads pyinfra's context host, as the rolling switch's put-back does
        failure.on_failure(host.name, lambda: calls.append(context_host.name)
                           or ["put back: yes"])
        return True

    return FunctionCommand(hook_setter, (), {})


def _execute_time(state: State, index: int, command: FunctionCommand) -> None:
    """Operation ``index`` yields ``command`` when it runs (as the take-out and the
    checks decide at execute time)."""
    host = state.inventory.get_host("@local")
    state.ops[host][state.get_op_order()[index]].command_generator = lambda: iter([command])


@pytest.fixture
def calls() -> list[str]:
    return []


def _pending(state: State):
    """The hook the run's context holds for @local (None: none pending)."""
    return run_context(state).host("@local").on_failure


def test_an_ordinary_command_failing_runs_the_pending_hook(calls, caplog) -> None:
    state = _state()
    add_op(state, server.shell, name="register", commands=[])
    _execute_time(state, 0, _register(calls))
    add_op(state, server.shell, name="restart fails", commands=["exit 3"])
    add_op(state, server.shell, name="never runs", commands=["true"])
    state.current_stage = StateStage.Execute
    with caplog.at_level(logging.ERROR), pytest.raises(PyinfraError, match="No hosts"):
        run_ops(state)
    assert calls == ["@local"]
    assert "put back: yes" in caplog.text
    assert _pending(state) is None


def test_a_failure_report_runs_the_hook_once(calls) -> None:
    state = _state()
    add_op(state, server.shell, name="register", commands=[])
    _execute_time(state, 0, _register(calls))
    add_op(state, server.shell, name="check", commands=[])
    _execute_time(state, 1, failure.fail_host("smoke: no answer", []))
    state.current_stage = StateStage.Execute
    with pytest.raises(PyinfraError, match="No hosts"):
        run_ops(state)
    assert calls == ["@local"]  # from the report; the operation error found no hook left


def test_an_ignored_error_keeps_the_hook(calls) -> None:
    state = _state()
    add_op(state, server.shell, name="register", commands=[])
    _execute_time(state, 0, _register(calls))
    add_op(state, server.shell, name="may fail", commands=["exit 1"], _ignore_errors=True)
    state.current_stage = StateStage.Execute
    run_ops(state)
    assert calls == [] and _pending(state) is not None


def test_a_hook_that_raises_is_reported_and_does_not_end_the_run(calls, caplog) -> None:
    def broken(state, host) -> bool:  # noqa: ARG001
        failure.on_failure(host.name, lambda: 1 / 0)
        return True

    state = _state()
    add_op(state, server.shell, name="register", commands=[])
    _execute_time(state, 0, FunctionCommand(broken, (), {}))
    add_op(state, server.shell, name="restart fails", commands=["exit 3"])
    state.current_stage = StateStage.Execute
    with caplog.at_level(logging.ERROR), pytest.raises(PyinfraError, match="No hosts"):
        run_ops(state)  # pyinfra's own end of a run without hosts, not ZeroDivisionError
    assert "failed too: ZeroDivisionError: division by zero" in caplog.text
