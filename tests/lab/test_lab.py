"""Self-test of the lab host: a lab host stands in for a GPU host only if these hold.

Here on the container host (the first module of the container tier, see conftest.py);
test_lab_vm.py runs the tests that hold for both kinds on the VM as well, beside the
VM's own (GRUB, PCIe, IOMMU). Ends by restarting the host, so it checks
order-independent facts only (another module may have deployed already).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.state import pid_alive

pytestmark = pytest.mark.lab


def test_systemd_is_running(lab):
    r = lab.ssh("readlink /proc/1/exe; systemctl is-system-running --wait", timeout=300)
    exe, state = r.stdout.split()
    assert exe.endswith("/systemd")
    assert state == "running", lab.ssh("systemctl --failed").stdout


def test_sshd_offers_only_the_pinned_host_key(lab, tmp_path):
    # The guest's key is the lab's key, byte for byte.
    guest = lab.ssh("cat /etc/ssh/ssh_host_ed25519_key.pub; ls /etc/ssh/", check=True)
    lab_pub = Path(f"{Path(lab.ssh_key).parent}/ssh_host_ed25519_key.pub").read_text()
    assert guest.stdout.split()[:2] == lab_pub.split()[:2]
    assert not [f for f in guest.stdout.split() if re.match(r"ssh_host_(rsa|ecdsa)", f)]
    # The pinned line is in OpenSSH's [host]:port form.
    line = Path(lab.known_hosts).read_text().strip()
    assert line == f"[127.0.0.1]:{lab.ssh_port} {' '.join(lab_pub.split()[:2])}"
    # Strict checking against some other key must refuse to connect.
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    bad = tmp_path / "known_hosts"
    pub = (tmp_path / "other.pub").read_text().split()
    bad.write_text(f"[127.0.0.1]:{lab.ssh_port} {pub[0]} {pub[1]}\n")
    from lab.sshutil import ssh_argv

    r = subprocess.run([*ssh_argv(lab.ssh_port, lab.ssh_key, bad), "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 255
    assert "host key" in r.stderr.lower() or "identification has changed" in r.stderr.lower()


def test_pyinfra_connects_through_the_lab_inventory(lab):
    # "lab-gpu" alone is in every line pyinfra prints for the host: prove the command ran
    # in the guest's shell and its output came back (pyinfra exec prints it)
    r = lab.run_pyinfra("exec", "--", "echo gpuserve-$((6*7))")
    assert "gpuserve-42" in r.stdout, r.stdout[-2000:]


def test_testinfra_host_sees_debian_12(lab):
    host = lab.testinfra_host()
    assert host.system_info.distribution == "debian"
    assert host.system_info.codename == "bookworm"
    assert host.service("ssh").is_running
    assert host.package("grub-pc").is_installed
    assert host.file("/etc/systemd/network/10-lab.network").contains("DHCP=yes")


def test_guest_reaches_the_mirror_at_10_0_2_2(lab):
    root = Path(lab.state.mirror_root)
    assert (root / "wheels").is_dir()
    assert (root / "cuda/repos/debian12/x86_64").is_dir()
    token = secrets.token_hex(8)
    probe = root / f"lab-probe-{token}.txt"
    probe.write_text(token + "\n")
    try:
        r = lab.ssh(f"curl -fsS {lab.mirror_url}lab-probe-{token}.txt; "
                    f"curl -fsS -o /dev/null -w '%{{http_code}}' {lab.mirror_url}wheels/",
                    check=True)
    finally:
        probe.unlink()
    assert r.stdout.splitlines() == [token, "200"]


def test_guest_network_and_apt_sources(lab):
    r = lab.ssh("ip -4 -o addr show scope global; ip route; cat /etc/apt/sources.list",
                check=True)
    # QEMU's user network leases 10.0.2.15; slirp4netns configures 10.0.2.100
    assert ("10.0.2.15/24" if lab.kind == "vm" else "10.0.2.100/24") in r.stdout
    assert "default via 10.0.2.2" in r.stdout
    assert "http://deb.debian.org/debian bookworm main" in r.stdout


def test_lab_keys_are_private(lab):
    assert Path(lab.ssh_key).stat().st_mode & 0o077 == 0
    assert Path(lab.ssh_key).parent.stat().st_mode & 0o077 == 0
    assert Path(lab.known_hosts).stat().st_mode & 0o077 == 0


def _status(lab) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "lab", "status", "--name", lab.name, "--json"],
                       capture_output=True, text=True, env=lab.env, timeout=120)
    return r.returncode, json.loads(r.stdout)


def test_status_down_and_up_again_keep_the_disk(lab):
    """Last: restarts the session VM (others re-read the state, see conftest)."""
    rc, info = _status(lab)
    assert rc == 0 and info["state"] == "running" and info["ssh_answers"]
    assert info["ssh_port"] == lab.ssh_port and info["mirror_alive"]
    st = lab.state
    marker = secrets.token_hex(6)
    lab.ssh(f"echo {marker} > /root/lab-marker && sync", check=True)

    lab.lab_cli("down", "--name", lab.name)
    assert not pid_alive(st.pid) and not pid_alive(st.mirror_pid)
    rc, info = _status(lab)
    assert rc == 1 and info["state"] == "down"
    # The inventory refuses to point pyinfra at a lab that is not running.
    r = lab.run_pyinfra("exec", "--", "true", check=False, timeout=120)
    assert r.returncode != 0 and "python -m lab up" in r.stdout

    if lab.kind == "container":  # nothing of it is left behind
        assert _mounts_under(Path(st.overlay).parent) == []
        assert not Path(f"/run/netns/{st.extra['netns']}").exists()

    lab.lab_cli("up", "--name", lab.name, "--kind", lab.kind)
    assert lab.ssh("cat /root/lab-marker", check=True).stdout.strip() == marker
    rc, info = _status(lab)
    assert rc == 0 and info["mirror_alive"]


# -- the container host's own ---------------------------------------------------------

def _mounts_under(directory: Path) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    return [p for p in points if p.startswith(f"{directory.resolve()}/")]


def test_container_host_knows_it_is_a_container_with_the_stand_in_module(lab):
    r = lab.ssh("systemd-detect-virt --container; cat /proc/driver/nvidia/version; "
                "touch /proc/driver/nvidia/version 2>/dev/null || echo read-only", check=True)
    virt, nvrm, _gcc, ro = r.stdout.splitlines()
    assert virt == "systemd-nspawn"
    assert nvrm.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                           f"{lab.state.extra['driver_version']}  ")
    assert ro == "read-only"


def test_container_reboot_is_a_new_boot_on_the_same_port_and_disk(lab):
    """`systemctl reboot` inside: nspawn exits 133 and the supervisor boots it again."""
    st = lab.state
    marker = secrets.token_hex(6)
    lab.ssh(f"echo {marker} > /root/reboot-marker && sync", check=True)
    seconds = lab.reboot(timeout=120)
    print(f"lab: container reboot took {seconds:.1f}s")
    after = lab.state
    assert (after.pid, after.ssh_port) == (st.pid, st.ssh_port) and pid_alive(st.pid)
    assert lab.ssh("cat /root/reboot-marker", check=True).stdout.strip() == marker
    assert "systemd-nspawn exited 133" in Path(st.serial_log).read_text(errors="replace")


def test_two_container_hosts_share_no_address_or_port(lab):
    """Another instance (as a second lab run would make) gets its own namespace, SSH
    port and mirror; each host answers on its own."""
    other = f"{lab.name}-other"
    lab.lab_cli("up", "--name", other, "--kind", "container", "--fresh")
    try:
        from lab.state import read_state

        a, b = lab.state, read_state(other)
        assert b is not None
        assert a.extra["netns"] != b.extra["netns"]
        assert len({a.ssh_port, a.mirror_port, b.ssh_port, b.mirror_port}) == 4
        token = secrets.token_hex(4)
        lab.lab_cli("ssh", "--name", other, "--", f"echo {token} > /root/who")
        assert lab.ssh("cat /root/who 2>/dev/null").stdout.strip() != token
    finally:
        lab.lab_cli("down", "--name", other, check=False)
    assert _mounts_under(Path(b.overlay).parent) == []
    shutil.rmtree(Path(b.overlay).parent)  # its disk file: kept by `down`, not needed


def test_a_container_that_cannot_boot_is_reported_and_leaves_no_mount(lab, tmp_path):
    """nspawn's own message comes back; the mounts, namespace and state are gone."""
    name = f"{lab.name}-broken"
    missing = tmp_path / "no-such-dir"
    env = dict(lab.env, GPUSERVE_LAB_NSPAWN_ARGS=f"--bind-ro={missing}:/mnt/x")
    r = subprocess.run([sys.executable, "-m", "lab", "up", "--name", name, "--kind",
                        "container", "--fresh"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"Failed to stat {missing}" in r.stderr, r.stderr
    from lab.container import netns_name
    from lab.state import instance_dir, read_state

    assert read_state(name) is None
    assert _mounts_under(instance_dir(name)) == []
    assert not Path(f"/run/netns/{netns_name(name)}").exists()
    shutil.rmtree(instance_dir(name), ignore_errors=True)


def test_a_host_whose_lab_process_died_is_cleaned_up_by_the_next_up(lab, at_session_end):
    """A host killed with its state file lost (a crashed or killed `up`, a lost
    controller) leaves processes, mounts, a namespace and cgroups; the next `up` of that
    name removes them before it mounts anything (mounting over stale mounts once made a
    clone's copy rewrite a disk file still mounted: "Structure needs cleaning"), then
    boots a working host, and `down` leaves nothing behind."""
    from lab import container
    from lab.state import instance_dir, read_state, state_path

    name = f"{lab.name}-crashed"
    lab.lab_cli("up", "--name", name, "--kind", "container", "--fresh")
    st = read_state(name)
    cgroups = container.host_cgroups(st.extra["netns"])
    try:
        os.kill(st.pid, signal.SIGKILL)  # the supervisor, then nspawn: the container's
        subprocess.run(["pkill", "-KILL", "-f", f"--machine=gpuserve-{name}( |$)"])
        state_path(name).unlink()  # own systemd lives on, orphaned, in its cgroups
        assert container.cgroup_pids(cgroups), "the orphaned container should still run"
        r = lab.lab_cli("up", "--name", name, "--kind", "container")
        assert f"removed what an earlier '{name}' left behind" in r.stdout, r.stdout
        assert "in its cgroups" in r.stdout and "(mounted)" in r.stdout, r.stdout
        token = secrets.token_hex(4)
        lab.lab_cli("ssh", "--name", name, "--", f"echo {token} > /root/who")
        out = lab.lab_cli("ssh", "--name", name, "--", "cat /root/who").stdout
        assert token in out
    finally:
        lab.lab_cli("down", "--name", name, check=False)
    idir = instance_dir(name)

    def left() -> list:
        """What the killed and the second incarnation still hold (mounts, cgroups, both
        incarnations' slirp and mirror)."""
        return [x for x in (_mounts_under(idir), container.cgroup_pids(cgroups),
                            container.processes_naming(idir)) if x]

    deadline = time.monotonic() + 120
    while left() and time.monotonic() < deadline:
        time.sleep(2)
    assert left() == []
    assert not Path(f"/run/netns/{st.extra['netns']}").exists()

    def loop_left() -> list:
        """The disk's loop device: the kernel lets go of an orphaned container's last
        reference in its own time on a busy machine (seen 240 s after down, gone
        minutes later), so it is checked at the session's end; then the disk goes."""
        loops = subprocess.run(["losetup", "--associated", str(idir / "disk.ext4")],
                               capture_output=True, text=True).stdout.strip()
        if not loops:
            shutil.rmtree(idir, ignore_errors=True)
        return [loops] if loops else []

    at_session_end(f"{name}'s loop device", loop_left)
