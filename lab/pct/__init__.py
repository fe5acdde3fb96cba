"""Lab stand-in for Proxmox's ``pct``, for the hypervisor deploy's LXC side
(deploy/hypervisor.py with ``proxmox_ctid``).

The script ``lab/pct/pct`` keeps container configs in /etc/pve/lxc/<vmid>.conf in
Proxmox's format. Tests install it on a lab host as /usr/sbin/pct with
:func:`install_command`, which also seeds a container with :data:`SEED_CONFIG` (as
``pct create`` writes one for a Debian template) and gives the host NVIDIA device nodes
(:data:`NODES`, majors as the driver registers them) the way a Proxmox host with the
driver loaded has them. A lab host has no GPU: the nodes are only names and numbers.
"""

from __future__ import annotations

import base64
import shlex
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "pct"

SEED_CONFIG = """\
arch: amd64
cores: 32
features: nesting=1
hostname: gpu-ct
memory: 262144
net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5E:7A:02,ip=dhcp,type=veth
ostype: debian
rootfs: local-lvm:vm-{vmid}-disk-0,size=200G
swap: 0
unprivileged: 1
"""

# (path, major, minor): 195 is NVIDIA's fixed major; nvidia-uvm and nvidia-caps get
# dynamic ones. Composed, not recorded: two majors from the range the kernel hands out
# dynamically (fs/char_dev.c: 254 down to 234, then 511 down to 384).
NODES = [("/dev/nvidia0", 195, 0), ("/dev/nvidia1", 195, 1), ("/dev/nvidiactl", 195, 255),
         ("/dev/nvidia-modeset", 195, 254), ("/dev/nvidia-uvm", 508, 0),
         ("/dev/nvidia-uvm-tools", 508, 1), ("/dev/nvidia-caps/nvidia-cap1", 511, 1),
         ("/dev/nvidia-caps/nvidia-cap2", 511, 2)]


def install_command(vmid: int, nodes: bool = True) -> str:
    """One shell command that installs pct as /usr/sbin/pct, seeds container ``vmid``
    (an existing config is kept) and, with ``nodes``, makes the NVIDIA device nodes."""
    blob = base64.b64encode(SCRIPT.read_bytes()).decode()
    conf = f"/etc/pve/lxc/{vmid}.conf"
    seed = SEED_CONFIG.format(vmid=vmid)
    make = " && ".join(f"{{ [ -e {p} ] || mknod {p} c {ma} {mi}; }}" for p, ma, mi in NODES)
    return (
        f"echo {blob} | base64 -d > /usr/sbin/pct && chmod 755 /usr/sbin/pct && "
        f"mkdir -p /etc/pve/lxc && {{ [ -e {conf} ] || printf %s {shlex.quote(seed)} > {conf}; }}"
        + (f" && mkdir -p /dev/nvidia-caps && {make}" if nodes else "")
    )


def remove_command(vmid: int) -> str:
    """Undo :func:`install_command` (the lab host serves as a GPU host afterwards)."""
    nodes = " ".join(p for p, _, _ in NODES)
    return (f"rm -f /usr/sbin/pct {nodes} && rmdir /dev/nvidia-caps 2>/dev/null; "
            f"rm -rf /etc/pve/lxc/{vmid}.conf /run/pct-standin; rmdir /etc/pve/lxc /etc/pve "
            "2>/dev/null; true")
