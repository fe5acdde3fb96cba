"""`python -m lab deps`: install the host tools the lab needs with apt, when missing.

Checks with dpkg-query first so the common case (everything present) is a fast no-op
that needs neither network nor the apt lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# Debian/Ubuntu package names: QEMU + qemu-img, debootstrap and the Debian keyring it
# verifies with, disk tools (parted, e2fsprogs), GRUB tooling, ssh client, what the
# mirror publishers use (dpkg-dev for dpkg-scanpackages, gnupg for signing), and the
# container hosts' systemd-nspawn, slirp4netns and ip (lab/container.py), and Debian's
# prometheus for its promtool (the unit tests check the monitor's generated config and
# test every alert rule with it: tests/unit/monitor).
PACKAGES = (
    "systemd-container",
    "slirp4netns",
    "iproute2",
    "qemu-system-x86",
    "qemu-utils",
    "debootstrap",
    "debian-archive-keyring",
    "parted",
    "e2fsprogs",
    "grub-pc-bin",
    "grub2-common",
    "openssh-client",
    "dpkg-dev",
    "gnupg",
    "ca-certificates",
    "prometheus",
)


def missing_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n",
                        *packages], capture_output=True, text=True)
    installed = {ln.split()[0] for ln in r.stdout.splitlines()
                 if len(ln.split()) > 1 and ln.split()[1].startswith("ii")}
    return [p for p in packages if p not in installed]


def ensure_deps() -> int:
    if shutil.which("dpkg-query") is None:
        print("lab: deps: not a Debian/Ubuntu machine (no dpkg-query); install QEMU, "
              "debootstrap, parted, e2fsprogs and an ssh client by hand", file=sys.stderr)
        return 1
    missing = missing_packages()
    if not missing:
        print("lab: deps: all present", file=sys.stderr)
        return 0
    if os.geteuid() != 0:
        print(f"lab: deps: missing {' '.join(missing)}; run as root to install them",
              file=sys.stderr)
        return 1
    print(f"lab: deps: installing {' '.join(missing)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                   check=True, env=env)
    return 0
