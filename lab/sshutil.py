"""Running ssh against an instance with the lab's key and pinned known_hosts."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from lab.state import InstanceState, instance_dir, read_state

#: Seconds a shared connection outlives its last command (``ControlPersist``).
MUX_PERSIST_S = 60
# A unix socket's path is at most 107 bytes, and ssh first binds the path plus a
# 17-character random suffix.
_MUX_PATH_MAX = 80


def ssh_argv(port: int, key: Path | str, known_hosts: Path | str,
             connect_timeout: int = 10, mux: Path | None = None) -> list[str]:
    """OpenSSH options that trust only the pinned host key (never accept-new); with
    ``mux``, commands share one login through that control socket (:func:`mux_path`)."""
    shared = [] if mux is None else [
        "-o", "ControlMaster=auto", "-o", f"ControlPath={mux}",
        "-o", f"ControlPersist={MUX_PERSIST_S}",
        # a master whose guest went away without a reset ends within 15 s
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
    ]
    return [
        "ssh", "-p", str(port), "-i", str(key),
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "LogLevel=ERROR",
        *shared,
        "root@127.0.0.1",
    ]


def mux_path(st: InstanceState | str) -> Path | None:
    """The instance's control socket for shared logins (None where its path is too long
    for a unix socket: each command then logs in by itself).

    Why: a login costs the lab VM's guest about a second of emulated CPU (sshd's re-exec,
    key exchange, PAM and logind under TCG), a command over a shared one almost none;
    the tests run some hundred and fifty of them on the VM. Only commands share it:
    :func:`ssh_ok` always logs in, since only a real login says sshd answers."""
    path = instance_dir(st if isinstance(st, str) else st.name) / "ssh.mux"
    return path if len(str(path)) <= _MUX_PATH_MAX else None


def instance_ssh(st: InstanceState) -> list[str]:
    """``ssh ... root@127.0.0.1`` for the instance, sharing its login (append the
    command)."""
    return ssh_argv(st.ssh_port, st.ssh_key, st.known_hosts, mux=mux_path(st))


def close_mux(name: str) -> None:
    """End instance ``name``'s shared login, if one runs: before it goes down, and before
    a new boot of that name (a login left from a host that crashed must not carry the
    new host's commands)."""
    path = mux_path(name)
    if path is None or not path.exists():
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", "root@127.0.0.1"],
                       capture_output=True, timeout=10)


def ssh_ok(port: int, key: Path | str, known_hosts: Path | str, timeout: float = 15) -> bool:
    """True when sshd in the guest answers and runs a command (a forwarded port alone
    accepts TCP before the guest is up, so only a real login counts)."""
    try:
        r = subprocess.run([*ssh_argv(port, key, known_hosts, connect_timeout=int(timeout)),
                            "true"], capture_output=True, timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def run_in(st: InstanceState | str, command: str, timeout: float = 120,
           check: bool = True) -> str:
    """Run ``command`` as root in the guest of instance ``st`` (its state, or its name);
    return its stdout. RuntimeError when the named instance is not running, and, with
    ``check``, when the command fails (naming instance, command and exit status)."""
    if isinstance(st, str):
        name, st = st, read_state(st)
        if st is None:
            raise RuntimeError(f"lab instance {name!r} is not running: `python -m lab up "
                               f"--name {name}` first")
    r = subprocess.run([*instance_ssh(st), command], capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{st.name}: `{command[:200]}` failed ({r.returncode}): "
                           f"{r.stderr.strip()[-400:]}")
    return r.stdout
