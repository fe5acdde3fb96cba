"""Lab hosts as systemd-nspawn containers: the lab image's own root at native speed.

Everything above the kernel (apt, users, venvs, systemd units and their sandboxing,
journald, sshd, the stand-in servers, the gateway, reboots of userland, faults) runs in a
container; what needs a kernel (GRUB, the initramfs, modules, IOMMU groups) stays on the
QEMU VM (lab/qemu.py). Why each part is built the way it is:

- Root: the VM image's ext4 partition, loop-mounted read-only at its 1 MiB offset, is the
  lower layer of an overlay whose upper layer lives on the host's own disk, an ext4 file
  of ``DISK_GIB`` (sparse) loop-mounted beside it: one image for every host, and a test
  that fills the host's disk fills that file, never this machine's disk.
- Network: a network namespace of the lab's own (``ip netns add``) with slirp4netns on
  ``tap0``: the addresses of QEMU's user network (guest 10.0.2.100, this machine's
  loopback as 10.0.2.2, DNS 10.0.2.3), so the mirror URL, the inventory and the tests are
  the VM's; SSH is a slirp ``hostfwd`` from a free 127.0.0.1 port. The namespace outlives
  a reboot of the container, so the port stays.
- Boot: ``systemd-nspawn -b`` under a supervisor (:func:`supervise`) that starts it
  again when it exits 133, nspawn's status for a reboot inside (systemd's own
  ``systemd-nspawn@.service`` restarts on it). ``--keep-unit --register=no``: this
  machine has no systemd manager to ask for a scope.
- The stand-in host kernel module: ``/proc/driver/nvidia/version`` inside is a read-only
  bind of a file in the host's upper layer (binds under /proc resolve their source
  inside the container), holding the format of the real file with the version the lab
  chose, as on a Proxmox LXC container whose GPUs' driver module is the host's.
- Cgroups: nspawn with ``--keep-unit`` puts the container under the cgroup it was
  started in (``<cgroup>/payload``); each host's nspawn starts in a cgroup of its own
  (:func:`host_cgroups`, named like its network namespace). In one shared cgroup two
  hosts' systemd managed the same ``/payload/system.slice/<unit>`` directories: a
  restart in one host failed to kill its server ("Failed to kill control group ...:
  Input/output error") and left it listening, with the other host's processes in the
  same cgroup.
- Stop: SIGTERM to the supervisor halts the container (nspawn passes it on as a
  shutdown); after the timeout, or after a crash, every process in the host's cgroups
  or whose root is the host's tree is killed, then the overlay and both loop mounts and
  the host's cgroups are removed. An ``up`` first removes whatever an earlier host of
  its name left when it was never taken down (:func:`clear_leftovers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab.state import lab_home, pid_alive

DISK_GIB = 8
# where the image's first partition starts (lab/image.py: PART_START sectors of 512)
PART_OFFSET = 2048 * 512
GUEST_ADDRESS = "10.0.2.100"
TAP = "tap0"
REBOOT_STATUS = 133
# the stand-in host module's version file, inside the container's own tree
DRIVER_DIR = "var/lib/gpuserve-lab/proc-driver-nvidia"
DEFAULT_DRIVER_VERSION = "580.126.20"
# a Debian 13 host's default: NVIDIA's debian13 repository has no R580 userspace, so its
# container's host runs a 590 module (lab/nvidia_repo/packages.yaml)
DEFAULT_DRIVER_VERSIONS = {"debian13": "590.48.01"}
# the stand-in host's NVSwitches as its driver lists them (/proc/driver/nvidia-nvswitch/
# devices/<PCI address>: NVIDIA/gpu-driver-container's test for Fabric Manager), from the
# box's box.json "nvswitch"; empty on boxes without NVSwitches
NVSWITCH_DIR = "var/lib/gpuserve-lab/proc-driver-nvidia-nvswitch"
BOX_FILE = "etc/gpuserve-lab/box"
BOXES = Path(__file__).resolve().parent / "nvidia_repo" / "boxes"
# NVIDIA's open kernel module as it names itself in /proc/driver/nvidia/version (the
# layout of that file; the build host and date are the lab's, labelled as composed)
DRIVER_VERSION_TEXT = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(gpuserve-lab@stand-in)  composed by the lab\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
# networkd inside: tap0 keeps slirp's static configuration (a DHCP client would race
# slirp4netns --configure), the fleet's veth is left alone (lab/fleet.py sets it)
NETWORK_FILES = {
    "etc/systemd/network/05-lab-container.network":
        "# The lab container's slirp4netns link (lab/container.py).\n"
        f"[Match]\nName={TAP}\n\n[Network]\nAddress={GUEST_ADDRESS}/24\n"
        "Gateway=10.0.2.2\nDNS=10.0.2.3\n",
    "etc/systemd/network/06-lab-fleet.network":
        "# The lab fleet's private link, configured by `python -m lab link`.\n"
        "[Match]\nName=fleet0\n\n[Link]\nUnmanaged=yes\n",
}
# the image's fstab names the VM's disk by UUID: nothing to remount in a container
MASKED = ("systemd-remount-fs.service",)


@dataclass(frozen=True)
class Paths:
    """Where one container host keeps its mounts and files (the instance directory)."""

    idir: Path

    @property
    def lower(self) -> Path:
        return self.idir / "lower"

    @property
    def disk_file(self) -> Path:
        return self.idir / "disk.ext4"

    @property
    def disk(self) -> Path:
        return self.idir / "disk"

    @property
    def root(self) -> Path:
        return self.idir / "root"

    @property
    def console_log(self) -> Path:
        return self.idir / "console.log"

    @property
    def slirp_socket(self) -> Path:
        return self.idir / "slirp.sock"

    @property
    def mountpoints(self) -> tuple[Path, Path, Path]:
        """In the order they are unmounted."""
        return (self.root, self.disk, self.lower)


def netns_name(name: str, home: Path | None = None) -> str:
    """The host's network namespace: unique per lab home and instance, so two lab runs
    side by side (another GPUSERVE_LAB_HOME or GPUSERVE_LAB_NAME) never share one."""
    digest = hashlib.sha256(str((home or lab_home()).resolve()).encode()).hexdigest()[:8]
    return f"gpuserve-lab-{digest}-{name}"


def nspawn_argv(root: Path, netns: str, machine: str,
                binds: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """The container's command line (pure: unit-tested without starting anything)."""
    argv = ["systemd-nspawn", "--boot", f"--directory={root}", f"--machine={machine}",
            "--register=no", "--keep-unit", f"--network-namespace-path=/run/netns/{netns}",
            "--resolv-conf=off", "--timezone=off", "--link-journal=no",
            # root may manage its own network namespace, as on a host (`ss -K` cuts a
            # connection in the faults' tests; nspawn drops the capability by default)
            "--capability=CAP_NET_ADMIN",
            "--tmpfs=/proc/driver:mode=0555",
            f"--bind-ro=/{DRIVER_DIR}:/proc/driver/nvidia",
            f"--bind-ro=/{NVSWITCH_DIR}:/proc/driver/nvidia-nvswitch"]
    argv += [f"--bind-ro={src}:{dst}" for src, dst in binds]
    return argv


def slirp_argv(netns: str, api_socket: Path) -> list[str]:
    """slirp4netns on the namespace's tap0 (this machine's loopback is 10.0.2.2 there)."""
    return ["slirp4netns", "--configure", "--mtu=65520", f"--api-socket={api_socket}",
            "--netns-type=path", f"/run/netns/{netns}", TAP]


def driver_version_text(version: str) -> str:
    return DRIVER_VERSION_TEXT.format(version=version)


def write_host_files(root: Path, driver_version: str) -> None:
    """What makes the shared image this container host: network files, masks and the
    stand-in kernel module's version file, written into its upper layer."""
    for rel, text in NETWORK_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for unit in MASKED:
        link = root / "etc/systemd/system" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
    set_driver_version(root, driver_version)
    (root / NVSWITCH_DIR / "devices").mkdir(parents=True, exist_ok=True)


def box_names() -> list[str]:
    return sorted(p.name for p in BOXES.iterdir() if (p / "box.json").is_file())


def set_box(root: Path, box: str) -> list[str]:
    """Make the container's recorded hardware ``box``: the guest's /etc/gpuserve-lab/box
    (what the stand-ins read) and the NVSwitches its host driver lists, seen at once
    inside (running container or not). Returns the NVSwitch addresses."""
    if box not in box_names():
        raise ValueError(f"unknown box {box!r}; boxes: {', '.join(box_names())}")
    switches = json.loads((BOXES / box / "box.json").read_text()).get("nvswitch") or []
    devices = root / NVSWITCH_DIR / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    for old in devices.iterdir():
        old.unlink()
    for address in switches:
        (devices / address).write_text(f"{address}\n")
    (root / BOX_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / BOX_FILE).write_text(f"{box}\n")
    return list(switches)


def set_driver_version(root: Path, version: str) -> None:
    """Rewrite the stand-in host module's version file in place (the bind shows it at
    once, running container or not)."""
    d = root / DRIVER_DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / "version").write_text(driver_version_text(version))


# -- mounts --------------------------------------------------------------------------

def _mounted(path: Path) -> bool:
    target = str(path.resolve()) if path.exists() else str(path)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def _run(*argv: str, timeout: float = 120) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-600:]}")


def mount_root(p: Paths, image: Path, fresh: bool) -> None:
    """The image read-only, the host's disk, the overlay of the two (idempotent)."""
    for d in p.mountpoints:
        d.mkdir(parents=True, exist_ok=True)
    if not _mounted(p.lower):
        _run("mount", "-t", "ext4", "-o", f"ro,noload,loop,offset={PART_OFFSET}",
             str(image), str(p.lower))
    if fresh or not p.disk_file.exists():
        p.disk_file.unlink(missing_ok=True)
        with open(p.disk_file, "wb") as fh:
            fh.truncate(DISK_GIB * 1024**3)
        _run("mkfs.ext4", "-q", "-F", "-L", "labdisk", str(p.disk_file))
    if not _mounted(p.disk):
        _run("mount", "-t", "ext4", "-o", "loop", str(p.disk_file), str(p.disk))
    for d in ("upper", "work"):
        (p.disk / d).mkdir(exist_ok=True)
    if not _mounted(p.root):
        _run("mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={p.lower},upperdir={p.disk}/upper,workdir={p.disk}/work",
             str(p.root))


def unmount_root(p: Paths) -> list[str]:
    """Remove the overlay and both loop mounts; returns what could not be unmounted
    (then detached lazily, so nothing stays in the mount table)."""
    stuck = []
    for d in p.mountpoints:
        if not _mounted(d):
            continue
        r = subprocess.run(["umount", str(d)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=60)
            stuck.append(f"{d}: {r.stderr.strip()}")
    return stuck


def clear_leftovers(p: Paths, netns: str, replacing_disk: bool = False) -> list[str]:
    """Before a host is started again: what an earlier host of this name left behind
    when it was not taken down (a crash, a killed ``up``, a lost state file): its
    processes, network namespace (with its slirp4netns), cgroups, mounts and loop
    devices. Mounting over stale mounts reused them, and a clone's copy then rewrote a
    disk file still mounted there: the clone failed with "Structure needs cleaning" or a
    read-only overlay. A disk file about to be kept is waited on until no loop device
    holds it; one about to be replaced by a new file (``replacing_disk``: a fresh host,
    a clone) is not, since a held loop keeps only the old file. Returns what it removed."""
    removed = []
    cgroups = host_cgroups(netns)
    if killed := kill_cgroups(cgroups):
        removed.append(f"{killed} process(es) in its cgroups")
    procs = processes_in(p.root) if p.root.exists() else []
    procs += processes_naming(p.idir)  # its slirp4netns and mirror, outside its cgroups
    if Path(f"/run/netns/{netns}").exists():
        r = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                           timeout=60)
        procs += [int(x) for x in r.stdout.split() if x.isdigit()]
    for pid in sorted(set(procs)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if procs:
        removed.append(f"{len(set(procs))} process(es)")
        time.sleep(0.5)
    removed += [f"{d} (mounted)" for d in p.mountpoints if _mounted(d)]
    removed += [f"{s} (not unmounted, detached)" for s in unmount_root(p)]
    remove_cgroups(cgroups)
    if Path(f"/run/netns/{netns}").exists():
        netns_delete(netns)
        removed.append(f"network namespace {netns}")
    removed += [f"{d} (loop device of {p.disk_file.name})"
                for d in detach_loops(p, wait=0.0 if replacing_disk else LOOP_WAIT_S)]
    return removed


def loops_of(disk_file: Path) -> list[str]:
    """The loop devices attached to ``disk_file`` (``losetup --associated``)."""
    r = subprocess.run(["losetup", "--associated", str(disk_file)], capture_output=True,
                       text=True, timeout=60)
    return [line.split(":", 1)[0] for line in r.stdout.splitlines() if line.strip()]


#: How long a start waits for the loop devices still holding a disk file it keeps.
LOOP_WAIT_S = 120.0


def detach_loops(p: Paths, wait: float) -> list[str]:
    """Detach the loop devices still holding the host's disk file (autoclear: the kernel
    frees each once its last mount has gone) and wait up to ``wait`` until none is left:
    after a lazy unmount a busy loop device only goes once its last user has (on a
    machine busy with other test processes one was still attached 10 s after its
    unmount, another 30 s after a killed host's orphans had gone; with other container
    hosts running, until they stopped). Returns the devices that were still attached
    at first."""
    devices = loops_of(p.disk_file)
    deadline = time.monotonic() + wait
    left = devices
    while left:
        for device in left:
            subprocess.run(["losetup", "--detach", device], capture_output=True, timeout=60)
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
        left = loops_of(p.disk_file)
    return devices


def processes_naming(directory: Path) -> list[int]:
    """Pids whose command line names a path inside ``directory`` (an instance's
    slirp4netns and mirror name their socket and port file there)."""
    prefix = f"{directory.resolve()}/".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if any(arg.startswith(prefix) or b"=" + prefix in arg
                       for arg in (entry / "cmdline").read_bytes().split(b"\0")):
                    pids.append(int(entry.name))
    return pids


def processes_in(root: Path) -> list[int]:
    """Pids whose root directory is the container's tree (its whole userland)."""
    target = str(root.resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "root") == target:
                    pids.append(int(entry.name))
    return pids


# -- limits --------------------------------------------------------------------------

# systemd as PID 1 takes several inotify instances of the machine's per-user budget
# (fs.inotify.max_user_instances, 128 by default): the 17th container failed to boot
# with "Failed to create control group inotify object: Too many open files"
INOTIFY_INSTANCES = 8192


def raise_inotify_limit(log=print) -> None:
    """Enough inotify instances for many containers (raised, never lowered)."""
    path = Path("/proc/sys/fs/inotify/max_user_instances")
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text()) < INOTIFY_INSTANCES:
            path.write_text(f"{INOTIFY_INSTANCES}\n")
            log(f"raised fs.inotify.max_user_instances to {INOTIFY_INSTANCES} (systemd in "
                "each container takes several)")


# -- network -------------------------------------------------------------------------

def netns_add(netns: str) -> None:
    if not Path(f"/run/netns/{netns}").exists():
        _run("ip", "netns", "add", netns)
    _run("ip", "-n", netns, "link", "set", "lo", "up")


def netns_delete(netns: str) -> None:
    if Path(f"/run/netns/{netns}").exists():
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=60)


def slirp_api(sock: Path, execute: str, arguments: dict | None = None,
              timeout: float = 10) -> dict:
    """One request to slirp4netns's API socket (its JSON, like QMP's)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(json.dumps({"execute": execute, "arguments": arguments or {}}).encode())
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    answer = json.loads(data or b"{}")
    if "error" in answer:
        raise RuntimeError(f"slirp4netns {execute}: {answer['error']}")
    return answer


def start_slirp(netns: str, p: Paths, timeout: float = 10) -> int:
    p.slirp_socket.unlink(missing_ok=True)
    log = open(p.idir / "slirp.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(slirp_argv(netns, p.slirp_socket), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not p.slirp_socket.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"slirp4netns did not start: "
                               f"{(p.idir / 'slirp.log').read_text(errors='replace')[-600:]}")
        time.sleep(0.05)
    return proc.pid


def add_forward(sock: Path, guest_port: int, host_port: int,
                guest_address: str = GUEST_ADDRESS) -> int:
    """A 127.0.0.1 port of this machine to the container's ``guest_port``; returns the
    forward's id (for :func:`remove_forward`)."""
    answer = slirp_api(sock, "add_hostfwd", {
        "proto": "tcp", "host_addr": "127.0.0.1", "host_port": host_port,
        "guest_addr": guest_address, "guest_port": guest_port})
    return int(answer["return"]["id"])


def remove_forward(sock: Path, forward_id: int) -> None:
    slirp_api(sock, "remove_hostfwd", {"id": forward_id})


# -- cgroups ---------------------------------------------------------------------------

def cgroup_roots(mountinfo: str | None = None) -> list[Path]:
    """The hierarchies systemd manages units in: every cgroup2 mount and the v1
    ``name=systemd`` one (a hybrid machine has both)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    roots = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split()[:3]
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
            roots.append(Path(fields[4]))
    return roots


def host_cgroups(name: str, roots: list[Path] | None = None) -> list[Path]:
    """Where one host's nspawn runs in each hierarchy (``name``: its netns name, unique
    per lab home and instance)."""
    return [root / "gpuserve-lab" / name for root in (cgroup_roots() if roots is None
                                                      else roots)]


def enter_cgroups(cgroups: list[Path]) -> None:
    """Move the calling process into each cgroup (made when absent)."""
    for cg in cgroups:
        cg.mkdir(parents=True, exist_ok=True)
        (cg / "cgroup.procs").write_text(f"{os.getpid()}\n")


def cgroup_pids(cgroups: list[Path]) -> set[int]:
    """Every process in the host's cgroups and below (the container's whole userland,
    whatever its root now resolves to)."""
    pids: set[int] = set()
    for cg in cgroups:
        if cg.is_dir():
            for procs in cg.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(x) for x in procs.read_text().split())
    return pids


def kill_cgroups(cgroups: list[Path], timeout: float = 10.0) -> int:
    """SIGKILL every process in the host's cgroups, until none is left or ``timeout``;
    returns how many there were."""
    first = cgroup_pids(cgroups)
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(cgroups)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return len(first)


def remove_cgroups(cgroups: list[Path]) -> None:
    """Remove the host's cgroups, deepest first (nspawn's ``payload`` and ``supervisor``
    and what the container's systemd made under them); a cgroup still holding a process
    stays."""
    for cg in cgroups:
        if not cg.is_dir():
            continue
        for d in sorted((p for p in cg.rglob("*") if p.is_dir()),
                        key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            cg.rmdir()


# -- the supervisor ------------------------------------------------------------------

def supervise(argv: list[str], log: Path, cgroups: list[Path] | None = None) -> int:
    """Run the container (in ``cgroups``, when given); again when it exits for a reboot
    (133); pass SIGTERM on."""
    child: subprocess.Popen | None = None
    stopping = False

    def on_term(signum, frame):  # noqa: ARG001
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with open(log, "ab", buffering=0) as out:
        while True:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=(lambda: enter_cgroups(cgroups))
                                     if cgroups else None)
            rc = child.wait()
            out.write(f"\n[lab supervisor: systemd-nspawn exited {rc}]\n".encode())
            if rc != REBOOT_STATUS or stopping:
                return rc


def start_supervisor(argv: list[str], log: Path, cgroup_name: str) -> int:
    """The supervisor in a session of its own (it outlives `python -m lab up`); its
    nspawn runs in the host's own cgroups (:func:`host_cgroups`)."""
    proc = subprocess.Popen([sys.executable, "-m", "lab.container", "supervise",
                             "--log", str(log), "--cgroup", cgroup_name, "--", *argv],
                            cwd=Path(__file__).resolve().parent.parent,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def stop(supervisor_pid: int, root: Path, timeout: float = 60.0,
         cgroups: list[Path] | None = None) -> str:
    """Halt the container (SIGTERM to its supervisor), kill what is left after
    ``timeout`` (what is in the host's ``cgroups``, and what runs in its tree); returns
    how it ended."""
    result = "not running"
    if pid_alive(supervisor_pid):
        os.kill(supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        result = "halted" if not pid_alive(supervisor_pid) else "killed after the timeout"
    killed = kill_cgroups(cgroups) if cgroups else 0
    left = processes_in(root) if root.exists() else []
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if pid_alive(supervisor_pid):
        os.kill(supervisor_pid, signal.SIGKILL)
    if (left or killed) and result == "not running":
        result = f"killed {len(left) + killed} leftover process(es)"
    return result


def stop_slirp(pid: int | None) -> None:
    if pid and pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["supervise"] and "--" in args and args[1:2] == ["--log"] \
            and args[3:4] == ["--cgroup"]:
        return supervise(args[args.index("--") + 1:], Path(args[2]), host_cgroups(args[4]))
    print("usage: python -m lab.container supervise --log FILE --cgroup NAME -- NSPAWN-ARGV",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
