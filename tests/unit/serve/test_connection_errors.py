"""A deploy run from the repository (pyinfra's CLI loads its ``config.py``): a missing
SSH key file and a closed port each give one ``gpuserve: error:`` line with the cause
and one fix, and no traceback (roles/base/connection.py). Through the real pyinfra CLI and
SSH connector, to a loopback port nothing listens on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.cli_fork import run_pyinfra

REPO = Path(__file__).resolve().parents[3]
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("key", "says"), [
    (None, "connection refused on 127.0.0.1 port {port}; fix: check that sshd listens on "
     "ssh_port and the address is right"),
    ("/nonexistent/id_ed25519", "SSH key missing: /nonexistent/id_ed25519; fix: set ssh_key "
     "to an existing private key file"),
])
def test_deploy_connection_failure_is_one_readable_line(tmp_path, key, says) -> None:
    if not PYINFRA.exists():
        pytest.skip("no .venv/bin/pyinfra (make setup)")
    port = closed_port()
    extra = f', "ssh_key": {key!r}' if key else ""
    inventory = tmp_path / "inv.py"
    inventory.write_text(f'gpu = [("dead", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, '
                         f'"ssh_connect_retries": 0, "profile": "glm5-nvfp4-tp8"{extra}}})]\n')
    proc = run_pyinfra(["-y", str(inventory), "deploy/serve.py"], REPO, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    ours = [line.strip() for line in out.splitlines() if "gpuserve: error:" in line]
    assert ours == ["gpuserve: error: dead: unreachable: " + says.format(port=port)], out
    assert "Traceback" not in out and "Greenlet" not in out, out
