"""What every deploy script needs from pyinfra's inventory, in one place.

The deploys (``gpuserve.roles.deploys``, which ``deploy/*.py`` call) merge host data over
the roles' documented DEFAULTS, name the inventory file in error messages, and turn
gpuserve's input errors into one clean ``gpuserve: error:`` message (no traceback)
at prepare time, before any operation has run on any host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError

from gpuserve.errors import GpuserveError
from gpuserve.fleet.multinode import Member
from gpuserve.roles.base.run_context import run_context
from gpuserve.settings import settings
from gpuserve.terminal import printable


def inventory_source() -> str:
    """The inventory file this host came from, for error messages."""
    given = run_context().inventory_file  # pyinfra's CLI's own parsed argument
    if given:
        path = Path(given)
        if path.suffix == ".py" and path.stem in host.groups and path.is_file():
            return given
    return f"inventory (host {host.name})"


def host_data(*defaults: dict) -> dict:
    """The roles' DEFAULTS, overridden by this host's data for the keys they document."""
    return settings(host.data.dict(), *defaults)


def group_members(name: str) -> list[Member] | None:
    """The hosts of inventory group ``name`` in the inventory's order, with their data
    (None when there is no such group): a multi-node launch's ranks follow this order."""
    hosts = inventory.get_group(name, default=None)
    if hosts is None:
        return None
    return [Member(h.name, h.data.dict()) for h in hosts]


def packaged_deploy(func: Callable[..., None]) -> Callable[..., None]:
    """``@deploy`` for the deploys a pyinfra project calls (``gpuserve.roles.deploys``).

    A GpuserveError becomes one ``gpuserve: error:`` message (no traceback, details on
    indented lines), raised at prepare time before any operation has run: under
    pyinfra's CLI printed alone and the run exits 2, through pyinfra's API a
    PyinfraError. The deploy's own name is left empty: pyinfra puts
    an enclosing deploy's name before every operation's (``Serve SGLang | Install SGLang
    | ...``), and the output, which the lab tests and users read, names the roles alone.
    """

    @functools.wraps(func)
    def guarded(*args, **kwargs) -> None:
        try:
            func(*args, **kwargs)
        except GpuserveError as exc:
            text = "\n".join(printable(line) for line in str(exc).split("\n"))
            if run_context().inventory_file is None:  # pyinfra's API: the caller handles it
                raise PyinfraError(f"gpuserve: error: {text}") from None
            # pyinfra's CLI would print "pyinfra error in roles/base/inventory.py line N:"
            # before it, which reads as a crash of this file: the message alone, then exit
            # (pyinfra still disconnects, in its finally)
            logger.error(f"gpuserve: error: {text}")
            raise SystemExit(2) from None

    wrapped = deploy()(guarded)
    guarded.deploy_name = ""  # read by pyinfra when the deploy is called
    return wrapped
