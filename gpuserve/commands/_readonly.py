"""One host of an inventory, read through a read-only deploy (``gpuserve render
INVENTORY --limit HOST``, ``gpuserve logs``): what those commands share.

Why a pyinfra subprocess: the deploys' plans need the host's facts read the way the
deploys read them (``roles/``, which nothing in ``gpuserve/`` imports), and the tuner
already reads its host snapshot this way. The inventory is loaded first with pyinfra's
own loader (``check.load_hosts``, no connection), so an unknown host is a clear error
before anything is reached; the deploy writes its document to a private temporary file.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import GpuserveError, InputError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_UNREACHABLE = re.compile(r"Could not connect|Connection refused|No route to host|timed out|"
                          r"Name or service not known|Authentication failed|"
                          r"Failed to connect|No hosts remaining|No such private key file|"
                          r"Invalid key|Authentication error|host key|"
                          r"Could not resolve hostname", re.I)
#: (what pyinfra 3.10's SSH connector says, the cause in words, the one fix); first match
#: wins. Sources: pyinfra/connectors/ssh.py (connect, _connect) and ssh_util.py
#: (load_key_with_certificate), pyinfra/api/host.py (connect logs ConnectError's text).
_CAUSES = (
    (re.compile(r"No such private key file: ([^\s\"'{}()]+)"), "SSH key missing: {0}",
     "set ssh_key to an existing private key file"),
    (re.compile(r"Invalid key: ([^\s\"'{}()]+)"), "SSH key unreadable: {0}",
     "ssh_key must name a private key (and ssh_key_password its passphrase)"),
    (re.compile(r"not found in known_hosts|SSH host key error|Host key for"),
     "host key unknown or changed",
     "add the host's key to ssh_known_hosts_file (ssh-keyscan -t ed25519 ADDR, compared "
     "with the host's console)"),
    (re.compile(r"Authentication (?:error|failed)"), "authentication refused",
     "check ssh_user and ssh_key against the host's authorized_keys"),
    (re.compile(r"timed out|Timeout", re.I), "no answer (timeout)",
     "check the address, the route and the firewall"),
    (re.compile(r"Unable to connect to port (\d+) on ([\w.:-]+)"),
     "connection refused on {1} port {0}",
     "check that sshd listens on ssh_port and the address is right"),
    (re.compile(r"Connection refused", re.I), "connection refused",
     "check that sshd listens on ssh_port and the address is right"),
    (re.compile(r"Could not resolve hostname|Name or service not known"),
     "name does not resolve", "check ssh_hostname"),
    (re.compile(r"No route to host|Network is unreachable"), "no route to the host",
     "check the address and the network"),
)
_PREFIX = re.compile(r"^\s*\[[^\]]+\]\s?")
#: pyinfra's own status lines under the host's prefix while ``exec`` connects.
_STATUS = re.compile(r"^(Connected|Ready: \w+)$")


def pyinfra_exe() -> str:
    """The pyinfra of this interpreter's environment (the tune's choice too)."""
    return str(Path(sys.executable).with_name("pyinfra"))


def host_data(inventory: str, limit: str | None, overrides: list[str]) -> tuple[str, dict]:
    """(host name, host data) of ``limit`` in ``inventory``, loaded without connecting;
    an ``InputError`` naming the inventory for a missing or unknown host."""
    from gpuserve.commands.check import load_hosts, parse_data

    hosts, _ = load_hosts(inventory, parse_data(overrides))
    names = [name for name, _ in hosts]
    if not limit:
        if len(hosts) == 1:
            return hosts[0]
        raise InputError(inventory, "--limit", f"the inventory has {len(hosts)} hosts; "
                         f"name one: {', '.join(names[:20])}")
    for name, data in hosts:
        if name == limit:
            return name, data
    raise InputError(inventory, "--limit", f"unknown host {limit!r:.80}; the inventory's "
                     f"hosts: {', '.join(names[:20])}")


def read_document(inventory: str, host: str, deploy: str, data: list[str],
                  pyinfra: str | None = None, timeout: float = 900) -> dict:
    """Run ``deploy`` (read-only) on ``host``; the JSON document it wrote."""
    with tempfile.TemporaryDirectory(prefix="gpuserve-") as tmp:
        target = Path(tmp) / "doc.json"
        argv = [pyinfra or pyinfra_exe(), "-y", inventory, deploy, "--limit", host,
                "--data", f"operate_snapshot={target}"]
        for item in data:
            argv += ["--data", item]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GpuserveError(f"{host}: no answer within {timeout:.0f} s") from None
        output = ANSI.sub("", proc.stdout + proc.stderr)
        if proc.returncode != 0 or not target.is_file():
            raise GpuserveError(failure(host, output))
        return safeload.load_json_file(target)


def failure(host: str, output: str) -> str:
    """One line saying why the read-only run failed: the deploy's own error, the
    connection's, else pyinfra's last lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if "gpuserve: error:" in line]
    if ours:
        return ours[-1].split("gpuserve: error:", 1)[1].strip()
    reach = [line for line in lines if _UNREACHABLE.search(line)]
    if reach:
        return f"{host}: unreachable: {connection_cause(' '.join(reach))}"
    return f"{host}: the read-only run failed: {' | '.join(lines[-4:])[:600]}"


def connection_cause(text: str) -> str:
    """One line from what pyinfra printed or raised when a host could not be reached: the
    cause (key missing, host key unknown, refused, timeout ...) and one fix; pyinfra's
    own words, without its host prefix, when the cause is not one of these."""
    for pattern, cause, fix in _CAUSES:
        found = list(pattern.finditer(text))  # the last: a traceback quotes the source first
        if found:
            return f"{cause.format(*found[-1].groups())}; fix: {fix}"
    lines = [_PREFIX.sub("", line).strip() for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else text)[:300]


def stream(inventory: str, host: str, command: list[str], overrides: list[str],
           pyinfra: str | None = None) -> Iterator[str]:
    """The output lines of ``command`` run on ``host`` (``pyinfra exec``), as they come,
    without pyinfra's host prefix."""
    import shlex

    argv = [pyinfra or pyinfra_exe(), "-y", inventory, "exec", "--limit", host]
    for item in overrides:
        argv += ["--data", item]
    argv += ["--", shlex.join(command)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    assert proc.stdout is not None
    prefix = f"[{host}]"
    try:
        for raw in proc.stdout:
            line = ANSI.sub("", raw.rstrip("\n"))
            if line.lstrip().startswith(prefix):
                text = line.lstrip()[len(prefix):].lstrip(" ")
                if not _STATUS.match(text):
                    yield text
            elif _UNREACHABLE.search(line):
                raise GpuserveError(f"{host}: unreachable: {connection_cause(line)}")
    finally:
        proc.terminate()
        proc.wait()
