"""Shared by the unit tier: pytest puts this directory on sys.path (its "prepend"
import mode, for a conftest.py outside any package), so every unit test module can
``import systemd_words``.

``fake_deploy``: one pyinfra @fake harness. A deploy (or a role's @deploy) is prepared
on a fake host whose commands answer from ``responses`` (pyinfra's ``fake_responses``:
a substring or ``re.Pattern`` of the command -> its stdout lines, or a dict with
``stdout``/``stderr``/``success``), and what it would run comes back as
``[(operation name, [command, ...])]`` in the order pyinfra would execute them.
``fake_op``: one operation added and executed on such a host (pyinfra's real execution
path), its meta and the commands it ran. Helpers outside a test import them
(``from tests.unit.conftest import prepare_fake, run_fake_op``).
"""

from __future__ import annotations

import contextlib
import io
import shlex
from collections.abc import Callable

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

#: The fake host's name (``host.name`` inside the deploy).
FAKE_HOST = "@fake/gpu1"


class FakeOps(list):
    """``[(operation name, [command, ...])]``; a command is ``("run", text)``,
    ``("upload", dest, text)`` (a file put or written from stdin) or ``("function",
    name)``. ``state`` and ``host`` are the prepared pyinfra state and fake host."""

    state: State
    host: object

    def runs(self) -> list[str]:
        """Every shell command's text, in order."""
        return [c[1] for _, cmds in self for c in cmds if c[0] == "run"]

    def uploads(self) -> dict[str, str]:
        """Each uploaded (or stdin-written) path's text."""
        return {c[1]: c[2] for _, cmds in self for c in cmds if c[0] == "upload"}

    def names(self) -> list[str]:
        """The operations' names, in order."""
        return [name for name, _ in self]


def _summary(cmd) -> tuple | None:
    """One command as the harness reports it (None: a kind it does not report)."""
    if isinstance(cmd, FileUploadCommand):
        src = cmd.src
        data = src.getvalue() if isinstance(src, io.StringIO) else src
        if isinstance(data, io.BytesIO):
            data = data.getvalue().decode()
        return ("upload", cmd.dest, data)
    if isinstance(cmd, FunctionCommand):
        return ("function", cmd.function.__name__)
    if isinstance(cmd, StringCommand) and cmd.connector_arguments.get("_stdin"):
        # roles/base/managed.py writes a file from stdin: tmp, chown, chmod, mv
        script = shlex.split(cmd.get_raw_value())[-1]
        return ("upload", shlex.split(script)[-1], cmd.connector_arguments["_stdin"])
    if isinstance(cmd, StringCommand):
        return ("run", cmd.get_raw_value())
    return None


def prepare_fake(deploy: Callable, responses: dict, data: dict | None = None, *args,
                 host: str = FAKE_HOST, config: Config | None = None,
                 setup: Callable[[State], None] | None = None,
                 others: dict[str, dict] | None = None,
                 groups: dict[str, list[str]] | None = None, **kwargs) -> FakeOps:
    """Prepare ``deploy(*args, **kwargs)`` on the @fake host ``host`` with host data
    ``data`` (``setup(state)`` runs before it, e.g. to mark the run ``--dry``).
    ``others``: more hosts of the inventory (name -> host data; the deploy does not run
    on them), ``groups``: inventory groups (name -> host names)."""
    fake = {"fake_responses": {**responses, "uname -s": ["Linux"]}, "fake_delay": 0,
            "fake_delay_jitter": 0}
    hosts = [(host, {**(data or {}), **fake}),
             *((name, {**other, **fake}) for name, other in (others or {}).items())]
    inventory = Inventory((hosts, {}), **{g: (names, {}) for g, names in
                                           (groups or {}).items()})
    state = State(inventory=inventory, config=config or Config())
    connect_all(state)
    if setup is not None:
        setup(state)
    with ctx_inventory.use(inventory):  # what pyinfra's CLI sets (roles read the fleet)
        add_deploy(state, deploy, *args, host=inventory.get_host(host), **kwargs)
    fake = inventory.get_host(host)
    out = FakeOps()
    with ctx_state.use(state), ctx_host.use(fake):
        for op_hash in state.get_op_order():
            name = ", ".join(sorted(state.get_op_meta(op_hash).names))
            commands = [s for cmd in state.get_op_data_for_host(fake, op_hash)
                        .command_generator() if (s := _summary(cmd)) is not None]
            out.append((name, commands))
    out.state, out.host = state, fake
    return out


@pytest.fixture
def fake_deploy() -> Callable[..., FakeOps]:
    """``fake_deploy(deploy, responses, data, *args, **kwargs)``: :func:`prepare_fake`."""
    return prepare_fake


def run_fake_op(op: Callable, responses: dict, data: dict | None = None, *,
                pyinfra_config: Config | None = None,
                before_op: Callable[[State], None] | None = None,
                **kwargs) -> tuple[object, list[str]]:
    """Add and *execute* the one operation ``op(**kwargs)`` on an @fake host whose
    commands answer from ``responses``: (its operation meta, every command executed, as
    text). ``before_op(state)`` adds operations ahead of it; ``pyinfra_config`` is the
    run's Config (names an operation's own arguments do not use). A failed host is the meta's
    to tell (pyinfra's "No hosts remaining!" is swallowed)."""
    inventory = Inventory((["@fake"], {**(data or {}), "fake_responses": responses,
                                       "fake_delay": 0}))
    state = State(inventory, pyinfra_config or Config())
    connect_all(state)
    if before_op is not None:
        before_op(state)
    meta = next(iter(add_op(state, op, **kwargs).values()))
    with contextlib.suppress(PyinfraError):
        run_ops(state)
    host = next(iter(inventory))
    return meta, [str(c) for c in host.connector.executed_commands]


@pytest.fixture
def fake_op() -> Callable[..., tuple[object, list[str]]]:
    """``fake_op(op, responses, data, **kwargs)``: :func:`run_fake_op`."""
    return run_fake_op
