"""deploy/hypervisor.py's LXC side on a container lab host standing in for a Proxmox
host: the pct stand-in (lab/pct) with a container config and NVIDIA device nodes made
with mknod. The deploy binds the nodes into the container's config; a running container
is rebooted when asked and the stand-in's start accepts the lines; a rerun changes
nothing; a host without the driver's nodes is refused before any change.

Runs on the session's host; its fixture removes the stand-in, the config and the nodes
afterwards (the host serves as a GPU host for the tests after it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from labhelpers import clean, no_changes

from lab.pct import NODES, install_command, remove_command

CTID = 120
CONF = f"/etc/pve/lxc/{CTID}.conf"


@pytest.fixture(scope="module")
def proxmox(lab, tmp_path_factory):
    lab.ssh(install_command(CTID), check=True)
    d = tmp_path_factory.mktemp("ct_group_data")
    (d / "all.py").write_text(f"proxmox_ctid = {CTID}\nproxmox_restart_vm = True\n")
    try:
        yield d
    finally:
        lab.ssh(remove_command(CTID))


def test_container_config_binds_the_nodes_and_rerun_changes_nothing(lab, proxmox: Path):
    lab.ssh(f"pct start {CTID}", check=True)
    r = lab.run_pyinfra("deploy/hypervisor.py", "--group-data", str(proxmox))
    out = clean(r.stdout)
    assert f"container {CTID}: binding {len(NODES)} NVIDIA device node(s)" in out
    conf = lab.ssh(f"pct config {CTID}", check=True).stdout.splitlines()
    assert conf[:2] == ["arch: amd64", "cores: 32"]  # Proxmox's own keys kept, in order
    for major in (195, 508, 511):
        assert f"lxc.cgroup2.devices.allow: c {major}:* rwm" in conf
    for path, _, _ in NODES:
        if path.count("/") == 2:
            assert f"lxc.mount.entry: {path} {path[1:]} none bind,optional,create=file" in conf
    assert ("lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"
            in conf)
    # the running container was rebooted (proxmox_restart_vm) with the new config
    started = lab.ssh(f"cat /run/pct-standin/{CTID}.started.conf", check=True).stdout
    assert started == lab.ssh(f"cat {CONF}", check=True).stdout
    assert "vfio" not in out and "intel_iommu" not in out  # no passthrough for a container
    before = lab.ssh(f"md5sum {CONF}").stdout
    again = clean(lab.run_pyinfra("deploy/hypervisor.py", "--group-data", str(proxmox)).stdout)
    assert no_changes(again), again[-4000:]
    assert lab.ssh(f"md5sum {CONF}").stdout == before


def test_host_without_the_driver_is_refused_before_any_change(lab, proxmox: Path):
    lab.ssh(f"rm -f /dev/nvidiactl && cp {CONF} /tmp/ct.before", check=True)
    try:
        r = lab.run_pyinfra("deploy/hypervisor.py", "--group-data", str(proxmox), check=False)
        out = clean(r.stdout)
        assert r.returncode != 0
        assert "proxmox_ctid: container 120 on lab-gpu: no /dev/nvidiactl" in out
        assert "load the NVIDIA driver on the Proxmox host first" in out
        assert "Beginning operation run" not in out and "Traceback" not in out
        assert lab.ssh(f"cmp {CONF} /tmp/ct.before").returncode == 0
    finally:
        lab.ssh("mknod /dev/nvidiactl c 195 255; rm -f /tmp/ct.before")
