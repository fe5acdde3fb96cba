"""Every use of pyinfra's internals, in one place.

pyinfra's documented API (``host``, ``state.is_executing``, ``host.get_fact``,
``@operation``, ``@deploy``, facts) is used directly everywhere. What it does not
document, and what may change between its minor releases, goes through this module
only: the run's state and inventory objects, its callback handlers, the operation
metadata of a run, its CLI's inventory loader and its parsed command line. Each was
read from pyinfra 3.10's own code; pyproject.toml pins pyinfra to 3.10.x, the versions
tested, so a newer pyinfra is a change made here first. docs/architecture.md, "pyinfra".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_inventory, ctx_state

__all__ = ["BaseStateCallback", "add_state_callback", "add_state_callback_at_init",
           "changed_on_host", "cli_params",
           "current_inventory", "current_state", "failed_host_names", "inventory_groups",
           "known_connector_keys", "load_inventory", "op_global_argument", "parse_cli_value",
           "sort_active_hosts"]


def current_state() -> Any | None:
    """The running pyinfra ``State`` (None outside a run)."""
    return ctx_state.get() if ctx_state.isset() else None


def current_inventory() -> Any | None:
    """The running pyinfra ``Inventory`` (None outside a run)."""
    return ctx_inventory.get() if ctx_inventory.isset() else None


def cli_params() -> dict[str, Any]:
    """The command line of this run as pyinfra's CLI parses it (its click parameters:
    ``inventory``, ``serial``, ``dry``, ``diff`` ...); {} when pyinfra runs as a library.

    From the CLI's click context where it is visible; deploy files run in gevent
    greenlets, which do not see it, so there the process's arguments go through the
    CLI's own click command (``resilient_parsing``: parsing only, no callbacks)."""
    import sys

    import click

    context = click.get_current_context(silent=True)
    if context is not None and "inventory" in context.params:
        return dict(context.params)
    program = sys.argv[0].replace("\\", "/") if sys.argv else ""
    if not (program.endswith("/pyinfra") or program == "pyinfra"
            or program.endswith(("pyinfra/__main__.py", "pyinfra_cli/__main__.py"))):
        return {}  # not pyinfra's CLI: a library user's own program
    from pyinfra_cli.cli import cli

    try:
        parsed = cli.make_context("pyinfra", sys.argv[1:], resilient_parsing=True)
    except click.ClickException:
        return {}
    return dict(parsed.params)


def add_state_callback(state: Any, handler_type: type, make: Callable[[], Any]) -> None:
    """Add ``make()`` to the state's callback handlers unless one of ``handler_type``
    is there already."""
    if not any(isinstance(h, handler_type) for h in state.callback_handlers):
        state.add_callback_handler(make())


def add_state_callback_at_init(state: Any, handler_type: type, make: Callable[[], Any]
                               ) -> None:
    """:func:`add_state_callback` once pyinfra initialises ``state`` (its ``init`` makes
    the handler list; the CLI loads ``config.py`` before that, and connects after)."""
    if hasattr(state, "callback_handlers"):
        add_state_callback(state, handler_type, make)
        return
    original = state.init

    def init(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        add_state_callback(state, handler_type, make)
        return result

    state.init = init


def op_global_argument(state: Any, host: Any, op_hash: str, name: str) -> Any:
    """A global argument (``_ignore_errors`` ...) of one operation on one host; None
    when the operation or the argument is unknown."""
    try:
        return state.get_op_data_for_host(host, op_hash).global_arguments.get(name)
    except (KeyError, AttributeError):
        return None


def changed_on_host(state: Any, host: Any) -> bool:
    """Whether a completed operation of this run has changed ``host`` (at execute time:
    pyinfra's own prepare-time count stays 0 on a run without change detection)."""
    for op_hash in host.op_hash_order:
        data = state.ops.get(host, {}).get(op_hash)
        meta = data.operation_meta if data is not None else None
        if meta is not None and meta.is_complete() and meta.did_change():
            return True
    return False


def failed_host_names(state: Any) -> set[str]:
    """The hosts that failed so far in this run."""
    return {h.name for h in state.failed_hosts}


def sort_active_hosts(state: Any, key: Callable[[Any], Any]) -> None:
    """Make pyinfra go through its active hosts (a set, iterated in hash order by
    ``--serial``) in ``key`` order. Only iteration changes; pyinfra's in-place set
    operations keep the type."""
    hosts = getattr(state, "active_hosts", None)  # set by pyinfra once hosts connect
    if hosts is not None and not isinstance(hosts, _Ordered):
        state.active_hosts = _Ordered(hosts, key)


class _Ordered(set):
    def __init__(self, hosts, key: Callable[[Any], Any]):
        super().__init__(hosts)
        self.key = key

    def __iter__(self):
        return iter(sorted(set.__iter__(self), key=self.key))


def parse_cli_value(value: str) -> Any:
    """A ``--data k=v`` value as pyinfra's CLI reads it (true/false, numbers, JSON)."""
    from pyinfra_cli.util import parse_cli_arg

    return parse_cli_arg(value)


def inventory_groups(inventory: str) -> dict:
    """An inventory file's groups, read by pyinfra's CLI reader."""
    from pyinfra_cli.inventory import _get_groups_from_filename

    return _get_groups_from_filename(inventory)


def load_inventory(inventory: str, overrides: dict, cwd: str, group_data: list[str] | None,
                   check: Callable[[], None] = lambda: None) -> Any:
    """An inventory loaded by pyinfra's CLI loader under a fresh state, connecting to
    no host; ``check`` runs first under the same state."""
    from pyinfra.api.state import State
    from pyinfra_cli.inventory import make_inventory

    state = State(check_for_changes=False)
    state.cwd = cwd
    with ctx_state.use(state):
        check()
        return make_inventory(inventory, override_data=overrides or None, cwd=cwd,
                              group_data_directories=group_data or None)


def known_connector_keys() -> set[str]:
    """The host-data keys pyinfra's connectors document (``ssh_user`` ...)."""
    from pyinfra.api.connectors import get_all_connectors

    known: set[str] = set()
    for connector in get_all_connectors().values():
        known |= set(getattr(connector, "data_meta", None) or {})
    return known
