"""The container lab host's command lines, names and per-host files (pure parts), and its
supervisor, which boots again on nspawn's reboot status and stops on anything else."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from lab import container
from lab.deps import PACKAGES
from lab.state import InstanceState, read_state, write_state


def _opt(argv: list[str], prefix: str) -> list[str]:
    return [a.split("=", 1)[1] for a in argv if a.startswith(prefix + "=")]


def test_nspawn_boots_systemd_in_the_lab_namespace_without_a_manager():
    argv = container.nspawn_argv(Path("/i/root"), "ns-a", "gpuserve-a",
                                 binds=(("/srv/m", "/models"),))
    assert argv[0] == "systemd-nspawn" and "--boot" in argv
    assert _opt(argv, "--directory") == ["/i/root"]
    # this machine has no systemd manager: no scope, no registration
    assert "--keep-unit" in argv and "--register=no" in argv
    # root manages its own namespace (ss -K in the faults tests)
    assert "--capability=CAP_NET_ADMIN" in argv
    assert _opt(argv, "--network-namespace-path") == ["/run/netns/ns-a"]
    # the stand-in host module: a read-only bind whose source is inside the container
    assert f"/{container.DRIVER_DIR}:/proc/driver/nvidia" in _opt(argv, "--bind-ro")
    assert "/srv/m:/models" in _opt(argv, "--bind-ro")
    # the image's own resolv.conf and zone (10.0.2.3, UTC) stay
    assert "--resolv-conf=off" in argv and "--timezone=off" in argv


def test_slirp_gives_the_namespace_qemus_user_network():
    argv = container.slirp_argv("ns-a", Path("/i/slirp.sock"))
    assert argv[0] == "slirp4netns" and "--configure" in argv
    assert "--disable-host-loopback" not in argv  # 10.0.2.2 is this machine's loopback
    assert argv[-2:] == ["/run/netns/ns-a", "tap0"] and "--netns-type=path" in argv


def test_namespace_names_differ_by_instance_and_by_lab_home(tmp_path):
    a = container.netns_name("pytest", tmp_path / "one")
    assert a != container.netns_name("pytest-2", tmp_path / "one")
    assert a != container.netns_name("pytest", tmp_path / "two")
    assert a == container.netns_name("pytest", tmp_path / "one")


def test_host_files_mask_remount_keep_tap0_static_and_write_the_module_version(tmp_path):
    container.write_host_files(tmp_path, "590.48.01")
    masked = tmp_path / "etc/systemd/system/systemd-remount-fs.service"
    assert masked.is_symlink() and os.readlink(masked) == "/dev/null"
    net = (tmp_path / "etc/systemd/network/05-lab-container.network").read_text()
    assert "Name=tap0" in net and "Address=10.0.2.100/24" in net and "DHCP" not in net
    assert "Unmanaged=yes" in (tmp_path / "etc/systemd/network/06-lab-fleet.network").read_text()
    version = (tmp_path / container.DRIVER_DIR / "version").read_text()
    assert version.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                              "590.48.01  ")
    container.set_driver_version(tmp_path, "575.57.08")
    assert "  575.57.08  " in (tmp_path / container.DRIVER_DIR / "version").read_text()
    container.write_host_files(tmp_path, "590.48.01")  # again: idempotent
    assert os.readlink(masked) == "/dev/null"


def test_supervisor_boots_again_after_a_reboot_and_stops_otherwise(tmp_path):
    """A stand-in for nspawn that "reboots" twice (exit 133), then halts (exit 0)."""
    count = tmp_path / "count"
    script = (f"import pathlib,sys; p=pathlib.Path({str(count)!r}); "
              "n=int(p.read_text()) if p.exists() else 0; p.write_text(str(n+1)); "
              "print('boot', n+1); sys.exit(133 if n < 2 else 0)")
    log = tmp_path / "console.log"
    assert container.supervise([sys.executable, "-c", script], log) == 0
    text = log.read_text()
    assert count.read_text() == "3"
    assert text.count("systemd-nspawn exited 133") == 2 and "exited 0" in text


def test_supervisor_passes_a_failure_status_on(tmp_path):
    log = tmp_path / "console.log"
    rc = container.supervise([sys.executable, "-c",
                              "import sys; print('Failed to stat /x'); sys.exit(1)"], log)
    assert rc == 1 and "Failed to stat /x" in log.read_text()


def test_state_kind_defaults_to_vm_for_state_files_written_before_it(tmp_path):
    st = InstanceState(name="old", ssh_port=1, mirror_port=2, pid=3, mirror_pid=4,
                       ssh_key="k", known_hosts="h", image="i", overlay="o", serial_log="s",
                       qmp_socket="q", mirror_root="m")
    path = write_state(st, tmp_path)
    text = path.read_text().replace('"kind": "vm",', "")
    path.write_text(text)
    assert read_state("old", tmp_path).kind == "vm"


def test_lab_deps_cover_the_container_tools():
    for pkg in ("systemd-container", "slirp4netns", "iproute2"):
        assert pkg in PACKAGES


# /proc/self/mountinfo's cgroup lines on the lab's machine kind (a hybrid: v1
# controllers, v1 name=systemd and the unified v2 hierarchy), then Debian 12's default
# (v2 only, with optional fields before the separator)
MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_V2 = ("30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - "
                "cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n")


def test_each_host_gets_cgroups_of_its_own_in_the_hierarchies_systemd_uses():
    assert container.cgroup_roots(MOUNTINFO) == [Path("/sys/fs/cgroup/systemd"),
                                                 Path("/sys/fs/cgroup/unified")]
    assert container.cgroup_roots(MOUNTINFO_V2) == [Path("/sys/fs/cgroup")]
    roots = container.cgroup_roots(MOUNTINFO)
    a = container.host_cgroups(container.netns_name("a"), roots)
    b = container.host_cgroups(container.netns_name("b"), roots)
    assert a[0].parent == Path("/sys/fs/cgroup/systemd/gpuserve-lab") and not set(a) & set(b)


def test_supervisor_starts_nspawn_in_the_hosts_cgroups_and_down_removes_them(tmp_path):
    """Plain directories stand in for the cgroups: the child writes its own pid into
    each one's cgroup.procs before it runs (what moves it there on a real hierarchy)."""
    cgroups = [tmp_path / "systemd" / "gpuserve-lab" / "h", tmp_path / "unified" / "h"]
    log = tmp_path / "console.log"
    rc = container.supervise([sys.executable, "-c", "import os; print('pid', os.getpid())"],
                             log, cgroups)
    pid = log.read_text().split("pid ")[1].split()[0]
    assert rc == 0 and all((cg / "cgroup.procs").read_text() == f"{pid}\n" for cg in cgroups)
    for cg in cgroups:  # nspawn's own children, and what the container's systemd made
        (cg / "cgroup.procs").unlink()  # a real cgroup's files go with its directory
        (cg / "payload" / "system.slice" / "x.service").mkdir(parents=True)
        (cg / "supervisor").mkdir()
    container.remove_cgroups(cgroups)
    assert not any(cg.exists() for cg in cgroups)


def test_what_runs_in_a_hosts_cgroups_is_found_and_killed(tmp_path):
    """A plain directory tree stands in for the cgroups: a process listed in a nested
    cgroup.procs (as the container's own systemd lists its units' processes) is found
    and killed, whatever its root directory is."""
    import subprocess

    proc = subprocess.Popen(["sleep", "60"])
    try:
        unit = tmp_path / "h" / "payload" / "system.slice" / "x.service"
        unit.mkdir(parents=True)
        (unit / "cgroup.procs").write_text(f"{proc.pid}\n")
        cgroups = [tmp_path / "h"]
        assert container.cgroup_pids(cgroups) == {proc.pid}
        assert container.kill_cgroups(cgroups, timeout=0.2) == 1
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()


def test_processes_naming_an_instance_directory_are_found(tmp_path):
    """An orphaned slirp4netns or mirror names its socket or port file in the instance
    directory (``--api-socket=DIR/slirp.sock``, ``--port-file DIR/mirror.port``)."""
    import subprocess

    idir = tmp_path / "inst"
    idir.mkdir()
    wait = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = [subprocess.Popen([*wait, f"--api-socket={idir}/slirp.sock"]),
             subprocess.Popen([*wait, f"{idir}/mirror.port"]),
             subprocess.Popen([*wait, f"{tmp_path}/other/x"])]
    try:
        for proc in procs:  # until each has exec'd (a fresh fork shows its parent's argv)
            cmdline = Path(f"/proc/{proc.pid}/cmdline")
            for _ in range(300):
                if b"time.sleep(60)" in cmdline.read_bytes():
                    break
                time.sleep(0.01)
        found = container.processes_naming(idir)
        assert procs[0].pid in found and procs[1].pid in found
        assert procs[2].pid not in found
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_box_switch_writes_the_guest_box_and_its_nvswitches(tmp_path):
    root = tmp_path / "root"
    container.write_host_files(root, "580.126.20")
    devices = root / container.NVSWITCH_DIR / "devices"
    assert devices.is_dir() and not list(devices.iterdir())
    assert container.set_box(root, "hgx-h100") == [
        "0000:07:00.0", "0000:08:00.0", "0000:09:00.0", "0000:0a:00.0"]
    assert (root / container.BOX_FILE).read_text() == "hgx-h100\n"
    assert sorted(p.name for p in devices.iterdir())[0] == "0000:07:00.0"
    assert container.set_box(root, "rtxpro6000-kvm") == []
    assert not list(devices.iterdir())
    argv = container.nspawn_argv(root, "ns", "m")
    assert f"/{container.NVSWITCH_DIR}:/proc/driver/nvidia-nvswitch" in _opt(argv, "--bind-ro")
    with pytest.raises(ValueError, match="unknown box"):
        container.set_box(root, "no-such-box")
