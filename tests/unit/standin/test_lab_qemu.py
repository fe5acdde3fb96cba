"""QEMU command line of the lab host, and the free-port helper."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from lab.qemu import VmSpec, free_port, qemu_argv


def _spec(**kw) -> VmSpec:
    base = dict(name="t", overlay=Path("/i/disk.qcow2"), ssh_port=40022,
                serial_log=Path("/i/serial.log"), console_socket=Path("/i/console.sock"),
                qmp_socket=Path("/i/qmp.sock"), pidfile=Path("/i/qemu.pid"))
    base.update(kw)
    return VmSpec(**base)


def _opts(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_machine_is_q35_tcg_with_enough_memory_and_cpus():
    argv = qemu_argv(_spec())
    assert _opts(argv, "-machine") == ["q35"]
    assert _opts(argv, "-accel") == ["tcg,tb-size=512"]
    assert _opts(argv, "-cpu") == ["max"]
    assert _opts(argv, "-smp") == ["1"]  # two cost ~185 CPU s a VM tier (lab/qemu.py)
    assert int(_opts(argv, "-m")[0]) >= 2048
    assert "-enable-kvm" not in argv
    # Guest reboots must stay in the same process.
    assert "-no-reboot" not in argv
    assert "-kernel" not in argv  # boots through GRUB from the disk


def test_too_little_memory_is_refused():
    with pytest.raises(ValueError):
        qemu_argv(_spec(memory_mib=1024))


def test_iommu_comes_before_every_other_device():
    devices = _opts(qemu_argv(_spec()), "-device")
    assert devices[0].startswith("intel-iommu")


def test_disk_nic_rng_sit_behind_distinct_root_ports():
    devices = _opts(qemu_argv(_spec()), "-device")
    ports = [d.split("id=")[1].split(",")[0] for d in devices
             if d.startswith("pcie-root-port")]
    assert len(ports) >= 4
    chassis = [d.split("chassis=")[1].split(",")[0] for d in devices
               if d.startswith("pcie-root-port")]
    assert len(set(chassis)) == len(chassis)
    buses = {d.split(",")[0]: d.split("bus=")[1].split(",")[0]
             for d in devices if d.startswith("virtio-")}
    assert set(buses) == {"virtio-blk-pci", "virtio-net-pci", "virtio-rng-pci"}
    assert len(set(buses.values())) == 3 and set(buses.values()) <= set(ports)


def test_ssh_is_forwarded_on_loopback_only():
    netdev = _opts(qemu_argv(_spec(ssh_port=45678)), "-netdev")[0]
    assert netdev.startswith("user,")
    assert "hostfwd=tcp:127.0.0.1:45678-:22" in netdev


def test_daemonized_with_pidfile_serial_log_and_qmp():
    argv = qemu_argv(_spec())
    assert "-daemonize" in argv
    assert _opts(argv, "-pidfile") == ["/i/qemu.pid"]
    assert _opts(argv, "-qmp") == ["unix:/i/qmp.sock,server=on,wait=off"]
    chardev = _opts(argv, "-chardev")[0]
    assert "logfile=/i/serial.log" in chardev and "path=/i/console.sock" in chardev
    assert _opts(argv, "-serial") == ["chardev:ser0"]
    drive = _opts(argv, "-drive")[0]
    assert "file=/i/disk.qcow2" in drive and "format=qcow2" in drive


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_qemu_accepts_every_device_option():
    """Ask the real QEMU about each device and property we use (no guest started)."""
    for dev in ("intel-iommu", "pcie-root-port", "virtio-blk-pci", "virtio-net-pci",
                "virtio-rng-pci"):
        r = subprocess.run(["qemu-system-x86_64", "-machine", "q35", "-device",
                            f"{dev},help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        if dev == "intel-iommu":
            assert "intremap" in r.stdout
        if dev == "pcie-root-port":
            assert "chassis" in r.stdout and "port" in r.stdout


def test_free_port_is_bindable_on_loopback():
    port = free_port()
    assert 1024 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
