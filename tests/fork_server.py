"""The real pyinfra CLI forked from a pre-imported helper process, for the lab tiers.

The unit tier forks its own test process (tests/cli_fork.py). A lab test process cannot:
its client greenlets (labhelpers.Client: traffic through the gateway during a rolling
switch) would run on in the copy and double the traffic. So each lab test process starts
one helper (``python tests/fork_server.py SOCKET``) that imports pyinfra, gevent,
paramiko and the roles once and does nothing else; for each run it forks a runner, which
forks the CLI (``cli_fork._child``: the same ``pyinfra_cli.main.main``, argv, working
directory and environment) and reports its pid, then its wait status. The run's stdout
and stderr go, interleaved, to a socket the test reads line by line as it comes: what
``subprocess.Popen(..., stdout=PIPE, stderr=STDOUT)`` gave, minus some 1.5 s of imports
a run. Every run starts from the helper's pristine state (nothing one run loads is seen
by the next), and the helper leaves when the test process does.

Other processes reach the same helper through its launcher (:attr:`ForkServer.launcher`,
an executable named ``pyinfra``): `gpuserve tune --pyinfra LAUNCHER` starts one per
candidate deploy, a stdlib-only interpreter (``-S``) that hands the helper its own
stdout and stderr, working directory and environment, forwards the signals it gets and
exits with the CLI's status, as the console script would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: the most a request (argv, working directory, environment) may take
REQUEST_BYTES = 1 << 20


class ForkedRun:
    """A started run, shaped as the ``Popen`` the lab's ``_run_echo`` reads: ``stdout``
    (text lines, stdout and stderr interleaved), ``kill()`` and ``wait()``."""

    def __init__(self, server: str, argv: Sequence[str], cwd: Path,
                 env: Mapping[str, str]):
        ours, theirs = socket.socketpair()
        os.set_blocking(theirs.fileno(), True)  # the CLI writes to it as to a pipe
        self._control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control.connect(server)
        request = {"argv": list(argv), "cwd": str(cwd), "env": dict(env)}
        socket.send_fds(self._control, [json.dumps(request).encode()], [theirs.fileno()])
        theirs.close()
        self.pid = int(json.loads(self._control.recv(4096))["pid"])
        self.stdout = ours.makefile("r", encoding="utf-8", errors="replace")
        ours.close()  # the file keeps the socket open
        self.returncode: int | None = None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        """The exit code, as ``Popen.wait`` gives it (``-N`` for signal N)."""
        if self.returncode is None:
            answer = self._control.recv(4096)
            self._control.close()
            self.stdout.close()
            # no answer: the runner itself was lost; say so as a kill would
            self.returncode = (os.waitstatus_to_exitcode(int(json.loads(answer)["status"]))
                               if answer else -signal.SIGKILL)
        return self.returncode


class ForkServer:
    """The helper process of one test process, started on first use; ``launcher``: the
    executable other processes run in place of the venv's ``pyinfra``."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="gpuserve-forks-")
        self.path = os.path.join(self._dir, "socket")
        self._proc = subprocess.Popen([sys.executable, __file__, self.path],
                                      stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not os.path.exists(self.path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the pyinfra fork server did not start "
                                   f"(exit {self._proc.poll()})")
            time.sleep(0.05)
        self.launcher = os.path.join(self._dir, "pyinfra")
        with open(self.launcher, "w") as fh:
            fh.write(f"#!{sys.executable} -S\n"
                     f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                     f"import fork_server\nfork_server.client({self.path!r}, sys.argv[1:])\n")
        os.chmod(self.launcher, 0o755)

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> ForkedRun:
        """``pyinfra *argv`` in ``cwd`` with ``env``, started."""
        return ForkedRun(self.path, argv, cwd, env)

    def close(self) -> None:
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.unlink(self.launcher)
            os.rmdir(self._dir)


def client(server: str, argv: list[str]) -> None:
    """The launcher's side: ``pyinfra *argv`` forked by the helper at ``server`` with
    this process's stdout, stderr, working directory and environment; exits as it did
    (a signal's death as ``128 + N``, as a shell reports it)."""
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    control.connect(server)
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(control, [json.dumps(request).encode()], [1, 2])
    pid = int(json.loads(control.recv(4096))["pid"])

    def forward(signum: int, _frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    answer = control.recv(4096)
    code = (os.waitstatus_to_exitcode(int(json.loads(answer)["status"])) if answer
            else -signal.SIGKILL)
    sys.exit(code if code >= 0 else 128 - code)


def _runner(conn: socket.socket, request: dict, out: int, err: int) -> None:
    """A forked runner: fork the CLI (stdout to ``out``, stderr to ``err``), report its
    pid, wait, report its status; never returns."""
    import cli_fork

    try:
        pid = os.fork()
        if pid == 0:
            conn.close()
            cli_fork._child(request["argv"], Path(request["cwd"]), request["env"], out, err)
        os.close(out)
        if err != out:
            os.close(err)
        conn.sendall(json.dumps({"pid": pid}).encode())
        delay = 0.001
        while not (done := os.waitpid(pid, os.WNOHANG))[0]:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        conn.sendall(json.dumps({"status": done[1]}).encode())
    finally:
        os._exit(0)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def serve(path: str) -> None:
    """The helper's loop: one runner per request, until the test process is gone."""
    import cli_fork

    cli_fork._warm()
    # what the console script's interpreter has first on its path (not tests/)
    sys.path[0] = str(cli_fork.PYINFRA.parent)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(8)
    listener.settimeout(1.0)
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(None)
            # one descriptor (stdout and stderr interleaved) or two
            message, fds, _, _ = socket.recv_fds(conn, REQUEST_BYTES, 2)
            if not fds:
                continue
            if os.fork() == 0:
                listener.close()
                _runner(conn, json.loads(message), fds[0], fds[-1])
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1])
