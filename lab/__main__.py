"""`python -m lab deps|image|up|down|status|ssh`: the local stand-in GPU hosts.

A lab host is a systemd-nspawn container (`--kind container`, the default: everything
above the kernel, at native speed) or the QEMU VM (`--kind vm`: GRUB, the initramfs,
modules, IOMMU). State lives under $GPUSERVE_LAB_HOME (default ~/.cache/gpuserve/lab);
the instance is --name or $GPUSERVE_LAB_NAME (default "default"); the kind of a new one
is --kind or $GPUSERVE_LAB_KIND, its operating system --os or $GPUSERVE_LAB_OS (debian12,
the default, or debian13: container hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lab import fleet, instance
from lab.deps import ensure_deps
from lab.image import ensure_image
from lab.models import install_models
from lab.recipe import DEFAULT_OS, OS_RECIPES
from lab.sshutil import instance_ssh
from lab.state import instance_name, list_instances, read_state


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("deps", help="apt-get install the host tools that are missing")
    image = sub.add_parser("image", help="build the disk images (or find them cached); boots "
                                         "nothing, so `make test` runs it beside the unit "
                                         "tier")
    image.add_argument("--os", choices=tuple(OS_RECIPES), action="append",
                       help="only this lab OS's image (repeatable; default: every OS)")
    up = sub.add_parser("up", help="build/reuse the image, start the mirror and the host, "
                                   "wait for SSH")
    up.add_argument("--name")
    up.add_argument("--kind", choices=instance.KINDS,
                    default=os.environ.get("GPUSERVE_LAB_KIND") or "container",
                    help="container (systemd-nspawn; default) or vm (QEMU, for the kernel)")
    up.add_argument("--os", choices=tuple(OS_RECIPES),
                    default=os.environ.get("GPUSERVE_LAB_OS") or DEFAULT_OS,
                    help="the host's operating system (default debian12; debian13: "
                         "container hosts only)")
    up.add_argument("--driver-version", metavar="X.Y.Z",
                    help="container: the stand-in host kernel module's version "
                         "(/proc/driver/nvidia/version inside; default "
                         "580.126.20)")
    up.add_argument("--box", metavar="BOX",
                    help="container: the recorded GPU box the stand-ins show (default "
                         "rtxpro6000-kvm; boxes in lab/nvidia_repo/boxes, e.g. hgx-h100)")
    up.add_argument("--fresh", action="store_true", help="reset the instance's disk")
    up.add_argument("--memory", type=int, default=2048, metavar="MIB")
    up.add_argument("--timeout", type=float, default=None,
                    help="seconds to wait for SSH (default: container 120, vm 420)")
    up.add_argument("--clone-from", metavar="NAME",
                    help="boot from a copy of running instance NAME's disk (lab/fleet.py)")
    box = sub.add_parser("box", help="container: switch the recorded GPU box of a running "
                                     "host (/etc/gpuserve-lab/box and its NVSwitches)")
    box.add_argument("--name")
    box.add_argument("box")
    link = sub.add_parser("link", help="a private network (10.77.0.0/24) between running "
                                       "instances: link A B (containers: A B C ...)")
    link.add_argument("names", nargs="+")
    unlink = sub.add_parser("unlink", help="unplug an instance's private-network NIC")
    unlink.add_argument("--name")
    fwd = sub.add_parser("forward", help="forward a 127.0.0.1 port to a guest port; prints it")
    fwd.add_argument("--name")
    fwd.add_argument("guest_port", type=int)
    mon = sub.add_parser("monitor", help="the monitor deploy on the host, its Prometheus "
                                         "forwarded, then gpuserve fleet status with the "
                                         "live figures")
    mon.add_argument("--name")
    down = sub.add_parser("down", help="power the host off, stop the mirror, remove its "
                                       "mounts")
    down.add_argument("--name")
    down.add_argument("--all", action="store_true", help="every instance")
    down.add_argument("--timeout", type=float, default=90)
    st = sub.add_parser("status", help="is it running, does SSH answer, which ports")
    st.add_argument("--name")
    st.add_argument("--all", action="store_true")
    st.add_argument("--json", action="store_true")
    ssh = sub.add_parser("ssh", help="ssh into the host: ssh [--name N] [-- cmd ...]")
    ssh.add_argument("--name")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _print_status(info: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return
    print(f"{info['name']}: {info['state']}")
    if "ssh_port" in info:
        what = "supervisor" if info.get("kind") == "container" else "qemu"
        print(f"  {info.get('kind', 'vm')}: {what} pid {info['pid']} "
              f"alive={info['process_alive']}  "
              f"ssh 127.0.0.1:{info['ssh_port']} answers={info['ssh_answers']}")
        print(f"  mirror pid {info['mirror_pid']} alive={info['mirror_alive']}  "
              f"127.0.0.1:{info['mirror_port']} (guest: {info['mirror_url']})")
        print(f"  serial log {info['serial_log']}")


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "deps":
            return ensure_deps()
        if a.cmd == "image":
            for os_name in a.os or OS_RECIPES:
                print(f"lab: image {ensure_image(os_name=os_name)}")
            return 0
        if a.cmd == "up":
            st = instance.up(instance_name(a.name), fresh=a.fresh, memory_mib=a.memory,
                             timeout=a.timeout, clone_from=a.clone_from, kind=a.kind,
                             driver_version=a.driver_version, os_name=a.os, box=a.box)
            print(f"lab {st.name}: ssh 127.0.0.1:{st.ssh_port}, mirror {st.mirror_url}")
            if a.clone_from is None:  # a clone has its source's models already
                print(f"lab {st.name}: {install_models(st)}")
            return 0
        if a.cmd == "box":
            from lab.container_instance import set_box

            switches = set_box(instance_name(a.name), a.box)
            print(f"lab {instance_name(a.name)}: box {a.box}"
                  + (f", NVSwitches {', '.join(switches)}" if switches else ""))
            return 0
        if a.cmd == "link":
            for name, address in fleet.link([instance_name(n) for n in a.names]).items():
                print(f"lab {name}: {address}")
            return 0
        if a.cmd == "unlink":
            fleet.unlink(instance_name(a.name))
            return 0
        if a.cmd == "forward":
            print(fleet.forward(instance_name(a.name), a.guest_port))
            return 0
        if a.cmd == "monitor":
            from lab.monitor import monitor

            return monitor(instance_name(a.name))
        if a.cmd == "down":
            if a.all:
                instance.down_all(a.timeout)
            else:
                instance.down(instance_name(a.name), a.timeout)
            return 0
        if a.cmd == "status":
            names = list_instances() if a.all else [instance_name(a.name)]
            infos = [instance.status(n) for n in names]
            for info in infos:
                _print_status(info, a.json)
            return 0 if all(i["state"] == "running" for i in infos) and infos else 1
        if a.cmd == "ssh":
            name = instance_name(a.name)
            st = read_state(name)
            if st is None:
                print(f"lab: instance {name!r} is not running; run `python -m lab up`",
                      file=sys.stderr)
                return 1
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            argv_ = instance_ssh(st)
            os.execvp(argv_[0], [*argv_, *cmd])
    except (RuntimeError, TimeoutError, ValueError, OSError) as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
