"""Host-tool parsers: driver banner/packages, CUDA, virt, cmdline, IOMMU, ACS, boot, SB.

Multi-line samples live in tests/fixtures/gpuhost with a .source sidecar; one-line
inputs written inline below are labelled "composed" where they are not quoted output.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuserve.parsers.bootloader import parse_boot_evidence
from gpuserve.parsers.common import ParseError
from gpuserve.parsers.cpuinfo import parse_cpu_vendor
from gpuserve.parsers.cuda import parse_nvcc_version, parse_toolkit, parse_version_json
from gpuserve.parsers.iommu import iommu_state, parse_iommu_groups
from gpuserve.parsers.lspci import parse_lspci_acs
from gpuserve.parsers.mokutil import parse_sb_state
from gpuserve.parsers.nvidia_driver import (
    driver_version_from_packages,
    flavour_from_packages,
    parse_dpkg_installed,
    parse_proc_version,
)
from gpuserve.parsers.proc_cmdline import parse_cmdline
from gpuserve.parsers.proc_modules import parse_proc_modules
from gpuserve.parsers.systemd_detect_virt import parse_detect_virt

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"


def fixture(name: str) -> str:
    assert (FIXTURES / f"{name}.source").read_text().strip(), f"{name} has no source"
    return (FIXTURES / name).read_text()


def test_every_fixture_names_its_source():
    samples = [p for p in FIXTURES.iterdir() if p.suffix == ".txt"]
    assert samples
    for sample in samples:
        sidecar = sample.with_name(sample.name + ".source")
        assert sidecar.is_file(), f"{sample.name} lacks {sidecar.name}"
        text = sidecar.read_text()
        if text.startswith("COMPOSED"):
            continue  # a labelled composed case; its sidecar says what format it follows
        if text.startswith("REAL capture, verbatim, "):
            # captured here on a lent GPU machine: dated, and naming how
            assert re.match(r"REAL capture, verbatim, \d{4}-\d{2}-\d{2}: ", text), sidecar.name
            assert "collect-gpu-facts.sh" in text, sidecar.name
            continue
        assert any(ref in text for ref in ("http", "gpuhost.md", "lab-notes.md")), sidecar.name
        assert "erbatim" in text or "Real line" in text, sidecar.name


# ------------------------------------------------------------------ driver


def test_proc_version_open():
    banner = parse_proc_version(fixture("proc_driver_nvidia_version_open_composed.txt"))
    assert banner == {"version": "590.48.01", "flavour": "open"}


def test_proc_version_open_real_h200():
    # real capture: the open module built by nixbld (the "(nixbld@)" builder field)
    banner = parse_proc_version(fixture("proc_driver_nvidia_version_open_h200.txt"))
    assert banner == {"version": "580.159.04", "flavour": "open"}
    assert parse_nvcc_version(fixture("nvcc_version_13_0_h200.txt")) == "13.0"


def test_proc_version_proprietary():
    banner = parse_proc_version(fixture("proc_driver_nvidia_version_proprietary_composed.txt"))
    assert banner == {"version": "550.54.14", "flavour": "proprietary"}


def test_proc_version_quoted_prefix_only():
    # The truncated form quoted in the notes (gpuhost.md §1) is enough.
    line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build"
    assert parse_proc_version(line)["flavour"] == "open"


@pytest.mark.parametrize(
    "text", ["", "GCC version:  gcc version 12.2.0", "NVRM version: something else 1.2"]
)
def test_proc_version_garbage(text):
    with pytest.raises(ParseError):
        parse_proc_version(text)


@pytest.mark.parametrize(
    ("packages", "flavour"),
    [
        # NVIDIA CUDA repo, Debian 12 (driver-installation-guide package names)
        ({"nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver"}, "open"),
        ({"cuda-drivers", "nvidia-kernel-dkms", "nvidia-driver"}, "proprietary"),
        # Ubuntu archive names
        ({"nvidia-driver-580-open", "nvidia-dkms-580-open"}, "open"),
        ({"nvidia-driver-550", "nvidia-dkms-550"}, "proprietary"),
        ({"linux-modules-nvidia-580-server-open-6.8.0-60-generic"}, "open"),
        ({"linux-modules-nvidia-550-6.8.0-60-generic"}, "proprietary"),
        # meta-packages only (kernel-module package not yet pulled in)
        ({"nvidia-open-580"}, "open"),
        ({"cuda-drivers-575"}, "proprietary"),
        # nothing, unversioned metas only, or both module flavours
        (set(), None),
        ({"cuda-drivers", "nvidia-driver"}, None),
        ({"nvidia-kernel-open-dkms", "nvidia-kernel-dkms"}, None),
        ({"libnvidia-compute", "nvidia-smi"}, None),
    ],
)
def test_flavour_from_packages(packages, flavour):
    assert flavour_from_packages(packages) == flavour


def test_dpkg_installed_drops_removed_packages():
    # Composed: dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Version}\n'
    text = (
        "ii \tnvidia-kernel-open-dkms\t580.126.20-1\n"
        "rc \tnvidia-kernel-dkms\t550.54.14-1\n"
        "hi \tnvidia-open\t580.126.20-1\n"
    )
    installed = parse_dpkg_installed(text)
    assert installed == {"nvidia-kernel-open-dkms": "580.126.20-1", "nvidia-open": "580.126.20-1"}
    assert flavour_from_packages(installed) == "open"
    assert driver_version_from_packages(installed) == "580.126.20"
    assert driver_version_from_packages({"nvidia-dkms-580-open": "1:580.95.05-0ubuntu1"}) == (
        "580.95.05"
    )
    assert driver_version_from_packages({"nvidia-open": "580.126.20-1"}) is None


def test_dpkg_garbage_names_the_line():
    with pytest.raises(ParseError) as err:
        parse_dpkg_installed("ii \tnvidia-open\t1\nnot dpkg output\n")
    assert err.value.line_no == 2


# ------------------------------------------------------------------ CUDA


def test_nvcc_lane():
    assert parse_nvcc_version(fixture("nvcc_version_13_0_composed.txt")) == "13.0"
    assert parse_toolkit(fixture("nvcc_version_13_0_composed.txt")) == "13.0"


def test_version_json_lane():
    assert parse_version_json(fixture("cuda_version_json_composed.txt")) == "12.8"
    assert parse_toolkit(fixture("cuda_version_json_composed.txt")) == "12.8"


def test_version_txt_lane():
    assert parse_toolkit("CUDA Version 11.0.228\n") == "11.0"  # composed, pre-11.1 layout


@pytest.mark.parametrize("text", ["", "{}", '{"cuda": {"version": 13}}', "nvcc: command not found"])
def test_cuda_garbage(text):
    with pytest.raises(ParseError):
        parse_toolkit(text)


# ------------------------------------------------------------------ small files


def test_detect_virt():
    assert parse_detect_virt("kvm\n") == "kvm"
    assert parse_detect_virt("none\n") == "none"
    with pytest.raises(ParseError):
        parse_detect_virt("Command 'systemd-detect-virt' not found\n")
    with pytest.raises(ParseError):
        parse_detect_virt("kvm\nkvm\n")


def test_cmdline():
    # Composed: a Proxmox-style host command line (qm-pci-passthrough.adoc parameters).
    line = 'BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve root=/dev/mapper/pve-root ro quiet ' \
        'intel_iommu=on iommu=pt pcie_acs_override=downstream,multifunction dyndbg="file x +p"'
    parsed = parse_cmdline(line + "\n")
    assert parsed["raw"] == line
    assert parsed["args"]["intel_iommu"] == "on"
    assert parsed["args"]["iommu"] == "pt"
    assert parsed["args"]["quiet"] is None
    assert parsed["args"]["pcie_acs_override"] == "downstream,multifunction"
    assert parsed["args"]["dyndbg"] == "file x +p"
    with pytest.raises(ParseError):
        parse_cmdline("a\nb\n")
    with pytest.raises(ParseError):
        parse_cmdline('x="unbalanced\n')


def test_iommu_groups_and_state():
    # Composed: `find /sys/kernel/iommu_groups -type l` lines (kernel vfio.rst layout).
    text = (
        "/sys/kernel/iommu_groups/7/devices/0000:00:1f.0\n"
        "/sys/kernel/iommu_groups/7/devices/0000:00:1f.3\n"
        "/sys/kernel/iommu_groups/10/devices/0000:01:00.0\n"
        "/sys/kernel/iommu_groups/2/devices/0000:00:02.0\n"
    )
    groups = parse_iommu_groups(text)
    assert [g["group"] for g in groups] == [2, 7, 10]
    assert groups[1]["devices"] == ["0000:00:1f.0", "0000:00:1f.3"]
    assert iommu_state(groups) == "on"
    assert iommu_state([]) == "off"
    assert iommu_state(None) is None
    assert iommu_state(None, {"intel_iommu": "off"}) == "off"
    # A cmdline asking for the IOMMU does not make it on: only groups prove it.
    assert iommu_state([], {"intel_iommu": "on"}) == "off"
    with pytest.raises(ParseError) as err:
        parse_iommu_groups(text + "/sys/kernel/iommu_groups/x\n")
    assert err.value.line_no == 5


def test_lspci_acs():
    bridges = parse_lspci_acs(fixture("lspci_vvv_acs_composed.txt"))
    by_bdf = {b["bdf"]: b for b in bridges}
    assert sorted(by_bdf) == ["00:01.0", "00:02.0", "00:03.0"]  # no host bridge, no GPU
    root = by_bdf["00:01.0"]
    assert root["acs"] is True and root["redirect"] is True
    assert root["acs_ctl"]["ReqRedir"] is True and root["acs_ctl"]["TransBlk"] is False
    assert root["acs_cap"]["SrcValid"] is True
    plx = by_bdf["00:02.0"]
    assert plx["acs"] is True and plx["redirect"] is False
    assert plx["acs_cap"]["DirectTrans"] is True
    denied = by_bdf["00:03.0"]
    assert denied["acs"] is None and denied["redirect"] is None
    everything = parse_lspci_acs(fixture("lspci_vvv_acs_composed.txt"), bridges_only=False)
    assert len(everything) == 5
    assert everything[-1]["acs"] is False  # the GPU has no ACS capability


def test_lspci_real_lab_capture_iommu_on():
    bridges = parse_lspci_acs(fixture("lspci_vvv_lab_iommu_on.txt"))
    assert [b["bdf"] for b in bridges] == ["00:01.0", "00:02.0", "00:03.0", "00:04.0"]
    assert all(b["acs"] and b["redirect"] for b in bridges)
    assert bridges[0]["acs_ctl"] == {
        "SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True,
        "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False,
    }
    assert bridges[0]["acs_cap"]["DirectTrans"] is True
    everything = parse_lspci_acs(fixture("lspci_vvv_lab_iommu_on.txt"), bridges_only=False)
    assert "00:1f.0" in [d["bdf"] for d in everything]  # the ISA bridge is not a PCI bridge


def test_lspci_real_lab_capture_iommu_off():
    bridges = parse_lspci_acs(fixture("lspci_vvv_lab_iommu_off.txt"))
    assert len(bridges) == 4
    assert all(b["acs"] is True and b["redirect"] is False for b in bridges)


def test_iommu_groups_real_lab_capture():
    groups = parse_iommu_groups(fixture("iommu_groups_lab.txt"))
    assert len(groups) == 9
    assert [g["group"] for g in groups] == list(range(9))
    assert groups[5]["devices"] == ["0000:00:1f.0", "0000:00:1f.2", "0000:00:1f.3"]
    assert iommu_state(groups, {"ro": None}) == "on"  # on without any cmdline parameter


def test_lspci_garbage_names_the_line():
    with pytest.raises(ParseError) as err:
        parse_lspci_acs("00:01.0 PCI bridge: x\n\tCapabilities: [148 v1] Access Control "
                        "Services\n\t\tACSCtl:\tSrcValid? TransBlk-\n")
    assert err.value.line_no == 3
    with pytest.raises(ParseError) as err:
        parse_lspci_acs("pcilib: Cannot open /proc/bus/pci\n")
    assert err.value.line_no == 1


def test_boot_evidence():
    # Composed: proxmox-boot-tool status lines as printed by its status() function
    # (proxmox-kernel-helper), prefixed "pbt: " by the fact.
    pbt = "pbt: System currently booted with uefi\n"
    assert parse_boot_evidence(
        pbt + "pbt: 31B7-B5A5 is configured with: uefi (versions: 6.8.12-9-pve)\n"
        "grub_cfg: yes\nefi: yes\n"
    ) == "systemd-boot"
    assert parse_boot_evidence(
        pbt + "pbt: 31B7-B5A5 is configured with: grub (versions: 6.8.12-9-pve)\nefi: yes\n"
    ) == "grub"
    assert parse_boot_evidence("loaderinfo: yes\nefi: yes\n") == "systemd-boot"
    assert parse_boot_evidence("grub_cfg: yes\n") == "grub"
    assert parse_boot_evidence("efi: yes\n") is None
    assert parse_boot_evidence("") is None
    with pytest.raises(ParseError):
        parse_boot_evidence("bootctl: yes\n")


def test_secure_boot():
    assert parse_sb_state("SecureBoot enabled\n") is True
    assert parse_sb_state("SecureBoot disabled\nPlatform is in Setup Mode\n") is False
    assert parse_sb_state("EFI variables are not supported on this system\n") is False
    with pytest.raises(ParseError):
        parse_sb_state("sh: 1: mokutil: not found\n")


def test_proc_modules():
    # Composed: /proc/modules lines in the kernel's "name size refs deps state addr" layout.
    text = (
        "nvidia_drm 126976 0 - Live 0x0000000000000000 (POE)\n"
        "nvidia 104529920 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n"
        "nouveau 2801664 1 - Live 0x0000000000000000\n"
    )
    modules = parse_proc_modules(text)
    assert "nouveau" in modules
    assert modules["nvidia"]["used_by"] == ["nvidia_uvm", "nvidia_modeset"]
    assert modules["nvidia"]["refcount"] == 2
    # real capture (H200 microVM, 2026-12-04): a kernel without CONFIG_MODULE_UNLOAD
    # prints "- -" for refcount and users
    real = parse_proc_modules("nvidia_uvm 1875968 - - Live 0xffffffffc080c000 (O)\n"
                              "nvidia 14299136 - - Live 0xffffffffc0400000 (O)\n")
    assert real["nvidia"] == {"size": 14299136, "refcount": None, "used_by": [],
                              "state": "Live"}
    with pytest.raises(ParseError) as err:
        parse_proc_modules(text + "garbage\n")
    assert err.value.line_no == 4


def test_cpu_vendor():
    assert parse_cpu_vendor("vendor_id\t: GenuineIntel\n") == "intel"
    assert parse_cpu_vendor("vendor_id\t: AuthenticAMD\n") == "amd"
    assert parse_cpu_vendor("vendor_id\t: CentaurHauls\n") == "CentaurHauls"
    assert parse_cpu_vendor("processor\t: 0\nCPU implementer\t: 0x41\n") is None
    with pytest.raises(ParseError):
        parse_cpu_vendor("vendor_id\t:\n")
