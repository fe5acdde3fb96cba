"""Known-hosts lines in OpenSSH's format (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT)."""

from __future__ import annotations

import shutil
import subprocess

import paramiko
import pytest

from lab.keys import ensure_keys, known_hosts_line, public_key, write_known_hosts

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx1bS5rZXkub2YudGhlLmxhYi5ndWVzdC4xMjM root@lab-gpu"


def test_non_default_port_uses_brackets_and_drops_comment():
    assert known_hosts_line("127.0.0.1", 40022, PUB) == (
        "[127.0.0.1]:40022 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx1bS5rZXkub2YudGhlLmxhYi5n"
        "dWVzdC4xMjM\n")


def test_port_22_is_bare_host():
    assert known_hosts_line("10.0.0.5", 22, PUB).startswith("10.0.0.5 ssh-ed25519 ")


def test_garbage_key_is_refused():
    with pytest.raises(ValueError):
        known_hosts_line("127.0.0.1", 2222, "notakey")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_generated_keys_are_private_and_paramiko_finds_the_pinned_entry(tmp_path):
    client, host = ensure_keys(tmp_path)
    assert client.stat().st_mode & 0o077 == 0 and host.stat().st_mode & 0o077 == 0
    assert ensure_keys(tmp_path) == (client, host)  # idempotent, same files
    kh = write_known_hosts(tmp_path / "kh", "127.0.0.1", 40022, public_key(host))
    assert kh.stat().st_mode & 0o077 == 0
    # paramiko (what pyinfra uses) looks non-22 ports up as "[host]:port".
    keys = paramiko.HostKeys(str(kh))
    entry = keys.lookup("[127.0.0.1]:40022")
    assert entry is not None
    assert entry["ssh-ed25519"].get_base64() == public_key(host).split()[1]
    # OpenSSH agrees.
    r = subprocess.run(["ssh-keygen", "-F", "[127.0.0.1]:40022", "-f", str(kh)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "ssh-ed25519" in r.stdout
