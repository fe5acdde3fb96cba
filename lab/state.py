"""Where the lab keeps its files, and the per-instance state file.

Everything lives outside the repository under ``$GPUSERVE_LAB_HOME`` (default
``~/.cache/gpuserve/lab``) so several checkouts and engineers share one cached image,
while each instance (``--name`` / ``$GPUSERVE_LAB_NAME``) gets its own directory,
overlay disk, ports and state file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_NAME = "default"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def lab_home() -> Path:
    """The lab's root directory (created on demand by the callers that write)."""
    env = os.environ.get("GPUSERVE_LAB_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpuserve" / "lab"


def instance_name(cli_name: str | None = None) -> str:
    """Instance name: ``--name`` wins over ``$GPUSERVE_LAB_NAME``, then "default".

    Names become directory names, so they are restricted to a safe alphabet.
    """
    name = cli_name or os.environ.get("GPUSERVE_LAB_NAME") or DEFAULT_NAME
    if not _NAME_RE.match(name):
        raise ValueError(
            f"invalid lab instance name {name!r}: use letters, digits, '.', '_', '-'"
        )
    return name


def instance_dir(name: str, home: Path | None = None) -> Path:
    return (home or lab_home()) / "instances" / name


def keys_dir(home: Path | None = None) -> Path:
    return (home or lab_home()) / "keys"


def images_dir(home: Path | None = None) -> Path:
    return (home or lab_home()) / "images"


@dataclass
class InstanceState:
    """What a running instance needs others to know (inventory, tests, `lab status`).

    Written atomically by `lab up`; `pid`/`mirror_pid` are checked for liveness by
    readers, because a state file outlives a crashed QEMU.
    """

    name: str
    ssh_port: int
    mirror_port: int
    pid: int
    mirror_pid: int
    ssh_key: str
    known_hosts: str
    image: str
    overlay: str
    serial_log: str
    qmp_socket: str
    mirror_root: str
    extra: dict = field(default_factory=dict)
    # "vm" (QEMU, lab/qemu.py) or "container" (systemd-nspawn, lab/container.py); for a
    # container ``pid`` is its supervisor's, ``overlay`` its disk file, ``serial_log``
    # its console log and ``qmp_socket`` slirp4netns's API socket
    kind: str = "vm"

    @property
    def mirror_url(self) -> str:
        """The mirror as the guest sees it: this machine's loopback is 10.0.2.2 on QEMU's
        user network and on a container's slirp4netns alike."""
        return f"http://10.0.2.2:{self.mirror_port}/"

    @property
    def hub_url(self) -> str:
        """The Hub stand-in (lab/hub) as the guest sees it: a lab host's ``HF_ENDPOINT``."""
        return f"http://10.0.2.2:{self.mirror_port}/hub"

    @property
    def hub_local_url(self) -> str:
        """The same Hub stand-in from this machine (its loopback): controller-side reads
        and the lab's knobs (``<url>/_lab/...``)."""
        return f"http://127.0.0.1:{self.mirror_port}/hub"


def state_path(name: str, home: Path | None = None) -> Path:
    return instance_dir(name, home) / "state.json"


def write_state(state: InstanceState, home: Path | None = None) -> Path:
    """Write the state file atomically (readers never see half a file)."""
    path = state_path(state.name, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_state(name: str, home: Path | None = None) -> InstanceState | None:
    """The recorded state, or None when the instance was never started or is down."""
    path = state_path(name, home)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return InstanceState(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = set(InstanceState.__dataclass_fields__)


def clear_state(name: str, home: Path | None = None) -> None:
    state_path(name, home).unlink(missing_ok=True)


def pid_alive(pid: int | None) -> bool:
    """True when a process with this pid exists (signal 0 probes without killing)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists"; treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def list_instances(home: Path | None = None) -> list[str]:
    root = (home or lab_home()) / "instances"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "state.json").exists())
