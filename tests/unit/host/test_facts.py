"""Facts in pyinfra's own test style: command() strings and process(output lines) -> value.

pyinfra calls ``process`` only when the command exited 0 and printed something, and
returns ``default()`` otherwise; an unparseable output must also give ``default()``
(pyinfra aborts the whole run if ``process`` raises anything but FactProcessError).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.facts.document import HostFactsDocument, document_from_sections
from gpuserve.facts.gpu import CudaToolkit, NvidiaDriver, NvidiaGpus, NvidiaP2P, NvidiaTopology
from gpuserve.facts.host import (
    IOMMU_MARKER,
    AcsBridges,
    BootLoader,
    CpuVendor,
    IommuGroups,
    KernelCmdline,
    NouveauLoaded,
    SecureBoot,
    Virtualization,
)
from gpuserve.host.hostfacts import HostFacts
from gpuserve.parsers.sections import marker, split_sections

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"


def lines(name: str) -> list[str]:
    assert (FIXTURES / f"{name}.source").is_file()
    return (FIXTURES / name).read_text().splitlines()


ALL_FACTS = [
    NvidiaGpus,
    NvidiaTopology,
    NvidiaP2P,
    NvidiaDriver,
    CudaToolkit,
    KernelCmdline,
    Virtualization,
    CpuVendor,
    IommuGroups,
    AcsBridges,
    BootLoader,
    SecureBoot,
    NouveauLoaded,
    HostFactsDocument,
]


@pytest.mark.parametrize("fact", ALL_FACTS, ids=lambda f: f.__name__)
def test_garbage_output_gives_the_absent_value(fact):
    # A line no tool prints: every fact must fall back to its default, never raise.
    assert fact().process(["\x00 definitely not tool output \x00"]) == fact().default()


@pytest.mark.parametrize("fact", ALL_FACTS, ids=lambda f: f.__name__)
def test_fact_names_are_dotted_paths_for_the_cli(fact):
    # `pyinfra inventory.py fact gpuserve.facts.gpu.NvidiaGpus` resolves this name.
    assert fact.name == f"{fact.__module__}.{fact.__name__}"
    assert fact.name.startswith("gpuserve.facts.")


def test_tool_facts_require_their_command():
    assert NvidiaGpus().requires_command() == "nvidia-smi"
    assert NvidiaTopology().requires_command() == "nvidia-smi"
    assert NvidiaP2P().requires_command(mode="w") == "nvidia-smi"
    assert Virtualization().requires_command() == "systemd-detect-virt"
    assert AcsBridges().requires_command() == "lspci"
    assert SecureBoot().requires_command() == "mokutil"


def test_commands_never_fail_the_host():
    # Tools that exit non-zero for ordinary states are wrapped to exit 0.
    assert "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version," in (
        NvidiaGpus().command()
    )
    assert "--format=csv,noheader,nounits" in NvidiaGpus().command()
    for command in (
        NvidiaGpus().command(),
        NvidiaTopology().command(),
        NvidiaP2P().command(mode="r"),
        NvidiaDriver().command(),
        CudaToolkit().command(),
        KernelCmdline().command(),
        Virtualization().command(),
        CpuVendor().command(),
        IommuGroups().command(),
        AcsBridges().command(),
        BootLoader().command(),
        SecureBoot().command(),
        NouveauLoaded().command(),
    ):
        assert command.rstrip().endswith("true"), command


def test_p2p_mode_is_validated():
    assert NvidiaP2P().command(mode="w").endswith("nvidia-smi topo -p2p w 2>/dev/null) "
                                                  '&& [ -n "$_o" ] && printf \'%s\\n\' "$_o"; true')
    with pytest.raises(ValueError, match="mode"):
        NvidiaP2P().command(mode="rw; rm -rf /")


def test_nvidia_gpus_process():
    gpus = NvidiaGpus().process(lines("smi_query_full_composed.txt"))
    assert [g["bus_id"] for g in gpus] == ["00000000:03:00.0", "00000000:04:00.0"]
    assert NvidiaGpus().default() == []


def test_nvidia_topology_and_p2p_process():
    topo = NvidiaTopology().process(lines("topo_m_club3090_46.txt"))
    assert topo["links"][1][2] == "PHB"
    assert topo["numa_affinity"][0] == "1"
    p2p = NvidiaP2P().process(lines("topo_p2p_club3090_1229.txt"))
    assert p2p == {"gpus": ["GPU0", "GPU1"], "cells": [["X", "GNS"], ["GNS", "X"]]}
    assert NvidiaTopology().default() is None and NvidiaP2P().default() is None


def test_nvidia_driver_banner_wins_over_packages():
    output = [
        marker("proc"),
        *lines("proc_driver_nvidia_version_open_composed.txt"),
        marker("dpkg"),
        "ii \tnvidia-kernel-dkms\t550.54.14-1",
    ]
    assert NvidiaDriver().process(output) == {
        "version": "590.48.01",
        "flavour": "open",
        "packages": {"nvidia-kernel-dkms": "550.54.14-1"},
        "loaded": True,
    }


def test_nvidia_driver_from_packages_when_module_not_loaded():
    # The lab VM and a host awaiting its reboot: packages are the only evidence.
    output = [
        marker("dpkg"),
        "ii \tnvidia-open\t580.126.20-1",
        "ii \tnvidia-kernel-open-dkms\t580.126.20-1",
        "ii \tnvidia-driver\t580.126.20-1",
    ]
    value = NvidiaDriver().process(output)
    assert value["flavour"] == "open"
    assert value["version"] == "580.126.20"
    assert value["loaded"] is False
    assert NvidiaDriver().process([marker("dpkg")]) == NvidiaDriver().default()


def test_cuda_toolkit_process():
    assert CudaToolkit().process(lines("cuda_version_json_composed.txt")) == "12.8"
    assert CudaToolkit().process(lines("nvcc_version_13_0_composed.txt")) == "13.0"


def test_host_facts_process():
    assert KernelCmdline().process(["ro quiet iommu=pt"])["args"] == {
        "ro": None, "quiet": None, "iommu": "pt",
    }
    assert Virtualization().process(["none"]) == "none"
    assert CpuVendor().process(["vendor_id\t: AuthenticAMD"]) == "amd"
    assert IommuGroups().process([IOMMU_MARKER]) == []
    assert IommuGroups().process(
        [IOMMU_MARKER, "/sys/kernel/iommu_groups/3/devices/0000:01:00.0"]
    ) == [{"group": 3, "devices": ["0000:01:00.0"]}]
    assert IommuGroups().process(["/sys/kernel/iommu_groups/3/devices/0000:01:00.0"]) is None
    assert [b["bdf"] for b in AcsBridges().process(lines("lspci_vvv_acs_composed.txt"))] == [
        "00:01.0", "00:02.0", "00:03.0",
    ]
    assert BootLoader().process(["grub_cfg: yes", "efi: yes"]) == "grub"
    assert SecureBoot().process(["SecureBoot enabled"]) is True
    assert NouveauLoaded().process(["nouveau 2801664 1 - Live 0x0000000000000000"]) is True
    assert NouveauLoaded().process(["nvidia 104529920 2 - Live 0x0000000000000000"]) is False


def test_document_from_sections():
    text = [
        marker("hostname"), "gpu1",
        marker("virt"), "kvm",
        marker("gpus"), *lines("smi_query_full_composed.txt"),
        marker("topo"), *lines("topo_m_club3090_1229.txt"),
        marker("p2p_r"), *lines("topo_p2p_club3090_1229.txt"),
        marker("p2p_w"), *lines("topo_p2p_club3090_1229.txt"),
        marker("driver"), marker("dpkg"), "ii \tnvidia-kernel-open-dkms\t580.126.20-1",
        marker("cuda"), *lines("nvcc_version_13_0_composed.txt"),
        marker("cmdline"), "BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt",
        marker("iommu"), IOMMU_MARKER, "/sys/kernel/iommu_groups/0/devices/0000:00:00.0",
        marker("boot"), "grub_cfg: yes",
        marker("secure_boot"), "SecureBoot disabled",
        marker("modules"), "nvidia 104529920 2 - Live 0x0000000000000000",
        marker("cpu"), "vendor_id\t: GenuineIntel",
        marker("sglang"), "0.5.23",
    ]
    doc = document_from_sections(split_sections(text))
    assert doc["hostname"] == "gpu1"
    assert doc["virtualization"] == "kvm"
    assert len(doc["gpus"]) == 2
    assert doc["topology"] == {
        "links": [["X", "PHB"], ["PHB", "X"]],
        "p2p_read": [["X", "GNS"], ["GNS", "X"]],
        "p2p_write": [["X", "GNS"], ["GNS", "X"]],
        "p2p": "none",
    }
    assert doc["driver"] == {"version": "580.126.20", "flavour": "open"}
    assert doc["cuda"] == {"toolkit": "13.0"}
    assert doc["kernel"] == {
        "cmdline": "BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt",
        "iommu": "on",
        "iommu_groups": 1,
        "boot_loader": "grub",
        "secure_boot": False,
        "nouveau_loaded": False,
    }
    assert doc["cpu_vendor"] == "intel"
    assert doc["sglang_version"] == "0.5.23"
    # The doctor's reader accepts it and sees the same values.
    facts = HostFacts.from_dict(doc, "gathered")
    assert facts.gpus[0].memory_total_mib == 97887 and facts.topology.p2p == "none"
    assert facts.kernel.iommu_groups == 1 and facts.driver.flavour == "open"


def test_document_logs_a_section_it_cannot_parse(caplog):
    doc = document_from_sections({"gpus": ["\x00 not nvidia-smi output \x00"]})
    assert doc["gpus"] == []
    assert "unrecognised parse_query_gpu output" in caplog.text


def test_document_absent_everything_is_null():
    doc = HostFactsDocument().default()
    assert doc["gpus"] == []
    assert doc["topology"]["p2p"] is None
    assert doc["driver"] == {"version": None, "flavour": None}
    assert doc["kernel"]["iommu"] is None and doc["kernel"]["nouveau_loaded"] is None
    assert doc["sglang_version"] is None


def test_document_sglang_python_is_quoted():
    script = HostFactsDocument().command(sglang_python="/opt/sg lang/bin/python; reboot")
    raw = script.get_raw_value()
    assert "'/opt/sg lang/bin/python; reboot'" in raw
    assert marker("sglang") in raw
    assert marker("sglang") not in HostFactsDocument().command().get_raw_value()


def test_host_facts_document_from_a_real_h200():
    # gpuserve's own gather script run on a real H200 (fixture .source): every section
    # parses, with nvidia-smi 580.159's underlined topo headers and a /proc/modules
    # without unload support; absent tools (lspci, systemd-detect-virt) give null.
    doc = HostFactsDocument().process(lines("hostfacts_h200_single.txt"))
    (gpu,) = doc["gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["compute_cap"]) == (
        "NVIDIA H200", 143771, "9.0")
    assert doc["driver"] == {"version": "580.159.04", "flavour": "open"}
    assert doc["cuda"] == {"toolkit": "13.0"}
    assert doc["topology"]["links"] == [["X"]] and doc["topology"]["p2p_read"] == [["X"]]
    assert doc["kernel"]["nouveau_loaded"] is False and doc["kernel"]["iommu"] == "off"
    assert doc["virtualization"] is None and doc["cpu_vendor"] == "intel"
