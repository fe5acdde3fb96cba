"""The Proxmox LXC side of deploy/hypervisor.py: which config lines a container needs
for the host's GPUs (gpuserve.host.lxc), and the role that adds only the missing ones."""

from __future__ import annotations

import pytest
from test_host_roles import plan, runs, uploads

from gpuserve.errors import InputError
from gpuserve.host import lxc
from gpuserve.host.host_data import hypervisor_settings

# `stat -c '%n|%F|%t' /dev/nvidia* /dev/nvidia-caps/*` on a host with two GPUs (the
# format GNU stat prints; majors in hex: c3 = 195, 1fc = 508, 1ff = 511).
STAT = [
    "/dev/nvidia0|character special file|c3",
    "/dev/nvidia1|character special file|c3",
    "/dev/nvidia-caps|directory|0",
    "/dev/nvidiactl|character special file|c3",
    "/dev/nvidia-modeset|character special file|c3",
    "/dev/nvidia-uvm|character special file|1fc",
    "/dev/nvidia-uvm-tools|character special file|1fc",
    "/dev/nvidia-caps/nvidia-cap1|character special file|1ff",
    "/dev/nvidia-caps/nvidia-cap2|character special file|1ff",
]
WANT = [
    "lxc.cgroup2.devices.allow: c 195:* rwm",
    "lxc.cgroup2.devices.allow: c 508:* rwm",
    "lxc.cgroup2.devices.allow: c 511:* rwm",
    "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
    "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
]
CONFIG = "arch: amd64\nhostname: gpu-ct\nmemory: 262144\nunprivileged: 1\n"


def test_config_lines_from_the_hosts_nodes():
    nodes = lxc.parse_nodes(STAT)
    assert len(nodes) == 8  # the directory is no node
    assert lxc.missing_driver(nodes) is None
    assert lxc.config_lines(nodes) == WANT


def test_a_host_without_the_driver_loaded_is_named():
    assert "load the NVIDIA driver on the Proxmox host first" in lxc.missing_driver([])
    no_uvm = lxc.parse_nodes([s for s in STAT if "uvm" not in s])
    assert "nvidia-uvm" in lxc.missing_driver(no_uvm)


def test_merge_adds_only_missing_lines_before_snapshots():
    half = CONFIG + WANT[0] + "\n" + "[before-gpu]\narch: amd64\n" + WANT[1] + "\n"
    merged = lxc.merged_config(half, WANT)
    main, snapshot = merged.split("[before-gpu]")
    assert main == CONFIG + "".join(f"{ln}\n" for ln in WANT)
    assert snapshot == "\narch: amd64\n" + WANT[1] + "\n"  # a snapshot's keys are its own
    assert lxc.merged_config(merged, WANT) is None


def test_settings_take_a_vm_or_a_container_not_both():
    from gpuserve.roles import kernel, proxmox

    base = {**kernel.DEFAULTS, **proxmox.DEFAULTS}
    ct = hypervisor_settings({**base, "proxmox_ctid": 120}, "inv.py")
    assert (ct.ctid, ct.vmid) == (120, None)
    with pytest.raises(InputError, match="proxmox_ctid: give proxmox_vmid .* not both"):
        hypervisor_settings({**base, "proxmox_ctid": 120, "proxmox_vmid": 101}, "inv.py")
    with pytest.raises(InputError, match=r"proxmox_ctid: must be a Proxmox container id"):
        hypervisor_settings({**base, "proxmox_ctid": "120"}, "inv.py")


def responses(config: str, status: str = "status: stopped") -> dict:
    return {"stat -c '%n|%F|%t'": STAT, "cat /etc/pve/lxc/120.conf": config.splitlines(),
            "pct status 120": [status]}


def test_role_writes_the_missing_lines_and_reruns_change_nothing():
    from gpuserve.roles.proxmox import container

    ops = plan(container.configure_container, responses(CONFIG), ctid=120)
    assert uploads(ops) == {"/etc/pve/lxc/120.conf": CONFIG + "".join(f"{ln}\n" for ln in WANT)}
    assert runs(ops) == []  # stopped: the config applies at its next start
    done = CONFIG + "".join(f"{ln}\n" for ln in WANT)
    assert plan(container.configure_container, responses(done), ctid=120) == [
        (next(n for n, _ in ops), [])]


def test_role_reboots_a_running_container_only_when_asked():
    from gpuserve.roles.proxmox import container

    running = responses(CONFIG, "status: running")
    assert runs(plan(container.configure_container, running, ctid=120)) == []
    assert runs(plan(container.configure_container, running, ctid=120, restart=True)) == [
        "pct reboot 120"]
