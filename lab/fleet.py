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

Container hosts (lab/container.py) need neither trick: a clone copies the source's disk
file with its filesystem frozen, and the private network is a bridge in a network
namespace of the lab's own with a veth pair per host (``fleet0`` inside), so any number
of hosts share one link; ``forward`` is a slirp4netns ``hostfwd``, QEMU's twin.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from lab import container, qemu
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
    """Join running instances on a private network and give host i the address
    10.77.0.<i+1>/24. VMs: a hot-plugged NIC each, joined by UDP sockets (exactly two);
    containers: a bridge and a veth pair each (any number). Returns {instance: address}."""
    states = [_running(n) for n in names]
    kinds = {st.kind for st in states}
    if kinds == {"container"}:
        return _link_containers(states)
    if len(kinds) > 1:
        raise ValueError("link joins instances of one kind (all containers or two VMs)")
    if len(names) != 2:
        raise ValueError("a socket link joins exactly two VM instances")
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
    if st.kind == "container":
        unlink_container(st)
        return
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
    if st.kind == "container":
        return _forward_container(st, guest_port)
    port = qemu.free_port()
    answer = qemu.qmp(Path(st.qmp_socket), "human-monitor-command", {
        "command-line": f"hostfwd_add net0 tcp:127.0.0.1:{port}-:{guest_port}"})
    if answer.get("return"):
        raise RuntimeError(f"hostfwd_add: {answer['return'].strip()}")
    st.extra = {**st.extra, "forwards": {**known, str(guest_port): port}}
    write_state(st)
    return port


# -- container hosts -------------------------------------------------------------------

def _bridge_netns(first: InstanceState) -> str:
    return f"{first.extra['netns']}-fleet"


def _ip(*args: str) -> None:
    container._run("ip", *args)


def _link_containers(states: list[InstanceState]) -> dict[str, str]:
    bridge = _bridge_netns(states[0])
    for st in states:
        unlink_container(st)
    container.netns_add(bridge)
    _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
    _ip("-n", bridge, "link", "set", "br0", "up")
    out = {}
    for i, st in enumerate(states):
        port, address = f"fl{i}", f"{SUBNET}.{i + 1}"
        _ip("-n", bridge, "link", "add", port, "type", "veth", "peer", "name", "fleet0",
            "netns", st.extra["netns"])
        _ip("-n", bridge, "link", "set", port, "master", "br0", "up")
        _ip("-n", st.extra["netns"], "addr", "replace", f"{address}/24", "dev", "fleet0")
        _ip("-n", st.extra["netns"], "link", "set", "fleet0", "up")
        st.extra = {**st.extra, "fleet_address": address, "fleet_ifname": "fleet0",
                    "fleet_bridge": bridge}
        write_state(st)
        out[st.name] = address
    _ssh(states[0], f"for i in $(seq 30); do ping -c1 -W1 {SUBNET}.{len(states)} "
                    ">/dev/null && exit 0; done; exit 1", timeout=90)
    return out


def unlink_container(st: InstanceState) -> None:
    """Remove the host's veth (its bridge port goes with it), the bridge's namespace
    once no host is on it, and the host's forwards."""
    netns = st.extra.get("netns")
    if netns and Path(f"/run/netns/{netns}").exists():
        subprocess.run(["ip", "-n", netns, "link", "delete", "fleet0"], capture_output=True,
                       timeout=60)
    bridge = st.extra.get("fleet_bridge")
    if bridge and Path(f"/run/netns/{bridge}").exists():
        ports = subprocess.run(["ip", "-n", bridge, "-o", "link", "show", "type", "veth"],
                               capture_output=True, text=True, timeout=60).stdout
        if not ports.strip():
            container.netns_delete(bridge)
    for forward_id in st.extra.get("forward_ids", {}).values():
        with contextlib.suppress(RuntimeError, OSError):
            container.remove_forward(Path(st.qmp_socket), int(forward_id))
    st.extra = {k: v for k, v in st.extra.items()
                if not k.startswith("fleet_") and k not in ("forwards", "forward_ids")}
    if read_state(st.name) is not None:
        write_state(st)


def _forward_container(st: InstanceState, guest_port: int) -> int:
    for attempt in range(5):
        port = qemu.free_port()
        try:
            forward_id = container.add_forward(Path(st.qmp_socket), guest_port, port)
            break
        except RuntimeError:
            if attempt == 4:
                raise
    st.extra = {**st.extra,
                "forwards": {**st.extra.get("forwards", {}), str(guest_port): port},
                "forward_ids": {**st.extra.get("forward_ids", {}), str(guest_port): forward_id}}
    write_state(st)
    return port
