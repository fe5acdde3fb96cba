"""A driver branch change on a host with a kernel of its own (the meta-package and DKMS
path): the host deploy's kernel steps on pyinfra's @fake connector, on an HGX H100's
recorded ``nvidia-smi topo -m`` (NV18 between all eight GPUs, ThunderKittens#167:
tests/fixtures/gpuhost/topo_m_h100_hgx_thunderkittens167.txt.source), with the driver
and Fabric Manager of R580 installed and held, moved to R590.

Before, the branch's metas counted as installed (580's ``nvidia-open-580`` pulls
``nvidia-open``) and the Fabric Manager packages too, so a branch change moved neither
driver nor Fabric Manager. What these prove is the plan and its commands; no apt ran
(docs/nvswitch.md, "How this is proven")."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from pyinfra.api import deploy

from gpuserve.host import driver, fabric
from gpuserve.plans.host import plan_host
from tests.unit.host.test_host_roles import OS_RELEASE_DEBIAN12, plan, runs

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"
HGX_TOPO = (FIX / "topo_m_h100_hgx_thunderkittens167.txt").read_text().splitlines()
R580, R590 = "580.126.20-1", "590.48.01-1"
MODULE_580 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.20  "
              "Release Build  (dvs-builder@U22-I3-AE18-23-3)  Thu Jan 15 2026")
FM_UNIT = ("show --timestamp=us+utc -p ActiveState -p UnitFileState -p NeedDaemonReload "
           "-p ExecMainStartTimestamp nvidia-fabricmanager.service")


def installed(package: str, version: str) -> dict:
    """dpkg-query's answers for a held, installed package (DebVersion, DebInstalled)."""
    return {f"|${{Version}}\\n' {package} 2>": [f"hold ok installed|{version}"],
            f"${{Package}} ${{Status}}\\n' {package} 2>": [f"{package} hold ok installed"]}


def host_state(driver_version: str, fm_version: str | None, nvswitch: bool = True) -> dict:
    state = {**OS_RELEASE_DEBIAN12, "cat /proc/cmdline": ["BOOT_IMAGE=/vmlinuz iommu=pt"],
             "/proc/driver/nvidia/version": [MODULE_580],
             FM_UNIT: ["ActiveState=active", "UnitFileState=enabled", "NeedDaemonReload=no"],
             **installed("nvidia-open", driver_version),
             **installed("nvidia-persistenced", driver_version),
             **installed("nvidia-driver-pinning-" + driver_version[:3], driver_version)}
    if fm_version:
        state.update({**installed("nvidia-fabricmanager", fm_version),
                      **installed("libnvidia-nscq", fm_version)})
    if nvswitch:
        state["nvidia-smi topo -m"] = HGX_TOPO
    return state


def kernel_host(state: dict, branch: int = 590) -> list[tuple[str, list]]:
    """The host deploy's steps for a host with its own kernel (roles/deploys/host.py)."""
    from gpuserve.roles.deploys.host import provision_kernel_host

    settings = plan_host({"nvidia_driver_branch": branch, "gates": "off",
                          "allow_reboot": True,
                          "nvidia_repo_url": "https://mirror.example/cuda/repos/debian12/"
                                             "x86_64/"}, "inventory/gpu.py")

    @deploy("host")
    def host_deploy():
        provision_kernel_host(settings)

    return plan(host_deploy, state)


def op(ops, words: str) -> tuple[str, list[str]]:
    """The one operation named with ``words``: its name and the shell it runs (a script
    run detached with apt's progress, roles/base/progress.py: the script itself)."""
    found = [(n, [detached_script(c[1]) for c in cmds if c[0] == "run"])
             for n, cmds in ops if words in n]
    assert len(found) == 1, [n for n, _ in ops]
    return found[0]


def detached_script(command: str) -> str:
    """``command``'s script when it starts one detached (``... ( sh -c SCRIPT > ...``)."""
    outer = shlex.split(command)
    if outer[:2] != ["sh", "-c"]:
        return command
    inner = shlex.split(outer[2])
    starts = [i for i in range(len(inner) - 2) if inner[i:i + 2] == ["sh", "-c"]]
    return inner[starts[0] + 2] if starts else command


def test_branch_change_is_seen_from_the_installed_meta() -> None:
    change = driver.KernelDriverChange(driver.driver_plan(590, "open"), R580)
    assert (change.from_branch, change.branch_change) == (580, True)
    assert change.leftovers == ("nvidia-driver-pinning-580", "nvidia-open-580")
    back = driver.KernelDriverChange(driver.driver_plan(580, "open"), R590)
    assert back.leftovers == ("nvidia-driver-pinning-590",)  # 580's pin and meta: the plan's
    for same in (driver.KernelDriverChange(driver.driver_plan(590, "open"), R590),
                 driver.KernelDriverChange(driver.driver_plan(590, "open"), None)):
        assert not same.branch_change and same.leftovers == ()
    assert driver.flavour_meta("proprietary") == "cuda-drivers"


def test_r580_to_r590_moves_driver_and_fabric_manager_in_one_held_transaction() -> None:
    ops = kernel_host(host_state(R580, R580))
    names = [n for n, _ in ops]
    pin = names.index(next(n for n in names if "nvidia-driver-pinning-590" in n))
    name, (cmd,) = op(ops, "branch 580 -> 590")
    assert name.endswith("NVIDIA driver open branch 580 -> 590 and Fabric Manager in one "
                         "transaction, held")
    assert pin < names.index(name)  # the new branch's pin first, as NVIDIA's guide says
    remove, candidate, check, install = (cmd.index(w) for w in (
        "apt-get remove -y --allow-change-held-packages nvidia-driver-pinning-580 "
        "nvidia-open-580 || exit 1;", "v=$(apt-cache policy nvidia-open |",
        "590.*) ;; *) echo \"apt's candidate of nvidia-open is $v, not branch 590\"",
        "apt-get install -y"))
    assert remove < candidate < check < install
    one_install = cmd[install:]
    assert one_install.count("apt-get install") == 1
    assert ('--allow-change-held-packages nvidia-open nvidia-persistenced '
            'nvidia-fabricmanager="$v" libnvidia-nscq="$v" && apt-mark hold nvidia-open '
            'nvidia-fabricmanager libnvidia-nscq') in one_install
    # no other operation installs or holds the driver or Fabric Manager
    others = [r for r in map(detached_script, runs(ops)) if r != cmd]
    assert not [r for r in others if "apt-mark" in r or re.search(
        r"install .*(nvidia-fabricmanager|libnvidia-nscq|nvidia-open)", r)]


def test_fabric_manager_restarts_after_the_reboot_then_the_fabric_is_awaited() -> None:
    names = [n for n, _ in kernel_host(host_state(R580, R580))]
    transaction = names.index(next(n for n in names if "branch 580 -> 590" in n))
    reboot = names.index(next(n for n in names if "Reboot if" in n))
    fm = names.index("host | nvidia-fabricmanager.service: daemon-reload, restart")
    wait = names.index(next(n for n in names if "Wait for NVLink fabric" in n))
    assert transaction < reboot < fm < wait


def test_the_new_module_loads_at_a_reboot() -> None:
    """After the move the loaded module (580) is not the installed driver (590)."""
    from gpuserve.roles import kernel

    state = {"cat /proc/cmdline": ["BOOT_IMAGE=/vmlinuz iommu=pt"],
             "/proc/driver/nvidia/version": [MODULE_580], **installed("nvidia-open", R590)}
    ops = plan(kernel.activate_kernel, state, params=["iommu=pt"], allow_reboot=True,
               driver_package="nvidia-open")
    assert any(c == ("function", "wait_and_reconnect") for _, cmds in ops for c in cmds)
    assert driver.module_mismatch("580.126.20", R590) == (
        "the loaded NVIDIA module is 580.126.20, the installed driver 590.48.01 (its module "
        "loads at boot)")
    assert driver.module_mismatch("590.48.01", R590) is None
    assert driver.module_mismatch(None, R590) is None  # no module yet: nothing to compare
    same = plan(kernel.activate_kernel, {**state, **installed("nvidia-open", R580)},
                params=["iommu=pt"], allow_reboot=True, driver_package="nvidia-open")
    assert not any(c == ("function", "wait_and_reconnect") for _, cmds in same for c in cmds)


def test_a_rerun_on_the_moved_host_changes_neither() -> None:
    state = host_state(R590, R590)
    state["/proc/driver/nvidia/version"] = [MODULE_580.replace("580.126.20", "590.48.01")]
    ops = kernel_host(state)
    assert not [r for r in runs(ops) if "fabricmanager" in r or "nvidia-open" in r
                or "reboot" in r]
    assert not any("nvidia-fabricmanager.service" in n for n, _ in ops)


def test_fabric_manager_at_another_version_than_the_driver_is_moved_to_it() -> None:
    """An ``apt upgrade`` that moved one of them (hosts.md §1.3): same branch, so the
    candidate is not checked, but Fabric Manager goes to the driver's version, restarted."""
    ops = kernel_host(host_state(R590, "590.44.01-1"))
    name, (cmd,) = op(ops, "Fabric Manager in one transaction")
    assert name.endswith("NVIDIA driver open 590 and Fabric Manager in one transaction, held")
    assert "apt-get remove" not in cmd and "not branch" not in cmd
    assert 'nvidia-fabricmanager="$v" libnvidia-nscq="$v"' in cmd
    assert any(n.endswith("nvidia-fabricmanager.service: daemon-reload, restart")
               for n, _ in ops)


@pytest.mark.parametrize("branch,old", [(590, R580), (580, R590)])
def test_a_pcie_host_changes_branch_too_without_fabric_manager(branch, old) -> None:
    ops = kernel_host(host_state(old, None, nvswitch=False), branch=branch)
    name, (cmd,) = op(ops, f"-> {branch}")
    assert "Fabric Manager" not in name and "fabricmanager" not in cmd
    assert "apt-mark hold" not in cmd  # nothing of a PCIe host was held before either
    assert f"{branch}.*) ;;" in cmd
    assert not any("nvidia-fabricmanager" in n for n, _ in ops)


def test_the_command_without_a_branch_change_is_as_before() -> None:
    cmd = fabric.meta_transaction(["nvidia-open-580"], ["nvidia-persistenced"],
                                  fabric.fabric_plan(580))
    assert cmd.startswith("v=$(apt-cache policy nvidia-open-580 |")
    assert "remove" not in cmd and "not branch" not in cmd
