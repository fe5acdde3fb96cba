"""The lab mirror: a threaded static HTTP server on 127.0.0.1 for the guest.

The guest reaches it at ``http://10.0.2.2:<port>/`` (QEMU's user network forwards its
host alias 10.0.2.2 to the controller's loopback), so nothing leaves the machine.
Layout (docs/architecture.md, "Lab"): ``wheels/`` (pip find-links), ``pypi/`` (the
real PyPI wheels of the gateway's lock, find-links of the router deploy) and
``cuda/repos/debian12/x86_64/`` and ``cuda/repos/debian13/x86_64/`` (NVIDIA-layout apt
repositories, lab/nvidia_repo), ``python-builds/``
(the managed-CPython stand-in, lab/python_standin.py), each filled by a
publisher module ``lab.<name>.publish(mirror_root: Path)`` before serving; ``locks/``
holds the lab's SGLang locks, generated from ``wheels/`` (read on the controller
through inventory/lab.py's ``sglang_locks_dir``; the guest never needs them).

Every instance of one checkout serves the same published tree (:func:`shared_root`,
``$GPUSERVE_LAB_HOME/mirrors/<checkout>/``), each through a server process of its own.

Run as ``python -m lab.mirror --root DIR --port-file FILE``: it binds port 0 itself
and writes the port it got, so there is no window between picking and binding.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import importlib
import logging
import os
import signal
import subprocess
import sys
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Order matters: lab.locks runs tools/gen_lock.py over the wheels the stand-ins wrote.
# "module:function" names a publisher other than the module's ``publish``.
# lab.locks:publish_pypi downloads the real PyPI wheels of the gateway's (smg) lock into
# pypi/, each checked against the lock's sha256.
# lab.hub.publish composes the Hub stand-in's repositories into hub/ (lab/hub/README.md).
# lab.locks:publish_hub_client puts the real huggingface-hub closure into wheels/ first.
# lab.locks:publish_uv puts the pinned uv wheel into wheels/ and pypi/ (every venv's
# installer, found through the deploy's find-links).
PUBLISHERS = ("lab.torch_standin", "lab.sglang_standin", "lab.locks:publish_hub_client",
              "lab.locks:publish_uv", "lab.nvidia_repo", "lab.locks",
              "lab.gate_tools", "lab.locks:publish_pypi", "lab.hub.publish",
              "lab.python_standin")
LAYOUT = ("wheels", "cuda/repos/debian12/x86_64", "cuda/repos/debian13/x86_64", "pypi", "hub",
          "python-builds")
REPO_ROOT = Path(__file__).resolve().parent.parent

log = logging.getLogger("lab.mirror")


def shared_root() -> Path:
    """The mirror every instance of this checkout serves: one per lab home and checkout
    (another checkout may carry other stand-ins), so a new host costs no publishing."""
    from lab.state import lab_home

    checkout = hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:12]
    return lab_home() / "mirrors" / checkout


def publish_shared(warn=print) -> Path:
    """Bring the shared mirror up to date with this checkout, one publisher run at a time
    (two `lab up` side by side wait for each other; the second finds nothing to do)."""
    root = shared_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            publish_all(root, warn=warn)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return root


def publish_all(mirror_root: Path, warn=print) -> list[str]:
    """Create the layout and run every publisher that exists; return those that ran.

    A publisher module that does not exist yet is skipped with a warning; one that
    exists but fails raises, naming it (a half-published mirror would only fail later
    and less clearly inside the guest).
    """
    for sub in LAYOUT:
        (mirror_root / sub).mkdir(parents=True, exist_ok=True)
    ran = []
    for entry in PUBLISHERS:
        modname, _, funcname = entry.partition(":")
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name is not None and modname.startswith(exc.name):
                warn(f"lab: warning: publisher {modname} does not exist yet; skipped")
                continue
            raise
        publish = getattr(mod, funcname or "publish", None)
        if publish is None:
            warn(f"lab: warning: {modname} has no {funcname or 'publish'}(mirror_root); "
                 "skipped")
            continue
        try:
            publish(mirror_root)
        except Exception as exc:
            raise RuntimeError(f"publisher {modname}.{funcname or 'publish'} failed: "
                               f"{exc}") from exc
        ran.append(entry)
    return ran


class _Handler(SimpleHTTPRequestHandler):
    """Static files, except ``/hub/...``: the Hub stand-in (lab.hub.server) over ``hub/``."""

    hub = None  # a lab.hub.server.Hub, set by serve()

    def _hub_path(self) -> bool:
        from lab.hub import PREFIX

        path = self.path.partition("?")[0]
        return self.hub is not None and (path == PREFIX or path.startswith(PREFIX + "/"))

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        if self._hub_path():
            from lab.hub.server import handle

            return handle(self.hub, self, "GET")
        return super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        if self._hub_path():
            from lab.hub.server import handle

            return handle(self.hub, self, "HEAD")
        return super().do_HEAD()

    def do_POST(self) -> None:  # noqa: N802 (the Hub stand-in's /hub/_lab/ knobs)
        if self._hub_path():
            from lab.hub.server import handle

            return handle(self.hub, self, "POST")
        self.send_error(405)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib signature)
        log.info("%s %s", self.address_string(), format % args)


def serve(root: Path, port_file: Path, host: str = "127.0.0.1", port: int = 0) -> None:
    from lab.hub import PREFIX
    from lab.hub.server import Hub

    hub = Hub(root / "hub", prefix=PREFIX)
    handler = functools.partial(type("MirrorHandler", (_Handler,), {"hub": hub}),
                                directory=str(root))
    httpd = ThreadingHTTPServer((host, port), handler)
    httpd.daemon_threads = True
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(httpd.server_address[1]))
    os.replace(tmp, port_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()


def start(root: Path, workdir: Path, timeout: float = 10.0) -> tuple[int, int]:
    """Start the server in the background (own session, outlives `lab up`).

    Returns (pid, port).
    """
    port_file = workdir / "mirror.port"
    port_file.unlink(missing_ok=True)
    logf = open(workdir / "mirror.log", "ab")  # noqa: SIM115 (handed to the child)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.mirror", "--root", str(root),
         "--port-file", str(port_file)],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=REPO_ROOT, env=env,
        start_new_session=True,
    )
    logf.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists():
            return proc.pid, int(port_file.read_text())
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the mirror did not start; see {workdir / 'mirror.log'}")


def stop(pid: int) -> None:
    from lab.state import pid_alive

    if not pid_alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.mirror")
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--port-file", type=Path, required=True)
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    serve(a.root, a.port_file, port=a.port)


if __name__ == "__main__":
    main()
