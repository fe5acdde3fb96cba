"""Several lab instances as one fleet: a clone of a served host, a private network
between the guests, and a host-forwarded port for a client on this machine.

Why a clone: deploying a second host from scratch (driver, CUDA, NCCL, SGLang venv,
reboot) costs the tier minutes under TCG; the fleet tests are about the gateway and the
rolling switch, not provisioning, which the single-host modules already cover. So the
second instance boots from a point-in-time copy of the first one's disk: QMP
``drive-backup`` with ``sync: top`` copies only what the running first guest wrote over
the base image, into a new overlay on the same base (copy-before-write: consistent at the
moment it starts, like a power cut after ``sync``). The clone borrows the first one's
package mirror (its disk already names it: 10.0.2.2 is this machine for every guest).

Why a socket network: QEMU's user network gives each guest its own 10.0.2.0/24 and no
way to reach another guest. A virtio NIC per guest on ``-netdev socket,udp=...`` (UDP
between the two QEMU processes on 127.0.0.1 only) is a private Ethernet link between
them, hot-plugged into the empty root port ``rp3`` of a running guest; each gets a
static 10.77.0.0/24 address. Nothing leaves this machine.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from lab import qemu
from lab.sshutil import run_in
from lab.state import InstanceState, instance_dir, read_state, write_state

SUBNET = "10.77.0"
FLEET_MAC = "52:54:00:66:6c:{:02x}"
NETDEV, DEVICE = "fleet0", "fleetnic"


def _running(name: str) -> InstanceState:
    st = read_state(name)
    if st is None:
        raise RuntimeError(f"lab instance {name!r} is not running: `python -m lab up --name "
                           f"{name}` first")
    return st


def _ssh(st: InstanceState, command: str, timeout: float = 120) -> str:
    return run_in(st, command, timeout)


def clone_disk(source: str, name: str, timeout: float = 600) -> Path:
    """A new overlay for instance ``name`` holding the running ``source`` guest's disk as
    it is now (QMP drive-backup, sync top). Returns its path.

    (Resuming a copy of the running state with ``-incoming`` instead of booting was
    tried: the copy never answered SSH under TCG here, so the clone boots.)"""
    st = _running(source)
    _ssh(st, "sync")
    overlay = instance_dir(name) / "disk.qcow2"
    overlay.parent.mkdir(parents=True, exist_ok=True)
    qemu.create_overlay(Path(st.image), overlay)
    sock, job = Path(st.qmp_socket), f"clone-{name}"
    qemu.qmp(sock, "drive-backup", {"device": "disk0", "job-id": job, "sync": "top",
                                    "target": str(overlay), "format": "qcow2",
                                    "mode": "existing"})
    deadline = time.monotonic() + timeout
    while any(j.get("device") == job for j in qemu.qmp(sock, "query-block-jobs")["return"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"cloning {source}'s disk did not finish in {timeout:.0f} s")
        time.sleep(0.5)
    return overlay


def link(names: list[str]) -> dict[str, str]:
    """Hot-plug a NIC into each running instance, joined pairwise by UDP sockets (two
    instances: one link), and give guest i the address 10.77.0.<i+1>/24. Returns
    {instance: address}."""
    if len(names) != 2:
        raise ValueError("a socket link joins exactly two instances")
    states = [_running(n) for n in names]
    ports = [qemu.free_port(udp=True) for _ in states]
    out = {}
    for i, st in enumerate(states):
        local, remote = ports[i], ports[1 - i]
        sock = Path(st.qmp_socket)
        qemu.qmp(sock, "netdev_add", {"type": "socket", "id": NETDEV,
                                      "udp": f"127.0.0.1:{remote}",
                                      "localaddr": f"127.0.0.1:{local}"})
        mac = FLEET_MAC.format(i + 1)
        qemu.qmp(sock, "device_add", {"driver": "virtio-net-pci", "netdev": NETDEV,
                                      "bus": "rp3", "mac": mac, "id": DEVICE})
        address = f"{SUBNET}.{i + 1}"
        # the guest names the hot-plugged NIC itself; find it by its MAC
        ifname = _ssh(st, "for i in $(seq 60); do "
                          f"dev=$(ip -o link | awk -F': ' '/{mac}/ {{print $2}}'); "
                          '[ -n "$dev" ] && break; sleep 0.5; done; [ -n "$dev" ] && '
                          f'ip addr replace {address}/24 dev "$dev" && '
                          'ip link set "$dev" up && echo "$dev"').strip().splitlines()[-1]
        st.extra = {**st.extra, "fleet_address": address, "fleet_mac": mac,
                    "fleet_ifname": ifname}
        write_state(st)
        out[st.name] = address
    _ssh(states[0], f"for i in $(seq 30); do ping -c1 -W1 {SUBNET}.2 >/dev/null && exit 0; "
                    "done; exit 1", timeout=90)
    return out


def unlink(name: str) -> None:
    """Unplug the instance's fleet NIC (the empty root port is a free GPU slot again)."""
    st = _running(name)
    sock = Path(st.qmp_socket)
    for command, args in (("device_del", {"id": DEVICE}), ("netdev_del", {"id": NETDEV})):
        with contextlib.suppress(RuntimeError):
            qemu.qmp(sock, command, args)
        time.sleep(1)
    for port in st.extra.get("forwards", {}).values():
        with contextlib.suppress(RuntimeError, OSError):
            qemu.qmp(sock, "human-monitor-command",
                     {"command-line": f"hostfwd_remove net0 tcp:127.0.0.1:{port}"})
    st.extra = {k: v for k, v in st.extra.items()
                if not k.startswith("fleet_") and k != "forwards"}
    write_state(st)


def forward(name: str, guest_port: int) -> int:
    """Forward a free 127.0.0.1 port of this machine to ``guest_port`` of the guest (QEMU
    user network ``hostfwd_add``); returns the host port, kept in the instance's state."""
    st = _running(name)
    known = st.extra.get("forwards", {})
    if str(guest_port) in known:
        return int(known[str(guest_port)])
    port = qemu.free_port()
    answer = qemu.qmp(Path(st.qmp_socket), "human-monitor-command", {
        "command-line": f"hostfwd_add net0 tcp:127.0.0.1:{port}-:{guest_port}"})
    if answer.get("return"):
        raise RuntimeError(f"hostfwd_add: {answer['return'].strip()}")
    st.extra = {**st.extra, "forwards": {**known, str(guest_port): port}}
    write_state(st)
    return port
