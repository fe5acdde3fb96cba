"""A kernel command-line change through update-grub survives a reboot of the VM lab host.

Last in the VM tier (conftest.py): the host deploy (test_host_deploy.py) must start
from the image's cold boot with the IOMMU off, and this reboot would leave it on.
"""

from __future__ import annotations

import secrets

import pytest

from lab.state import pid_alive

pytestmark = [pytest.mark.lab, pytest.mark.vm]


def test_cmdline_change_via_update_grub_survives_a_reboot(lab):
    """What the host deploy does: edit /etc/default/grub, update-grub, reboot.

    Adding intel_iommu=on after the base image's intel_iommu=off turns the IOMMU on
    (the kernel honours the last value), so the groups appear. Afterwards both files are
    put back as they were (/etc/default/grub and the grub.cfg saved before the change):
    the restore is housekeeping, not the subject, and a second update-grub cost ~40 s
    under TCG. (After the host deploy the IOMMU may be on already; the probe parameter
    is what shows the new command line took effect.)
    """
    probe = f"gpuserve_lab_probe={secrets.token_hex(4)}"
    pid = lab.state.pid
    lab.ssh("cp -p /etc/default/grub /root/grub.lab-test && "
            "cp -p /boot/grub/grub.cfg /root/grub.cfg.lab-test && "
            "sed -i 's/^GRUB_CMDLINE_LINUX_DEFAULT=\"\\(.*\\)\"/"
            f"GRUB_CMDLINE_LINUX_DEFAULT=\"\\1 {probe} intel_iommu=on\"/' /etc/default/grub && "
            "update-grub", check=True)
    try:
        seconds = lab.reboot()
        print(f"lab: reboot took {seconds:.0f}s")
        r = lab.ssh("cat /proc/cmdline; ls /sys/kernel/iommu_groups | wc -l", check=True)
        cmdline, groups = r.stdout.splitlines()
        assert probe in cmdline
        assert int(groups) >= 4, "intel_iommu=on after a reboot must give IOMMU groups"
        assert lab.state.pid == pid and pid_alive(pid), "reboot must keep the QEMU process"
    finally:
        lab.ssh("cp -p /root/grub.lab-test /etc/default/grub && "
                "cp -p /root/grub.cfg.lab-test /boot/grub/grub.cfg && sync", check=True)
    restored = lab.ssh("cat /etc/default/grub /boot/grub/grub.cfg", check=True).stdout
    assert probe not in restored


