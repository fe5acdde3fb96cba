"""The real pyinfra CLI, run in a forked copy of the test process instead of a new
interpreter: the same ``pyinfra_cli.main.main`` with the same argv, working directory and
environment, its stdout, stderr and exit status returned as ``subprocess.run`` returns
them. Why: a fresh ``pyinfra`` process spends most of its CPU importing pyinfra, gevent,
paramiko and gpuserve before it reads the inventory (about 0.8 s of 1.6 s on the 2-core
CI machine); the fork has them already. The child is a process of its own (its global
state, the deploy's modules, gevent's monkey-patching and pyinfra's logging handlers stay
there), it leaves through ``os._exit`` (no atexit handler of the test process runs twice)
and it is killed at the timeout, where ``subprocess.TimeoutExpired`` is raised as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Where the tests would have found the executable (what ``argv[0]`` says in the child).
PYINFRA = Path(sys.executable).with_name("pyinfra")


def _child(argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None,
           out: int, err: int) -> None:
    """The forked side: pyinfra's CLI as its console script runs it; never returns."""
    code = 1
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False, errors="replace")  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, errors="replace")  # noqa: SIM115
        sys.stdin = open(os.devnull)  # noqa: SIM115
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [str(PYINFRA), *argv]
        from pyinfra_cli import util
        from pyinfra_cli.main import main

        util.PYTHON_CODES.clear()  # compiled inventories and deploys by file name, as new
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print before exiting 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # nothing left to report it to
                stream.flush()
        os._exit(code)


def run_pyinfra(argv: Sequence[str], cwd: Path, *, timeout: float = 120,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``pyinfra *argv`` in ``cwd``, as ``subprocess.run(..., capture_output=True,
    text=True, timeout=timeout)`` would return it."""
    _warm()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(argv, cwd, env, out.fileno(), err.fileno())
        status = _wait(pid, timeout, argv)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            [str(PYINFRA), *argv], os.waitstatus_to_exitcode(status),
            out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def _warm() -> None:
    """Import what every run imports, once, in the test process (the forks share it).
    pyinfra's CLI package monkey-patches the process for gevent on import, as it does in
    the unit tier anyway (tests/unit/fleet imports it at collection)."""
    import pyinfra_cli.main  # noqa: F401

    import gpuserve.roles.deploys  # noqa: F401


def _wait(pid: int, timeout: float, argv: Sequence[str]) -> int:
    """The child's wait status; killed and ``TimeoutExpired`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired([str(PYINFRA), *argv], timeout)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def forked_subprocess() -> types.SimpleNamespace:
    """A stand-in for the ``subprocess`` module of a command that starts the pyinfra CLI
    (gpuserve/commands/_readonly.py, through ``monkeypatch``): ``run`` of this
    environment's pyinfra goes through :func:`run_pyinfra` in the current directory;
    everything else is subprocess's own."""

    def run(argv, **kwargs):
        if not argv or argv[0] != str(PYINFRA):
            return subprocess.run(argv, **kwargs)
        return run_pyinfra(argv[1:], Path.cwd(), timeout=kwargs.get("timeout") or 120,
                           env=kwargs.get("env"))

    names = {name: getattr(subprocess, name) for name in subprocess.__all__}
    return types.SimpleNamespace(**{**names, "run": run})
