"""Bring one container lab host up and down (lab/container.py says how it is built).

The same contract as the VM's (lab/instance.py): a state file with the SSH port, the
mirror and the pids; `up` waits for a real SSH login; a failed boot stops everything it
started and reports the container's own console (nspawn's message included).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

from lab import container, mirror, qemu
from lab.image import ensure_image
from lab.keys import ensure_keys, public_key, write_known_hosts
from lab.recipe import DEFAULT_OS
from lab.sshutil import run_in, ssh_ok
from lab.state import (
    InstanceState,
    clear_state,
    instance_dir,
    pid_alive,
    read_state,
    write_state,
)

#: How long `down` waits for the disk's loop device to go (a host alone: at once).
DOWN_LOOP_WAIT_S = 5.0


def _say(msg: str) -> None:
    from lab.instance import say

    say(msg)


def console_tail(path: Path | str, lines: int = 25) -> str:
    from lab.instance import serial_tail

    return serial_tail(path, lines)


def up(name: str, fresh: bool = False, timeout: float = 120.0,
       driver_version: str | None = None, clone_from: str | None = None,
       os_name: str = DEFAULT_OS, box: str | None = None) -> InstanceState:
    """Build/reuse the image of ``os_name``, mount the host's tree, start its network and
    the mirror, boot, wait for SSH. A running host is left running (the mirror
    republished, its box switched when ``box`` is given); one running another OS is
    refused unless ``fresh``."""
    st = read_state(name)
    if st and pid_alive(st.pid) and not fresh and clone_from is None:
        from lab.instance import republish

        running = st.extra.get("os", DEFAULT_OS)
        if running != os_name:
            raise RuntimeError(f"instance {name!r} runs {running}: `python -m lab down "
                               f"--name {name}` first, or pass --fresh or --os {running}")
        if box:
            container.set_box(Path(st.extra["root"]), box)
        return republish(st, timeout)
    if st:  # a running one with --fresh, or a stale state file from a crash
        from lab.instance import down as down_any

        down_any(name)
    source = _clone_source(clone_from) if clone_from else None
    client, hostkey = ensure_keys()
    if source is not None:
        os_name = source.extra.get("os", DEFAULT_OS)  # a clone runs its source's OS
    image = ensure_image(os_name=os_name)
    idir = instance_dir(name)
    idir.mkdir(parents=True, exist_ok=True)
    paths = container.Paths(idir)
    replacing = fresh or source is not None  # mount_root's new file, or the clone's copy
    if left := container.clear_leftovers(paths, container.netns_name(name), replacing):
        _say(f"removed what an earlier {name!r} left behind: {'; '.join(left)}")
    if source is not None:
        _copy_disk(source, paths)
    version = driver_version or (source.extra.get("driver_version") if source else None) \
        or container.DEFAULT_DRIVER_VERSIONS.get(os_name, container.DEFAULT_DRIVER_VERSION)
    try:
        container.mount_root(paths, image, fresh=fresh and source is None)
        container.write_host_files(paths.root, version)
        if box:
            container.set_box(paths.root, box)
    except BaseException:
        container.unmount_root(paths)
        raise
    container.raise_inotify_limit(_say)
    netns = container.netns_name(name)
    container.netns_add(netns)
    st = InstanceState(
        name=name, ssh_port=0, mirror_port=0, pid=0, mirror_pid=0, ssh_key=str(client),
        known_hosts="", image=str(image), overlay=str(paths.disk_file),
        serial_log=str(paths.console_log), qmp_socket=str(paths.slirp_socket),
        mirror_root=str(source.mirror_root if source else mirror.shared_root()),
        extra={"netns": netns, "root": str(paths.root), "driver_version": version,
               "os": os_name},
        kind="container")
    write_state(st)  # from here on `down` finds and removes what this start made
    try:
        _start(st, paths, hostkey, source, timeout)
    except BaseException:
        _say("boot failed; stopping the container and removing its mounts")
        down(name)
        raise
    return st


def _clone_source(source: str) -> InstanceState:
    src = read_state(source)
    if src is None or not pid_alive(src.pid) or src.kind != "container":
        raise RuntimeError(f"--clone-from {source}: no running container lab host of that "
                           "name")
    return src


def _copy_disk(source: InstanceState, paths: container.Paths) -> None:
    """A point-in-time copy of the running source's disk: its filesystem frozen for the
    copy (fsfreeze), so the clone starts as after a clean power cut."""
    t0 = time.monotonic()
    run_in(source, "sync")
    src_disk = Path(source.overlay)
    frozen = container.Paths(src_disk.parent).disk
    paths.idir.mkdir(parents=True, exist_ok=True)
    # a new file renamed into place: a disk file is never rewritten under a mount
    partial = paths.disk_file.with_name(paths.disk_file.name + ".partial")
    subprocess.run(["fsfreeze", "-f", str(frozen)], check=True, timeout=60)
    try:
        partial.unlink(missing_ok=True)
        subprocess.run(["cp", "--sparse=always", str(src_disk), str(partial)],
                       check=True, timeout=600)
    finally:
        subprocess.run(["fsfreeze", "-u", str(frozen)], check=False, timeout=60)
    check_disk(partial)
    partial.replace(paths.disk_file)
    _say(f"cloned {source.name}'s disk in {time.monotonic() - t0:.1f}s")


def check_disk(disk_file: Path) -> None:
    """e2fsck the copy before its first mount (repaired, saying so, or refused): a copy
    is checked rather than trusted."""
    r = subprocess.run(["e2fsck", "-f", "-y", str(disk_file)], capture_output=True,
                       text=True, timeout=300)
    if r.returncode in (1, 2):
        _say(f"e2fsck repaired the cloned disk:\n{r.stdout.strip()[-1500:]}")
    elif r.returncode != 0:
        raise RuntimeError(f"e2fsck {disk_file} exited {r.returncode}: "
                           f"{(r.stdout + r.stderr).strip()[-1500:]}")


def _start(st: InstanceState, paths: container.Paths, hostkey: Path,
           source: InstanceState | None, timeout: float) -> None:
    st.extra["slirp_pid"] = container.start_slirp(st.extra["netns"], paths)
    st.ssh_port, st.extra["ssh_forward"] = _forward_ssh(paths.slirp_socket)
    st.known_hosts = str(write_known_hosts(paths.idir / "known_hosts", "127.0.0.1",
                                           st.ssh_port, public_key(hostkey)))
    paths.console_log.write_bytes(b"")
    argv = container.nspawn_argv(paths.root, st.extra["netns"], f"gpuserve-{st.name}")
    # a lab knob for the lab's own tests (a boot that fails), never set by product code
    argv += shlex.split(os.environ.get("GPUSERVE_LAB_NSPAWN_ARGS", ""))
    t0 = time.monotonic()
    st.pid = container.start_supervisor(argv, paths.console_log, st.extra["netns"])
    write_state(st)
    _say(f"systemd-nspawn started (supervisor pid {st.pid}; ssh 127.0.0.1:{st.ssh_port})")
    # the mirror is published while the container boots (a boot that fails says so
    # first); nothing in the container reads it before a deploy
    if source is None:
        _say(f"publishing the mirror at {st.mirror_root}")
        mirror.publish_shared(warn=_say)
        st.mirror_pid, st.mirror_port = mirror.start(Path(st.mirror_root), paths.idir)
    else:
        st.mirror_pid, st.mirror_port = source.mirror_pid, source.mirror_port
        st.extra["mirror_borrowed_from"] = source.name
    write_state(st)
    wait_ssh(st, timeout)
    wait_booted(st, timeout)
    _say(f"mirror {st.mirror_url} (pid {st.mirror_pid})")
    _say(f"instance {st.name!r} up: SSH answered {time.monotonic() - t0:.1f}s after start")


def _forward_ssh(sock: Path) -> tuple[int, int]:
    """SSH on a free 127.0.0.1 port (another one when a process took it meanwhile)."""
    for attempt in range(5):
        port = qemu.free_port()
        try:
            return port, container.add_forward(sock, 22, port)
        except RuntimeError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def wait_booted(st: InstanceState, timeout: float) -> None:
    """Until the container's boot is done (``systemctl is-system-running --wait``): sshd
    answers before units that wait for network-online.target (the SGLang service) have
    started, and a deploy then would race the boot's own start of the old server."""
    state = run_in(st, "systemctl is-system-running --wait", timeout=timeout,
                   check=False).strip()
    if state not in ("running", "degraded"):
        raise RuntimeError(f"the container's boot ended {state or 'without a state'!r}")
    if state == "degraded":
        failed = run_in(st, "systemctl --failed --no-legend --plain", timeout=30,
                        check=False)
        _say(f"boot finished degraded; failed units:\n{failed.strip()}")


def wait_ssh(st: InstanceState, timeout: float, what: str = "boot") -> float:
    """Until a real SSH login works; fail with the console's tail (nspawn's message)."""
    t0 = time.monotonic()
    last_note = 0.0
    while True:
        elapsed = time.monotonic() - t0
        if not pid_alive(st.pid):
            raise RuntimeError(f"the container exited during {what}; its console "
                               f"({st.serial_log}) ends with:\n" + console_tail(st.serial_log))
        if ssh_ok(st.ssh_port, st.ssh_key, st.known_hosts, timeout=5):
            return elapsed
        if elapsed > timeout:
            raise TimeoutError(f"SSH did not answer within {timeout:.0f}s of {what}; the "
                               f"console ({st.serial_log}) ends with:\n"
                               + console_tail(st.serial_log))
        if elapsed - last_note >= 10:
            _say(f"  [{elapsed:4.0f}s] waiting for SSH on 127.0.0.1:{st.ssh_port}")
            last_note = elapsed
        time.sleep(0.2)


def down(name: str, timeout: float = 60.0) -> str:
    """Halt the container, stop its network and (its own) mirror, remove its mounts and
    namespace, drop the state; also after a crash, from whatever the state names."""
    st = read_state(name)
    if st is None:
        return "not running"
    from lab import fleet

    paths = container.Paths(instance_dir(name))
    fleet.unlink_container(st)
    netns = st.extra.get("netns") or container.netns_name(name)
    result = container.stop(st.pid, paths.root, timeout, container.host_cgroups(netns))
    container.stop_slirp(st.extra.get("slirp_pid"))
    borrowed = st.extra.get("mirror_borrowed_from")
    if not borrowed and st.mirror_pid:
        mirror.stop(st.mirror_pid)
    stuck = container.unmount_root(paths)
    # Not waited for: another container host's mount namespace, made while this one ran,
    # can hold the disk's mount until that host stops (each `down` beside a running host
    # waited the full two minutes); the next start of this name waits when it keeps the
    # disk file, and the kernel frees the device once its last mount has gone.
    held = container.detach_loops(paths, wait=DOWN_LOOP_WAIT_S)
    still = [d for d in held if d in container.loops_of(paths.disk_file)]
    container.remove_cgroups(container.host_cgroups(netns))
    container.netns_delete(netns)
    clear_state(name)
    _say(f"{name!r}: {result}; mounts removed"
         + (f" (lazily: {'; '.join(stuck)})" if stuck else "")
         + (f"; loop device {', '.join(still)} still held by another mount namespace "
            "(the kernel frees it when that ends)" if still else "")
         + (f"; mirror (of {borrowed}) left running" if borrowed else "; mirror stopped"))
    return result


def set_box(name: str, box: str) -> list[str]:
    """The recorded box the stand-ins show (and its NVSwitches), at once inside."""
    st = read_state(name)
    if st is None or st.kind != "container":
        raise RuntimeError(f"{name!r} is not a container lab host")
    return container.set_box(Path(st.extra["root"]), box)


def set_driver_version(name: str, version: str) -> None:
    """The stand-in host kernel module's version, seen at once inside the container."""
    st = read_state(name)
    if st is None or st.kind != "container":
        raise RuntimeError(f"{name!r} is not a container lab host")
    container.set_driver_version(Path(st.extra["root"]), version)
    st.extra["driver_version"] = version
    write_state(st)

