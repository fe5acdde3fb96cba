"""Connection failures in one readable line, with their cause and one fix.

Why: pyinfra 3.10 turns a missing ``ssh_key`` file into a gevent greenlet traceback (its
SSH connector raises a plain PyinfraError while it connects), and an unreachable host
into ``No hosts remaining!`` under a line of paramiko's words. Installed by the
repository's ``config.py``, which pyinfra's CLI loads before it connects (its
``--config``, default ``config.py`` in the working directory), so it covers every
deploy run from the repository. The cause and fix come from
``gpuserve.commands._readonly.connection_cause``, the same words ``gpuserve logs`` and
``gpuserve render`` give.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.exceptions import ConnectError, PyinfraError

from gpuserve.commands._readonly import connection_cause
from gpuserve.facts.compat import BaseStateCallback, add_state_callback_at_init, current_state


class _ReadableConnect(BaseStateCallback):
    """Turns a connector's plain error into a ConnectError (pyinfra logs it as the
    host's one red line instead of a traceback), and adds the cause with one fix."""

    @staticmethod
    def host_before_connect(state, host) -> None:
        connector = host.connector
        if getattr(connector, "_gpuserve_readable", False):
            return
        original = connector.connect

        def connect(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except ConnectError:
                raise
            except PyinfraError as exc:  # e.g. "No such private key file: PATH"
                raise ConnectError(str(exc)) from None

        connector.connect = connect
        connector._gpuserve_readable = True

    @staticmethod
    def host_connect_error(state, host, error) -> None:
        text = str(error.args[0] if getattr(error, "args", None) else error)
        logger.error(f"gpuserve: error: {host.name}: unreachable: {connection_cause(text)}")


def readable_connections() -> None:
    """Install the callbacks on the running pyinfra state (nothing outside a run)."""
    state = current_state()
    if state is not None:
        add_state_callback_at_init(state, _ReadableConnect, _ReadableConnect)
