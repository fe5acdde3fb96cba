"""Facts through pyinfra's real fact pipeline on the @local connector.

PATH is reduced to a sandbox of basic utilities plus fake ``nvidia-smi`` / ``mokutil`` /
``systemd-detect-virt`` / ``lspci`` scripts that print the verbatim samples (or fail the
way the real tools do), so the shell wrappers, ``requires_command`` and pyinfra's
exit-status handling are exercised for real: a missing tool or a failing tool must give
the absent value and leave the host un-failed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.state import StateStage

from gpuserve.facts.document import HostFactsDocument, host_facts_document
from gpuserve.facts.gpu import NvidiaGpus, NvidiaP2P, NvidiaTopology
from gpuserve.facts.host import AcsBridges, InstallTarget, SecureBoot, Virtualization

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"
BASICS = ("sh", "cat", "grep", "awk", "sed", "find", "uname", "ls", "env", "sort")

# nvidia-smi stand-in: answers the exact commands the facts run, fails like the real
# tool on anything else.
FAKE_NVIDIA_SMI = f"""#!/bin/sh
case "$*" in
  "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version,\
compute_cap,persistence_mode --format=csv,noheader,nounits")
    cat {FIXTURES}/smi_query_full_composed.txt ;;
  "topo -m") cat {FIXTURES}/topo_m_club3090_1229.txt ;;
  "topo -p2p r") cat {FIXTURES}/topo_p2p_club3090_1229.txt ;;
  "topo -p2p w") cat {FIXTURES}/topo_p2p_club3090_1229.txt ;;
  *) echo "Invalid combination of input arguments."; exit 2 ;;
esac
"""
# What nvidia-smi prints (on stdout) and returns when no driver is loaded.
BROKEN_NVIDIA_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. \
Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A PATH holding only basic utilities; returns a function that adds a fake tool."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in BASICS:
        real = shutil.which(name)
        assert real, f"{name} is needed to run facts locally"
        (bin_dir / name).symlink_to(real)
    monkeypatch.setenv("PATH", str(bin_dir))

    def add_tool(name: str, script: str) -> None:
        path = bin_dir / name
        path.write_text(script)
        path.chmod(0o755)

    return add_tool


@pytest.fixture
def local_host():
    inventory = Inventory((["@local"], {}))
    state = State(inventory=inventory, config=Config())
    connect_all(state)
    host = inventory.get_host("@local")
    yield state, host
    assert host not in state.failed_hosts, "a fact failed the host"


def test_nvidia_gpus_from_fake_tool(sandbox, local_host):
    sandbox("nvidia-smi", FAKE_NVIDIA_SMI)
    _, host = local_host
    gpus = host.get_fact(NvidiaGpus)
    assert [g["uuid"] for g in gpus] == ["GPU-75bd273e-6b20-0d22-1b0b-5fbb6fb0025b", None]


def test_topology_and_p2p_from_fake_tool(sandbox, local_host):
    sandbox("nvidia-smi", FAKE_NVIDIA_SMI)
    _, host = local_host
    assert host.get_fact(NvidiaTopology)["links"] == [["X", "PHB"], ["PHB", "X"]]
    assert host.get_fact(NvidiaP2P, mode="w")["cells"] == [["X", "GNS"], ["GNS", "X"]]
    assert host.get_fact(NvidiaP2P, mode="r")["gpus"] == ["GPU0", "GPU1"]


@pytest.mark.parametrize("stage", [StateStage.Prepare, StateStage.Execute])
def test_missing_nvidia_smi_is_absent(sandbox, local_host, stage):
    state, host = local_host
    state.current_stage = stage
    assert host.get_fact(NvidiaGpus) == []
    assert host.get_fact(NvidiaTopology) is None
    assert host.get_fact(NvidiaP2P, mode="r") is None


def test_nvidia_smi_without_driver_is_absent(sandbox, local_host):
    sandbox("nvidia-smi", BROKEN_NVIDIA_SMI)
    _, host = local_host
    assert host.get_fact(NvidiaGpus) == []
    assert host.get_fact(NvidiaTopology) is None


def test_secure_boot_and_virt_tools_that_exit_nonzero(sandbox, local_host):
    sandbox("mokutil", "#!/bin/sh\necho 'EFI variables are not supported on this system' >&2\n"
                       "exit 1\n")
    sandbox("systemd-detect-virt", "#!/bin/sh\necho none\nexit 1\n")
    _, host = local_host
    assert host.get_fact(SecureBoot) is False
    assert host.get_fact(Virtualization) == "none"


def test_missing_mokutil_lspci_virt_are_absent(sandbox, local_host):
    _, host = local_host
    assert host.get_fact(SecureBoot) is None
    assert host.get_fact(AcsBridges) is None
    assert host.get_fact(Virtualization) is None


def test_acs_bridges_from_fake_lspci(sandbox, local_host):
    sandbox("lspci", f"#!/bin/sh\n[ \"$*\" = -vvv ] || exit 1\n"
                     f"cat {FIXTURES}/lspci_vvv_acs_composed.txt\n")
    _, host = local_host
    redirects = {b["bdf"]: b["redirect"] for b in host.get_fact(AcsBridges)}
    assert redirects == {"00:01.0": True, "00:02.0": False, "00:03.0": None}


def test_document_in_one_round_trip(sandbox, local_host, tmp_path):
    sandbox("nvidia-smi", FAKE_NVIDIA_SMI)
    sandbox("mokutil", "#!/bin/sh\necho 'SecureBoot enabled'\n")
    sandbox("systemd-detect-virt", "#!/bin/sh\necho kvm\n")
    python = tmp_path / "venv python"
    python.write_text("#!/bin/sh\necho 0.5.23\n")  # stands in for the SGLang venv python
    python.chmod(0o755)
    _, host = local_host
    doc = host_facts_document(host, sglang_python=str(python))
    assert doc["hostname"] == os.uname().nodename
    assert doc["virtualization"] == "kvm"
    assert len(doc["gpus"]) == 2
    assert doc["topology"]["links"] == [["X", "PHB"], ["PHB", "X"]]
    assert doc["topology"]["p2p_read"] == [["X", "GNS"], ["GNS", "X"]]
    assert doc["topology"]["p2p"] == "none"
    assert doc["kernel"]["secure_boot"] is True
    assert doc["sglang_version"] == "0.5.23"
    assert doc["kernel"]["iommu"] in ("on", "off")  # this machine's real sysfs


def test_document_with_no_tools_at_all(sandbox, local_host):
    _, host = local_host
    doc = host.get_fact(HostFactsDocument)
    assert doc["gpus"] == []
    assert doc["virtualization"] is None
    assert doc["topology"] == {"links": None, "p2p_read": None, "p2p_write": None, "p2p": None}
    assert doc["kernel"]["secure_boot"] is None
    assert doc["sglang_version"] is None


def test_install_target_reads_python_glibc_and_free_space(sandbox, local_host, tmp_path):
    """The preflight's facts: python3, glibc and the free bytes of the nearest existing
    parent of a directory that does not exist yet (the first deploy on a host)."""
    import platform
    import sys

    for name in ("python3", "getconf", "df"):
        real = shutil.which(name, path=os.defpath + ":/usr/local/bin") or sys.executable
        sandbox(name, f'#!/bin/sh\nexec {real} "$@"\n')
    _, host = local_host
    got = host.get_fact(InstallTarget, path=str(tmp_path / "not" / "yet" / "there"))
    assert got["python"] and got["python"].count(".") == 2
    assert got["glibc"] == platform.libc_ver()[1]
    assert isinstance(got["free_bytes"], int) and got["free_bytes"] > 0


def test_install_target_without_python3_is_unknown_not_a_failure(sandbox, local_host):
    _, host = local_host
    got = host.get_fact(InstallTarget, path="/opt/gpuserve")
    assert got["python"] is None and got["glibc"] is None and got["free_bytes"] is None


@pytest.mark.parametrize(("says", "want"), [("Python 3.12.0rc1", "3.12.0"),
                                            ("Python 3.11.2", "3.11.2"),
                                            ("Python 3.13.1+", "3.13.1"),
                                            ("Python 3.12", None),
                                            ("python3: not found", None)])
def test_install_target_python_version_forms(sandbox, local_host, says, want):
    """The version is cut out with parameter expansion (no sed process), as the old
    ``s/^Python \\([0-9]*\\.[0-9]*\\.[0-9]*\\).*/\\1/p`` did."""
    sandbox("python3", f"#!/bin/sh\necho '{says}'\n")
    _, host = local_host
    assert host.get_fact(InstallTarget, path="/opt/gpuserve")["python"] == want
