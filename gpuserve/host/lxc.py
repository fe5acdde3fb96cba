"""A Proxmox LXC container that serves from the host's GPUs: the lines its config needs.

The NVIDIA kernel module stays loaded on the Proxmox host (no vfio-pci); the container
gets the GPUs' character devices allowed in its device cgroup and their nodes bind-mounted
in. Proxmox passes ``lxc.*`` keys of ``/etc/pve/lxc/<ctid>.conf`` to LXC unchanged
(Proxmox VE admin guide, "Proxmox Container Toolkit", section "Configuration": "you can
add low-level LXC-style configuration directly ... lxc.* keys";
https://pve.proxmox.com/pve-docs/chapter-pct.html#pct_configuration), and ``pct set`` has
no option for them, so the deploy edits that file. The keys' meaning is LXC's
(lxc.container.conf(5), https://linuxcontainers.org/lxc/manpages/man5/lxc.container.conf.5.html):
``lxc.cgroup2.devices.allow`` ("Control groups", cgroup v2's device controller; Proxmox
VE 7+ runs the unified hierarchy) and ``lxc.mount.entry`` ("Mount points": fstab format,
``create=file|dir`` makes the mount point, ``optional`` skips a node that is absent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONFIG_DIR = "/etc/pve/lxc"
# /dev/nvidia0..N and /dev/nvidiactl are major 195 (NVIDIA's driver README, "Installing
# the driver / device files": NV_MAJOR_DEVICE_NUMBER 195); nvidia-uvm and nvidia-caps get
# a dynamic major, read from the host's own nodes.
NVIDIA_MAJOR = 195
# `stat -c '%n|%F|%t'`: name, file type, major in hex, for every NVIDIA node of the host.
NODES_COMMAND = "stat -c '%n|%F|%t' /dev/nvidia* /dev/nvidia-caps/* 2>/dev/null || true"
NODE = re.compile(r"^/dev/(nvidia\d+|nvidiactl|nvidia-modeset|nvidia-uvm|nvidia-uvm-tools"
                  r"|nvidia-caps/nvidia-cap\d+)$")


@dataclass(frozen=True)
class DeviceNode:
    path: str
    major: int


def config_path(ctid: int) -> str:
    return f"{CONFIG_DIR}/{int(ctid)}.conf"


def parse_nodes(stat_lines: list[str]) -> list[DeviceNode]:
    """The NVIDIA character devices among ``NODES_COMMAND``'s lines (directories and
    anything else dropped)."""
    nodes = []
    for line in stat_lines:
        parts = line.strip().split("|")
        if len(parts) != 3 or parts[1] != "character special file" or not NODE.match(parts[0]):
            continue
        try:
            nodes.append(DeviceNode(parts[0], int(parts[2], 16)))
        except ValueError:
            continue
    return nodes


def missing_driver(nodes: list[DeviceNode]) -> str | None:
    """Why the host cannot give a container its GPUs, or None: the kernel module must be
    loaded on the Proxmox host itself (its nodes exist, GPUs and nvidiactl at 195)."""
    names = {n.path for n in nodes if n.major == NVIDIA_MAJOR}
    if "/dev/nvidiactl" not in names or not any(re.search(r"nvidia\d+$", p) for p in names):
        return ("no /dev/nvidiactl and /dev/nvidiaN (major 195) on the Proxmox host: install "
                "and load the NVIDIA driver on the Proxmox host first (its kernel module "
                "serves the container; no vfio-pci)")
    if "/dev/nvidia-uvm" not in {n.path for n in nodes}:
        return ("no /dev/nvidia-uvm on the Proxmox host: load nvidia-uvm and create its "
                "nodes there first (nvidia-modprobe -u -c=0, or any CUDA program run once)")
    return None


def config_lines(nodes: list[DeviceNode]) -> list[str]:
    """The ``lxc.*`` lines for the GPUs: each major of the host's NVIDIA nodes allowed
    (read, write, mknod), each node bound in at the same path, /dev/nvidia-caps as a dir."""
    majors = dict.fromkeys(sorted({n.major for n in nodes}, key=lambda m: (m != NVIDIA_MAJOR, m)))
    lines = [f"lxc.cgroup2.devices.allow: c {m}:* rwm" for m in majors]
    top = [n.path for n in nodes if n.path.count("/") == 2]
    for path in sorted(set(top), key=_node_order):
        lines.append(f"lxc.mount.entry: {path} {path[1:]} none bind,optional,create=file")
    if any(n.path.startswith("/dev/nvidia-caps/") for n in nodes):
        lines.append("lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none "
                     "bind,optional,create=dir")
    return lines


def _node_order(node: str) -> tuple[int, str]:
    digits = re.search(r"nvidia(\d+)$", node)
    return (int(digits.group(1)), node) if digits else (1 << 20, node)


def merged_config(current: str, lines: list[str]) -> str | None:
    """The config with the missing lines added at the end of its main section (before the
    first ``[snapshot]`` section, whose keys belong to that snapshot); None when nothing is
    missing. Every existing line is kept as it is."""
    text = current if current.endswith("\n") or not current else current + "\n"
    at = 0 if text.startswith("[") else text.find("\n[") + 1 or len(text)
    head, rest = text[:at], text[at:]
    present = {ln.strip() for ln in head.splitlines()}
    missing = [ln for ln in lines if ln not in present]
    if not missing:
        return None
    return head + "".join(f"{ln}\n" for ln in missing) + rest
