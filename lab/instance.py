"""Bring one lab instance up, down, and report on it (the logic behind the CLI)."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lab import mirror, qemu
from lab.image import ensure_image
from lab.keys import ensure_keys, public_key, write_known_hosts
from lab.sshutil import close_mux, ssh_ok
from lab.state import (
    InstanceState,
    clear_state,
    instance_dir,
    list_instances,
    pid_alive,
    read_state,
    write_state,
)


def say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def serial_tail(path: Path | str, lines: int = 25) -> str:
    try:
        text = Path(path).read_bytes().decode(errors="replace")
    except OSError:
        return "(no serial log)"
    clean = text.replace("\r", "")
    return "\n".join(clean.splitlines()[-lines:])


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _last_line(path: Path) -> str:
    tail = [ln for ln in _ANSI.sub("", serial_tail(path, 5)).splitlines() if ln.strip()]
    return tail[-1][:100] if tail else ""


def wait_ssh(st: InstanceState, timeout: float, what: str = "boot") -> float:
    """Wait until a real SSH login works; show progress; fail with the serial tail."""
    t0 = time.monotonic()
    last_note = 0.0
    while True:
        elapsed = time.monotonic() - t0
        if not pid_alive(st.pid):
            raise RuntimeError(f"QEMU (pid {st.pid}) died during {what}; serial log tail:\n"
                               + serial_tail(st.serial_log))
        if ssh_ok(st.ssh_port, st.ssh_key, st.known_hosts, timeout=10):
            return elapsed
        if elapsed > timeout:
            raise TimeoutError(
                f"SSH did not answer within {timeout:.0f}s of {what}; "
                f"serial log {st.serial_log} ends with:\n" + serial_tail(st.serial_log))
        if elapsed - last_note >= 10:
            say(f"  [{elapsed:4.0f}s] waiting for SSH on 127.0.0.1:{st.ssh_port} ... "
                f"console: {_last_line(Path(st.serial_log))}")
            last_note = elapsed
        time.sleep(2)


KINDS = ("container", "vm")


def up(name: str, fresh: bool = False, memory_mib: int = 2048,
       timeout: float | None = None, clone_from: str | None = None,
       kind: str = "container", driver_version: str | None = None,
       os_name: str = "debian12", box: str | None = None) -> InstanceState:
    """Bring instance ``name`` up as a ``kind`` lab host: a systemd-nspawn container
    (lab/container.py; the default) or the QEMU VM (what needs a kernel).

    On a running instance (without ``fresh``) only the mirror is republished; one that
    runs as the other kind is refused. ``clone_from``: boot a new instance from a copy of
    that running instance's disk as it is now, with that instance's mirror. ``os_name``:
    the lab OS (lab/recipe.py); only container hosts run another than debian12."""
    if kind not in KINDS:
        raise ValueError(f"--kind {kind!r}: use one of {', '.join(KINDS)}")
    st = read_state(name)
    if st and pid_alive(st.pid) and st.kind != kind:
        raise RuntimeError(f"instance {name!r} runs as a {st.kind}: `python -m lab down "
                           f"--name {name}` first, or pass --kind {st.kind}")
    if not (st and pid_alive(st.pid)) or fresh or clone_from:
        close_mux(name)  # a new boot of this name
    if kind == "container":
        from lab import container_instance

        return container_instance.up(name, fresh=fresh, timeout=timeout or 120,
                                     driver_version=driver_version, clone_from=clone_from,
                                     os_name=os_name, box=box)
    if os_name != "debian12":
        raise ValueError(f"--os {os_name}: the VM lab host runs debian12 (a {os_name} host "
                         "is a container: --kind container)")
    if box:
        raise ValueError("--box: a VM lab host switches box inside: echo BOX > "
                         "/etc/gpuserve-lab/box (it has no /proc/driver/nvidia-nvswitch "
                         "stand-in; the option is for container hosts)")
    if driver_version:
        raise ValueError("--driver-version: a VM lab host's driver is what deploy/host.py "
                         "installs (the option is for container hosts)")
    timeout = timeout or 420
    if clone_from is not None:
        return _up_clone(name, clone_from, memory_mib, timeout)
    if st and pid_alive(st.pid):
        if not fresh:
            return republish(st, timeout)
        say(f"--fresh: stopping the running instance {name!r}")
        down(name)
    elif st:
        # A stale state file from a crashed run: clean up what is left.
        down(name)
    return _up_vm(name, fresh, memory_mib, timeout)


def republish(st: InstanceState, timeout: float) -> InstanceState:
    """A running instance: bring the mirror's wheels, apt repository and locks up to
    date with this checkout (each publisher skips by its stamp), restart a dead mirror,
    and check that SSH answers."""
    say(f"republishing the mirror at {st.mirror_root}")
    if Path(st.mirror_root) == mirror.shared_root():
        mirror.publish_shared(warn=lambda m: print(m, file=sys.stderr))
    else:  # an instance started before the mirror was shared
        mirror.publish_all(Path(st.mirror_root), warn=lambda m: print(m, file=sys.stderr))
    if not pid_alive(st.mirror_pid) and not st.extra.get("mirror_borrowed_from"):
        say("mirror was down; restarting it")
        st = _restart_mirror(st)
    if st.kind == "container":
        from lab import container_instance

        container_instance.wait_ssh(st, timeout, "an already running container")
    else:
        wait_ssh(st, timeout, "an already running guest")
    say(f"instance {st.name!r} already running (ssh port {st.ssh_port})")
    return st


def _up_vm(name: str, fresh: bool, memory_mib: int, timeout: float) -> InstanceState:
    client, hostkey = ensure_keys()
    base = ensure_image()
    idir = instance_dir(name)
    idir.mkdir(parents=True, exist_ok=True)
    overlay = idir / "disk.qcow2"
    if fresh or not overlay.exists() or qemu.overlay_backing(overlay) != str(base):
        if overlay.exists() and not fresh:
            say("the base image changed since this instance was created; resetting it")
        qemu.create_overlay(base, overlay)

    say(f"publishing the mirror at {mirror.shared_root()}")
    mirror_root = mirror.publish_shared(warn=lambda m: print(m, file=sys.stderr))
    mpid, mport = mirror.start(mirror_root, idir)

    serial_log = idir / "serial.log"
    serial_log.write_bytes(b"")
    t0 = time.monotonic()
    try:
        pid, spec = _launch(name, overlay, idir, memory_mib)
    except qemu.QemuStartError:
        mirror.stop(mpid)
        raise
    port = spec.ssh_port
    known_hosts = write_known_hosts(idir / "known_hosts", "127.0.0.1", port,
                                    public_key(hostkey))
    st = InstanceState(
        name=name, ssh_port=port, mirror_port=mport, pid=pid, mirror_pid=mpid,
        ssh_key=str(client), known_hosts=str(known_hosts), image=str(base),
        overlay=str(overlay), serial_log=str(serial_log), qmp_socket=str(spec.qmp_socket),
        mirror_root=str(mirror_root),
        extra={"console_socket": str(spec.console_socket), "memory_mib": memory_mib},
    )
    write_state(st)
    say(f"QEMU started (pid {pid}); booting through GRUB under TCG "
        f"(ssh 127.0.0.1:{port}, mirror {st.mirror_url})")
    try:
        wait_ssh(st, timeout)
    except Exception:
        say("boot failed; stopping the instance")
        down(name)
        raise
    say(f"instance {name!r} up: SSH answered {time.monotonic() - t0:.0f}s after start")
    return st


def _launch(name: str, overlay: Path, idir: Path, memory_mib: int) -> tuple[int, qemu.VmSpec]:
    """Start QEMU on a free SSH port (retried when another process took it meanwhile)."""
    for attempt in range(5):
        spec = qemu.VmSpec(name=name, overlay=overlay, ssh_port=qemu.free_port(),
                           serial_log=idir / "serial.log", console_socket=idir / "console.sock",
                           qmp_socket=idir / "qmp.sock", pidfile=idir / "qemu.pid",
                           memory_mib=memory_mib)
        try:
            return qemu.launch(spec), spec
        except qemu.QemuStartError as exc:
            if not (exc.port_taken and attempt < 4):
                raise
    raise AssertionError("unreachable")


def _up_clone(name: str, source: str, memory_mib: int, timeout: float) -> InstanceState:
    from lab import fleet

    src = read_state(source)
    if src is None or not pid_alive(src.pid):
        raise RuntimeError(f"--clone-from {source}: that instance is not running")
    old = read_state(name)
    if old is not None and pid_alive(old.pid):
        raise RuntimeError(f"instance {name!r} is running: `python -m lab down --name {name}` "
                           "first (a clone always starts from a new copy)")
    clear_state(name)
    t0 = time.monotonic()
    overlay = fleet.clone_disk(source, name)
    say(f"cloned {source}'s disk in {time.monotonic() - t0:.0f}s: {overlay}")
    idir = instance_dir(name)
    serial_log = idir / "serial.log"
    serial_log.write_bytes(b"")
    pid, spec = _launch(name, overlay, idir, memory_mib)
    port = spec.ssh_port
    client, hostkey = ensure_keys()
    known_hosts = write_known_hosts(idir / "known_hosts", "127.0.0.1", port,
                                    public_key(hostkey))
    st = InstanceState(
        name=name, ssh_port=port, mirror_port=src.mirror_port, pid=pid,
        mirror_pid=src.mirror_pid, ssh_key=str(client), known_hosts=str(known_hosts),
        image=src.image, overlay=str(overlay), serial_log=str(serial_log),
        qmp_socket=str(spec.qmp_socket), mirror_root=src.mirror_root,
        extra={"console_socket": str(spec.console_socket), "memory_mib": memory_mib,
               "mirror_borrowed_from": source},
    )
    write_state(st)
    say(f"QEMU started (pid {pid}) from {source}'s disk (ssh 127.0.0.1:{port}, "
        f"mirror of {source}: {st.mirror_url})")
    try:
        wait_ssh(st, timeout)
    except Exception:
        down(name)
        raise
    say(f"instance {name!r} up: SSH answered {time.monotonic() - t0:.0f}s after start")
    return st


def _restart_mirror(st: InstanceState) -> InstanceState:
    mpid, mport = mirror.start(Path(st.mirror_root), instance_dir(st.name))
    st.mirror_pid, st.mirror_port = mpid, mport
    write_state(st)
    return st


def down(name: str, timeout: float = 90.0) -> str:
    """Power the guest off or halt the container (kill after the timeout), stop the
    mirror, drop the state."""
    st = read_state(name)
    if st is None:
        return "not running"
    close_mux(name)
    if st.kind == "container":
        from lab import container_instance

        return container_instance.down(name, min(timeout, 60.0))
    result = "not running"
    if pid_alive(st.pid):
        say(f"shutting down {name!r} (pid {st.pid})")
        result = qemu.stop(st.pid, Path(st.qmp_socket), timeout=timeout)
    borrowed = st.extra.get("mirror_borrowed_from")
    if not borrowed:
        mirror.stop(st.mirror_pid)
    clear_state(name)
    say(f"{name!r}: {result}; " + (f"mirror (of {borrowed}) left running" if borrowed
                                   else "mirror stopped"))
    return result


def down_all(timeout: float = 90.0) -> dict[str, str]:
    return {n: down(n, timeout) for n in list_instances()}


def status(name: str) -> dict:
    """The truth about an instance: processes alive, SSH answering, ports."""
    st = read_state(name)
    if st is None:
        return {"name": name, "state": "down"}
    alive = pid_alive(st.pid)
    info = asdict(st)
    info.update(
        process_alive=alive,
        mirror_alive=pid_alive(st.mirror_pid),
        ssh_answers=alive and ssh_ok(st.ssh_port, st.ssh_key, st.known_hosts, timeout=10),
        mirror_url=st.mirror_url,
        hub_url=st.hub_url,
        hub_local_url=st.hub_local_url,
    )
    info["state"] = ("running" if info["ssh_answers"] else
                     "booting or unresponsive" if alive else "dead (stale state)")
    return info
