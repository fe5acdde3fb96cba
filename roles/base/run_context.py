"""One pyinfra run's own state, shared by its hosts and operations, in one object.

What a deploy keeps between prepare and execute time, or between hosts, lives here and
nowhere else: per host the prefetched reads, the smoke request waiting for its check and
the hook to run on failure; per run the gateways' plans, the workers that restart behind
each gateway, and the command line pyinfra's CLI parsed (the inventory file, ``--serial``,
``--dry``, ``--diff``). It is keyed by the run (pyinfra's ``State``), so two runs in one
process (``gpuserve check``, tests, an API user's loop) never see each other's hosts.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from gpuserve.facts.compat import cli_params, current_state


@dataclass
class HostContext:
    """One host's part of the run (each field is owned by the module named)."""

    reads: Any = None  # gpuserve.roles.base.prefetch: the batch's values
    smoke: Any = None  # gpuserve.roles.checks: the smoke request the gate made
    on_failure: Any = None  # gpuserve.roles.base.failure: what to run when the host fails
    serve_input: Any = None  # gpuserve.roles.deploys.serve: the host's parsed ServeInput
    serve_plan: Any = None  # gpuserve.roles.deploys.serve: the host's ServePlan
    planned: Any = None  # gpuserve.roles.base.planned: what a dry run notes it would change


@dataclass
class RunContext:
    """One run: its command line and its hosts' contexts."""

    inventory_file: str | None = None
    serial: bool = False
    dry: bool = False
    diff: bool = False
    hosts: dict[str, HostContext] = field(default_factory=dict)
    router_plans: dict[str, Any] = field(default_factory=dict)  # gateway -> RouterPlan
    restarting: dict[str, list[str]] = field(default_factory=dict)  # gateway -> workers

    def host(self, name: str) -> HostContext:
        """``name``'s context, made on first use."""
        return self.hosts.setdefault(name, HostContext())


_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_OUTSIDE = RunContext()  # roles called without a pyinfra run (unit tests of a role)


def run_context(state: Any = None) -> RunContext:
    """The context of the pyinfra run in progress, or of ``state`` (made on first use,
    from the command line its CLI parsed; as a library, without one: no file, no flags)."""
    state = state if state is not None else current_state()
    if state is None:
        return _OUTSIDE
    found = _RUNS.get(state)
    if found is None:
        params = cli_params()
        inventory = params.get("inventory")
        found = RunContext(inventory_file=inventory if isinstance(inventory, str) else None,
                           serial=bool(params.get("serial")), dry=bool(params.get("dry")),
                           diff=bool(params.get("diff")))
        _RUNS[state] = found
    return found
