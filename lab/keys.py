"""SSH keys the lab owns: the client key pyinfra logs in with, and the guest's host key.

The host key is generated here and baked into the image, so the controller knows it
before the first connection and can pin it (strict host-key checking, never
accept-new). Both keys live under ``$GPUSERVE_LAB_HOME/keys`` with mode 0600.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lab.state import keys_dir

CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"


def _generate(path: Path, comment: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    os.chmod(path, 0o600)


def ensure_keys(home: Path | None = None) -> tuple[Path, Path]:
    """Create the client and host key pairs once; return (client_key, host_key)."""
    kdir = keys_dir(home)
    client, hostkey = kdir / CLIENT_KEY, kdir / HOST_KEY
    if not client.exists():
        _generate(client, "gpuserve-lab-client")
    if not hostkey.exists():
        _generate(hostkey, "root@lab-gpu")
    return client, hostkey


def public_key(private: Path) -> str:
    """The one-line OpenSSH public key next to a private key."""
    return Path(f"{private}.pub").read_text().strip()


def known_hosts_line(host: str, port: int, host_pub: str) -> str:
    """A known_hosts line for host:port in OpenSSH's format.

    OpenSSH (and paramiko's HostKeys) look up non-22 ports as ``[host]:port``
    (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"); the comment field is dropped.
    """
    parts = host_pub.split()
    if len(parts) < 2:
        raise ValueError(f"not an OpenSSH public key: {host_pub!r}")
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {parts[0]} {parts[1]}\n"


def write_known_hosts(path: Path, host: str, port: int, host_pub: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(known_hosts_line(host, port, host_pub))
    os.chmod(path, 0o600)
    return path
