"""QEMU for the lab host: argv construction (pure), launch, QMP and shutdown.

Machine model (QEMU 7.2 docs, docs/system/devices/... and `-device help`):

- ``-machine q35`` with ``-accel tcg -cpu max``: /dev/kvm exists on the CI machines but
  is PVM (dmesg ``kvm-pvm: loaded``; the CPU has no vmx/svm), which runs only kernels
  built for it (``CONFIG_PVM_GUEST``, booted without firmware). Debian's 6.1 kernel
  runs emulated there, over 100x slower (2026-12-06: GRUB's countdown ran, then the
  bzImage's XZ decompressor made about 24 KB/s; an uncompressed vmlinux printed its
  early lines seconds apart), and ``-cpu host`` aborts on MSR 0x10a unless
  ``-arch-capabilities``. So the lab uses TCG.
- ``-device intel-iommu`` first: QEMU requires the vIOMMU before the devices it
  translates. ``intremap=on`` works under TCG (the kernel-irqchip=split requirement in
  hw/i386/intel_iommu.c applies only to a KVM in-kernel irqchip).
- Disk, NIC and RNG each sit behind their own ``pcie-root-port``, whose ACS capability
  (hw/pci-bridge/pcie_root_port.c) makes the guest see real ACS and separate IOMMU
  groups, as on a GPU host where GPUs hang off root ports. One port stays empty.
- No ``-no-reboot``: a guest ``reboot`` resets the machine inside the same process.
- ``-smp 1``: with two vCPUs the guest's ``rcu_preempt`` thread alone used 60-71 s of
  CPU in its first 5-6 minutes (8 s with one), and QEMU's CPU fell with one vCPU, one
  boot each on this 2-core machine under load (2026-12-06, qemu utime+stime): boot to
  SSH 78 -> 63 s, ``update-initramfs -u -k all`` 119 -> 100 s, the whole probe (boot,
  forks, Python imports, initramfs, apt) 270 -> 228 s; the VM tier alone 916 CPU s
  against 1,100 with two in a CI run. The soft-RoCE measurement's ``ib_write_lat`` runs
  its server and client on the guest, both busy-polling: on one vCPU under load its
  latency rows can come out ``inf`` (perftest's CPU-MHz sample failing its fit); the
  product records the bandwidth and no latency, saying why (gpuserve/parsers/rdma.py
  ``UNCALIBRATED``), which is the lab test's assertion then. ``mitigations=off``
  and ``-cpu max,-la57`` saved nothing measurable (the guest reports Meltdown "Not
  affected": no page-table isolation to turn off).
- ``tb-size``: TCG's translation cache is 512 MiB (QEMU's default is 1 GiB). With the
  default, a guest reboot inside the same process once crawled (GRUB took ~2 min to load
  the kernel, 470 s to SSH), so the lab ran on 64 MiB for a while; but 64 MiB is far
  smaller than the guest's working set (Python, pip, systemd, SGLang's stand-in), and
  QEMU then flushes every translation and starts over about five times per pyinfra
  deploy (`info jit`: "TB flush count"). Measured on this 2-core machine, one VM, same
  disk (2026-12-02): 50 forks of /bin/true 2.5-2.7 s -> 2.1-2.3 s; five Python start-ups
  with http/ssl/asyncio imports 8.6-9.0 s -> 5.5-6.8 s; a no-op serve rerun 9.6 s ->
  5.8 s, `pyinfra exec -- true` 3.1 s -> 1.8 s (medians of 3); flushes 5 per workload
  -> none. A reboot back to SSH with 512 MiB: 56 s and 67 s, the second with the cache
  nearly full (487 MiB).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

QEMU = "qemu-system-x86_64"
GUEST_MAC = "52:54:00:6c:61:62"
# MiB of TCG translation cache (see the module docstring: throughput and reboots).
TCG_TB_SIZE_MIB = 512


@dataclass(frozen=True)
class VmSpec:
    """Everything that decides the QEMU command line of one instance."""

    name: str
    overlay: Path
    ssh_port: int
    serial_log: Path
    console_socket: Path
    qmp_socket: Path
    pidfile: Path
    memory_mib: int = 2048
    # one vCPU (module docstring): two cost ~185 CPU s more a VM tier
    cpus: int = 1


def qemu_argv(spec: VmSpec) -> list[str]:
    """The full QEMU command line (pure: unit-tested without starting anything)."""
    if spec.memory_mib < 2048:
        raise ValueError("the lab guest needs at least 2048 MiB")
    argv = [
        QEMU,
        "-name", f"gpuserve-lab-{spec.name},process=gpuserve-lab-{spec.name}",
        "-machine", "q35",
        "-accel", f"tcg,tb-size={TCG_TB_SIZE_MIB}",
        "-cpu", "max",
        "-smp", str(spec.cpus),
        "-m", str(spec.memory_mib),
        "-rtc", "base=utc",
        # The vIOMMU must come before the devices it translates.
        "-device", "intel-iommu,intremap=on",
    ]
    # Root ports: rp0 disk, rp1 NIC, rp2 RNG, rp3 left empty (a free GPU slot).
    for i in range(4):
        argv += ["-device", f"pcie-root-port,id=rp{i},bus=pcie.0,chassis={i + 1},"
                            f"port={0x10 + i}"]
    argv += [
        "-drive", f"file={spec.overlay},if=none,id=disk0,format=qcow2,"
                  "cache=writeback,discard=unmap",
        "-device", "virtio-blk-pci,drive=disk0,bus=rp0,bootindex=0",
        "-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
        "-device", f"virtio-net-pci,netdev=net0,bus=rp1,mac={GUEST_MAC}",
        "-object", "rng-random,id=rng0,filename=/dev/urandom",
        "-device", "virtio-rng-pci,rng=rng0,bus=rp2",
        "-display", "none",
        "-vga", "none",
        # Serial console: logged to a file and reachable on a socket for debugging.
        "-chardev", f"socket,id=ser0,path={spec.console_socket},server=on,wait=off,"
                    f"logfile={spec.serial_log},logappend=on",
        "-serial", "chardev:ser0",
        "-qmp", f"unix:{spec.qmp_socket},server=on,wait=off",
        "-pidfile", str(spec.pidfile),
        "-daemonize",
    ]
    return argv


def free_port(host: str = "127.0.0.1", udp: bool = False) -> int:
    """A port nobody listens on right now (the kernel picks it; a race remains, so
    callers retry when QEMU cannot bind it)."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def create_overlay(base: Path, overlay: Path) -> None:
    """A fresh qcow2 overlay on the read-only base image."""
    overlay.unlink(missing_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
                    "-b", str(base), str(overlay)], check=True)


def overlay_backing(overlay: Path) -> str | None:
    """The backing file an existing overlay points at (None if unreadable)."""
    r = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(overlay)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout).get("backing-filename")


def launch(spec: VmSpec) -> int:
    """Start QEMU daemonized; return its pid. Raises with QEMU's stderr on failure."""
    spec.pidfile.unlink(missing_ok=True)
    for sock in (spec.qmp_socket, spec.console_socket):
        sock.unlink(missing_ok=True)
    r = subprocess.run(qemu_argv(spec), capture_output=True, text=True)
    if r.returncode != 0:
        raise QemuStartError(r.stderr.strip() or f"qemu exited {r.returncode}")
    return int(spec.pidfile.read_text().strip())


class QemuStartError(RuntimeError):
    @property
    def port_taken(self) -> bool:
        return "host forwarding rule" in str(self)


def qmp(sock_path: Path, command: str, arguments: dict | None = None,
        timeout: float = 5.0) -> dict:
    """Run one QMP command (qemu-qmp-ref: greeting, qmp_capabilities, command)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock_path))
        f = s.makefile("rw")
        json.loads(f.readline())  # greeting
        for cmd, args in (("qmp_capabilities", None), (command, arguments)):
            f.write(json.dumps({"execute": cmd, **({"arguments": args} if args else {})})
                    + "\n")
            f.flush()
            while True:
                line = f.readline()
                if not line:
                    raise ConnectionError("QMP socket closed")
                msg = json.loads(line)
                if "event" in msg:
                    continue
                if "error" in msg:
                    raise RuntimeError(f"QMP {cmd}: {msg['error']}")
                break
        return msg


def wait_exit(pid: int, timeout: float) -> bool:
    from lab.state import pid_alive

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.5)
    return not pid_alive(pid)


def stop(pid: int, qmp_socket: Path, timeout: float = 90.0) -> str:
    """Shut the guest down cleanly: ACPI power button (systemd-logind powers off),
    then QMP ``quit`` and finally SIGKILL after the timeout. Returns how it ended."""
    try:
        qmp(qmp_socket, "system_powerdown")
    except (OSError, RuntimeError, ValueError):
        pass
    else:
        if wait_exit(pid, timeout):
            return "powered off"
    try:
        qmp(qmp_socket, "quit")
        if wait_exit(pid, 10):
            return "quit (guest did not power off in time)"
    except (OSError, RuntimeError, ValueError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "already gone"
    wait_exit(pid, 10)
    return "killed"
