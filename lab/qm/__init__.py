"""Lab stand-in for Proxmox's ``qm``, for the hypervisor deploy (deploy/hypervisor.py).

The script ``lab/qm/qm`` keeps VM configs in /etc/pve/qemu-server/<vmid>.conf in
Proxmox's format. Tests install it on a lab VM as /usr/sbin/qm with
:func:`install_command` and seed a VM with :data:`SEED_CONFIG` (a typical VM created in
the Proxmox UI before passthrough: SeaBIOS, i440fx, a generic CPU type).
"""

from __future__ import annotations

import base64
import shlex
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "qm"

SEED_CONFIG = """\
boot: order=scsi0;net0
cores: 32
cpu: x86-64-v2-AES
memory: 262144
name: gpu-guest
net0: virtio=BC:24:11:5E:7A:01,bridge=vmbr0
numa: 0
ostype: l26
scsi0: local-lvm:vm-{vmid}-disk-0,iothread=1,size=200G
scsihw: virtio-scsi-single
sockets: 1
"""


def install_command(vmid: int) -> str:
    """One shell command that installs qm as /usr/sbin/qm and seeds VM ``vmid``.

    The script travels base64-encoded inside the command, so no file transfer is needed
    (the lab fixture's ssh runner suffices); an existing VM config is kept.
    """
    blob = base64.b64encode(SCRIPT.read_bytes()).decode()
    seed = SEED_CONFIG.format(vmid=vmid)
    conf = f"/etc/pve/qemu-server/{vmid}.conf"
    return (
        f"echo {blob} | base64 -d > /usr/sbin/qm && chmod 755 /usr/sbin/qm && "
        f"mkdir -p /etc/pve/qemu-server && "
        f"{{ [ -e {conf} ] || printf %s {shlex.quote(seed)} > {conf}; }}"
    )
