"""What several lab test modules check on the lab host, in one place.

Imported by name (``from labhelpers import ...``): pytest puts tests/lab on sys.path
for the modules there (no package, rootdir import mode ``prepend``)."""

from __future__ import annotations

import re

UNIT = "gpuserve-sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/gpuserve/sglang.env"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
VENV_RE = re.compile(r"/opt/gpuserve/venvs/(0\.5\.\d+\+lab)-[0-9a-f]{12}")


def clean(text: str) -> str:
    return ANSI.sub("", text)


def no_changes(out: str) -> bool:
    """The serve deploy's summary: no operation of the run changed the host."""
    total = [line for line in out.splitlines() if line.strip().startswith("Grand total")]
    return bool(total) and total[-1].split()[3] == "-"  # Hosts, Success(-), Error, ...


def healthy(lab) -> bool:
    r = lab.ssh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health",
                timeout=60)
    return r.stdout.strip() == "200"


def unit_venv(lab) -> str:
    """The venv the live unit runs (its ExecStart names it)."""
    text = lab.ssh(f"cat {UNIT_PATH}", check=True).stdout
    found = VENV_RE.search(text)
    assert found, text
    return found.group(0)


def served_profile(lab) -> str:
    """The profile the live EnvironmentFile holds (its "# Profile: NAME" line; the
    server's arguments are there, the unit names no profile)."""
    out = lab.ssh(f"sed -n 's/^# Profile: //p' {ENV_PATH}", check=True).stdout.split()
    assert len(out) == 1, out
    return out[0]


def venvs(lab) -> list[str]:
    out = lab.ssh("ls -1d /opt/gpuserve/venvs/*/ 2>/dev/null").stdout
    return sorted(line.rstrip("/") for line in out.split())
