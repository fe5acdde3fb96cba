"""NVSwitch detection, Fabric Manager packages and the fabric verdict (gpuserve/host/fabric.py,
gpuserve/parsers/nvidia_smi.parse_fabric, gpuserve/data/scripts/fabric_wait.py), on real
recorded outputs (tests/fixtures/gpuhost/*.source name each one's origin)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.host import fabric
from gpuserve.host.passthrough import parse_sysfs_pci
from gpuserve.parsers import nvidia_smi
from gpuserve.paths import SCRIPTS_DIR

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"
BOXES = Path(__file__).resolve().parents[3] / "lab" / "nvidia_repo" / "boxes"


def _text(name: str) -> str:
    return (FIX / name).read_text()


def _links(name: str) -> list[list[str]]:
    return nvidia_smi.parse_topo_matrix(_text(name)).to_json()["links"]


def _wait_script():
    spec = importlib.util.spec_from_file_location("fabric_wait", SCRIPTS_DIR / "fabric_wait.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fabric_block_of_a_gb200_grep_excerpt():
    (block,) = nvidia_smi.parse_fabric(_text("smi_q_fabric_gb200_unhealthy_dra626.txt"))
    assert block == {"bus_id": None, "state": "Completed", "status": "Success",
                     "clique_id": "2", "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
                     "health_summary": "Unhealthy"}


def test_completed_with_insufficient_resources_is_a_failure_not_a_wait():
    blocks = nvidia_smi.parse_fabric(_text("smi_q_fabric_insufficient_azhpc506.txt"))
    assert blocks[0]["status"] == "Insufficient Resources"
    verdict = fabric.judge(blocks)
    assert verdict.state == "failed" and "Insufficient Resources" in verdict.detail


def test_hgx_h100_box_query_per_gpu_and_states():
    text = (BOXES / "hgx-h100" / "query.txt").read_text()
    pending = text.replace("@STATE@", "In Progress").replace("@STATUS@", "N/A")
    blocks = nvidia_smi.parse_fabric(pending)
    assert len(blocks) == 8 and blocks[0]["bus_id"] == "00000000:1B:00.0"
    assert fabric.judge(blocks).state == "pending"
    assert "00000000:DF:00.0: State In Progress" in fabric.judge(blocks).detail
    done = nvidia_smi.parse_fabric(text.replace("@STATE@", "Completed")
                                   .replace("@STATUS@", "Success"))
    assert fabric.judge(done) == fabric.FabricVerdict("ready", "8 GPU(s) registered with "
                                                      "the fabric")
    assert fabric.detect(fabric=done).nvswitch


def test_wait_script_agrees_with_the_parser_on_every_fixture():
    script = _wait_script()
    text = (BOXES / "hgx-h100" / "query.txt").read_text()
    samples = [_text("smi_q_fabric_gb200_unhealthy_dra626.txt"),
               _text("smi_q_fabric_insufficient_azhpc506.txt"),
               text.replace("@STATE@", "In Progress").replace("@STATUS@", "N/A"),
               text.replace("@STATE@", "Completed").replace("@STATUS@", "Success"),
               text.replace("@STATE@", "N/A").replace("@STATUS@", "N/A")]
    for sample in samples:
        ours = fabric.judge(nvidia_smi.parse_fabric(sample))
        assert script.verdict(script.blocks(sample)) == (ours.state, ours.detail)


def test_pcie_fabric_fields_na_are_ready_and_no_evidence():
    text = (BOXES / "hgx-h100" / "query.txt").read_text()
    na = nvidia_smi.parse_fabric(text.replace("@STATE@", "N/A").replace("@STATUS@", "N/A"))
    assert fabric.judge(na).state == "ready"
    assert not fabric.detect(fabric=na).nvswitch


def test_hgx_h100_topology_is_a_switched_fabric():
    evidence = fabric.detect(links=_links("topo_m_h100_hgx_thunderkittens167.txt"))
    assert evidence.nvswitch
    assert evidence.reasons == ("nvidia-smi topo -m: all 8 GPUs joined pairwise by NV18",)


def test_four_gpus_joined_directly_are_not_switched():
    evidence = fabric.detect(links=_links("topo_m_h100_4gpu_nv6_nccl1617.txt"))
    assert not evidence.nvswitch
    assert "without a switch" in evidence.reasons[0]


@pytest.mark.parametrize("fixture", ["topo_m_club3090_1229.txt", "topo_m_rtx6kpro_15.txt",
                                     "topo_m_h200_single_sgr.txt"])
def test_pcie_boxes_get_no_fabric_manager(fixture):
    evidence = fabric.detect(links=_links(fixture))
    assert not evidence.nvswitch
    assert not fabric.needed(fabric.FabricSettings(), evidence)


def test_nvswitch_pci_functions_and_proc_devices_are_evidence():
    # HGX H100 lspci (FM user guide): four "Bridge: NVIDIA Corporation Device 22a3"
    sysfs = "\n".join(
        [f"dev 0000:{b}:00.0 0x10de 0x22a3 0x068000" for b in ("07", "08", "09", "0a")]
        + ["dev 0000:1b:00.0 0x10de 0x2330 0x030200"])
    evidence = fabric.detect(pci=parse_sysfs_pci(sysfs))
    assert evidence.nvswitch and evidence.reasons[0].startswith("4 NVSwitch PCI device(s)")
    gpu_only = parse_sysfs_pci("dev 0000:1b:00.0 0x10de 0x2330 0x030200")
    assert not fabric.detect(pci=gpu_only).nvswitch
    assert fabric.detect(proc_devices=["0000:07:00.0"]).nvswitch


def test_package_names_by_branch_and_generation():
    assert fabric.fabric_plan(580).specs("580.126.20-1") == [
        "nvidia-fabricmanager=580.126.20-1", "libnvidia-nscq=580.126.20-1"]
    assert fabric.fabric_plan(575).specs("575.57.08") == [
        "nvidia-fabricmanager-575=575.57.08-*", "libnvidia-nscq-575=575.57.08-*"]
    b200 = fabric.fabric_plan(580, nvl5=True)
    assert b200.specs("580.95.05-1") == [
        "nvidia-fabricmanager=580.95.05-1", "libnvidia-nscq=580.95.05-1",
        "libnvsdm=580.95.05-1", "nvlsm", "infiniband-diags"]
    assert b200.held == ("nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm")
    assert fabric.nvlink5(["10.0"] * 8) and not fabric.nvlink5(["9.0"]) \
        and not fabric.nvlink5([None])


def test_settings_validated_by_key():
    assert fabric.fabric_settings({}, "inv.py") == fabric.FabricSettings("auto", 180)
    assert fabric.fabric_settings({"fabric_manager": True}, "inv.py").mode == "on"
    with pytest.raises(InputError, match="fabric_manager"):
        fabric.fabric_settings({"fabric_manager": "yes"}, "inv.py")
    with pytest.raises(InputError, match="fabric_wait_timeout"):
        fabric.fabric_settings({"fabric_wait_timeout": 5}, "inv.py")
    forced = fabric.needed(fabric.FabricSettings("on"), fabric.Evidence(False, ()))
    off = fabric.needed(fabric.FabricSettings("off"), fabric.Evidence(True, ("x",)))
    assert forced and not off


def test_one_transaction_moves_driver_and_fabric_manager_and_holds_both():
    fm = fabric.fabric_plan(590)
    cmd = fabric.transaction(["nvidia-driver-cuda=590.48.01-1", *fm.specs("590.48.01-1")],
                             ["nvidia-driver-cuda", *fm.held])
    install, hold = cmd.split(" && ")
    assert "--allow-change-held-packages" in install
    assert install.endswith("nvidia-driver-cuda=590.48.01-1 nvidia-fabricmanager=590.48.01-1 "
                            "libnvidia-nscq=590.48.01-1")
    assert hold == "apt-mark hold nvidia-driver-cuda nvidia-fabricmanager libnvidia-nscq"


def test_kernel_host_transaction_reads_the_metas_candidate_first():
    cmd = fabric.meta_transaction(["nvidia-open-580"], ["nvidia-persistenced"],
                                  fabric.fabric_plan(580))
    assert cmd.startswith("v=$(apt-cache policy nvidia-open-580 | sed -n")
    assert ('nvidia-open-580 nvidia-persistenced nvidia-fabricmanager="$v" '
            'libnvidia-nscq="$v" && apt-mark hold nvidia-open-580 nvidia-fabricmanager '
            'libnvidia-nscq') in cmd


def test_service_steps():
    from gpuserve.host.unit_state import LiveUnit
    from gpuserve.roles.fabric_manager import service_steps

    assert service_steps(LiveUnit(), changed=True) == ["daemon-reload", "start", "enable"]
    running = LiveUnit(active="active", enabled="enabled")
    assert service_steps(running, changed=False) == []
    assert service_steps(running, changed=True) == ["daemon-reload", "restart"]
    assert service_steps(LiveUnit(active="failed", enabled="enabled"), changed=False) == [
        "reset-failed", "start"]


def test_held_packages_count_as_installed():
    # dpkg-query ${Status} of a package after apt-mark hold
    from gpuserve.roles.base.managed import DebInstalled
    from gpuserve.roles.nvidia_driver import DebVersion

    assert DebInstalled().process(["nvidia-fabricmanager hold ok installed"])
    assert DebVersion().process(["hold ok installed|580.126.20-1"]) == "580.126.20-1"
    assert DebVersion().process(["deinstall ok config-files|580.126.20-1"]) is None


def test_fabric_query_form_reads_the_same_states():
    # the stand-in prints the --query-gpu form with the same values as -q's blocks
    lines = ["00000000:1B:00.0, In Progress, N/A", "00000000:43:00.0, Completed, Success"]
    blocks = nvidia_smi.parse_fabric_query(lines)
    assert [(b["bus_id"], b["state"], b["status"]) for b in blocks] == [
        ("00000000:1B:00.0", "In Progress", "N/A"), ("00000000:43:00.0", "Completed", "Success")]
    assert fabric.judge(blocks).state == "pending" and fabric.detect(fabric=blocks).nvswitch
    assert fabric.judge(nvidia_smi.parse_fabric_query(["00000000:1B:00.0, [N/A], [N/A]"])
                        ).state == "ready"
