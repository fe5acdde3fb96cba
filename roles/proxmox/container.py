"""Proxmox VE host: an LXC container (``pct``) given the host's GPUs.

The NVIDIA kernel module stays on the Proxmox host; the container's config gets the
GPUs' device cgroup allowances and bind mounts (decisions and sources in
gpuserve.host.lxc). No IOMMU, no vfio-pci: deploy/hypervisor.py skips both for a
container. Inside the container, deploy/host.py installs the matching userspace driver.
"""

from __future__ import annotations

import posixpath
import shlex

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, deploy, operation
from pyinfra.facts.server import Command

from gpuserve.errors import InputError
from gpuserve.host import lxc
from gpuserve.roles.proxmox import restart_if_running

ABSENT = "__gpuserve_absent__"


def host_nodes() -> list[lxc.DeviceNode]:
    return lxc.parse_nodes((host.get_fact(Command, command=lxc.NODES_COMMAND) or "").splitlines())


def read_config(ctid: int) -> str | None:
    """The container's config file as it is, None when Proxmox has no such container."""
    path = lxc.config_path(ctid)
    text = host.get_fact(Command, command=f"cat {shlex.quote(path)} 2>/dev/null || echo {ABSENT}")
    text = "" if text is None else text
    return None if text.strip() == ABSENT else text + ("\n" if text else "")


def write_command(dest: str, text: str) -> StringCommand:
    """Write ``text`` from stdin into a temporary file beside ``dest``, then rename: how
    Proxmox's own tools write /etc/pve (PVE::Tools::file_set_contents, "$filename.tmp.$$"
    then rename). No chown/chmod: pmxcfs keeps its own fixed owner and mode."""
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.gpuserve-new")
    script = f"cat > {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(dest)}"
    return StringCommand("sh", "-c", QuoteString(script), _stdin=text)


def check(ctid: int, src: str) -> None:
    """Refuse before any operation when the host has no NVIDIA driver loaded or no such
    container (InputError naming the key)."""
    if why := lxc.missing_driver(host_nodes()):
        raise InputError(src, "proxmox_ctid", f"container {ctid} on {host.name}: {why}")
    if read_config(ctid) is None:
        raise InputError(src, "proxmox_ctid", f"no container {ctid} on {host.name} "
                         f"({lxc.config_path(ctid)} is absent): create it with pct create first")


@operation()
def container_config(ctid: int, restart: bool = False):
    """Add the GPU lines the config lacks (:func:`check` ran first)."""
    nodes = host_nodes()
    merged = lxc.merged_config(read_config(ctid) or "", lxc.config_lines(nodes))
    if merged is None:
        host.noop(f"container {ctid} already has the host's {len(nodes)} NVIDIA device node(s)")
        return
    logger.info(f"{host.name}: container {ctid}: binding {len(nodes)} NVIDIA device node(s)")
    yield write_command(lxc.config_path(ctid), merged)
    yield from restart_if_running(f"container {ctid}", f"pct status {int(ctid)}",
                                  f"pct reboot {int(ctid)}", restart)


@deploy("Proxmox LXC container for the host's GPUs")
def configure_container(ctid: int, restart: bool = False):
    container_config(
        name=f"container {ctid}: the host's NVIDIA device nodes bound in "
        f"({lxc.config_path(ctid)})",
        ctid=ctid,
        restart=restart,
    )
