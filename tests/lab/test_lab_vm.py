"""Self-test of the VM lab host: what only a kernel shows (GRUB, PCIe root ports with
ACS, the vIOMMU, a kernel command line changed by update-grub and a reboot), and the
self-tests of test_lab.py that hold for both kinds, run here on the VM.

The first module of the VM tier (see conftest.py). ``lab down``/``up`` and the status
are the container tier's (test_lab.py); the command line changed through update-grub and
a reboot is test_host_deploy.py's (the host deploy's own reboot, from a cold boot with
the IOMMU off).
"""

from __future__ import annotations

import re

import pytest
from test_lab import (  # noqa: F401  (collected again here, on the VM)
    test_guest_network_and_apt_sources,
    test_guest_reaches_the_mirror_at_10_0_2_2,
    test_lab_keys_are_private,
    test_pyinfra_connects_through_the_lab_inventory,
    test_sshd_offers_only_the_pinned_host_key,
    test_systemd_is_running,
    test_testinfra_host_sees_debian_12,
)

pytestmark = [pytest.mark.lab, pytest.mark.vm]


def test_boots_from_disk_through_grub(lab):
    r = lab.ssh("cat /proc/cmdline; cat /sys/block/vda/vda1/start; "
                "head -c 440 /dev/vda | grep -a -c GRUB", check=True)
    cmdline, start, grub_in_mbr = r.stdout.splitlines()
    # GRUB's `linux` command puts BOOT_IMAGE= first; a direct kernel boot would not.
    assert cmdline.startswith("BOOT_IMAGE=/boot/vmlinuz-")
    assert re.search(r"\broot=UUID=[0-9a-f-]{36}\b", cmdline)
    assert "console=ttyS0" in cmdline
    assert start == "2048"  # MBR partition at 1 MiB
    assert int(grub_in_mbr) >= 1  # GRUB's boot.img in the MBR


def test_pcie_root_ports_with_acs_and_a_dmar_table(lab):
    r = lab.ssh("lspci -vvv; echo ====; ls /sys/firmware/acpi/tables/", check=True)
    lspci, tables = r.stdout.split("====")
    # lspci -vvv prints one block per device, separated by blank lines.
    blocks = [b for b in lspci.strip().split("\n\n") if b.strip()]
    ports = [b for b in blocks if "PCI bridge" in b.splitlines()[0] and "Root Port" in b]
    assert len(ports) >= 4, lspci
    assert all("Access Control Services" in b for b in ports)
    # Disk and NIC sit behind root ports (bus != 00), as GPUs do on a real host.
    behind = [b.splitlines()[0] for b in blocks if not b.startswith("00:")]
    assert any("block device" in b for b in behind)
    assert any("network device" in b or "Ethernet" in b for b in behind)
    assert "DMAR" in tables.split()  # the vIOMMU's ACPI table


def test_iommu_state_follows_the_kernel_command_line(lab):
    r = lab.ssh("cat /proc/cmdline; ls /sys/kernel/iommu_groups | wc -l", check=True)
    cmdline, groups = r.stdout.splitlines()
    # The kernel honours the last intel_iommu= value; the base image says "off".
    values = re.findall(r"\bintel_iommu=(\w+)", cmdline)
    if values and values[-1] == "on":
        assert int(groups) >= 4
    else:
        assert int(groups) == 0, "the base image must boot with the IOMMU off"
