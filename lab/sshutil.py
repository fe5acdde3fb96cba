"""Running ssh against an instance with the lab's key and pinned known_hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lab.state import InstanceState, read_state


def ssh_argv(port: int, key: Path | str, known_hosts: Path | str,
             connect_timeout: int = 10) -> list[str]:
    """OpenSSH options that trust only the pinned host key (never accept-new)."""
    return [
        "ssh", "-p", str(port), "-i", str(key),
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "LogLevel=ERROR",
        "root@127.0.0.1",
    ]


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
    r = subprocess.run([*ssh_argv(st.ssh_port, st.ssh_key, st.known_hosts), command],
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{st.name}: `{command[:200]}` failed ({r.returncode}): "
                           f"{r.stderr.strip()[-400:]}")
    return r.stdout
