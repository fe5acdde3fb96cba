"""Running ssh against an instance with the lab's key and pinned known_hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
