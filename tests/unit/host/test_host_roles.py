"""Host-provisioning roles against pyinfra's @fake connector: which operations and
commands each role plans for a given host state (facts answered by fake_responses)."""

from __future__ import annotations

import re

import pytest
from pyinfra.facts.server import LinuxDistribution

from gpuserve.host.driver import HostRefusal
from tests.unit.conftest import prepare_fake

HOST = "@fake/gpu1"


def plan(deploy, responses: dict, *args, **kwargs) -> list[tuple[str, list]]:
    """Prepare ``deploy`` on a fake host; return [(op name, [command summaries])]."""
    return prepare_fake(deploy, responses, None, *args, host=HOST, **kwargs)


def runs(ops) -> list[str]:
    return [c[1] for _, cmds in ops for c in cmds if c[0] == "run"]


def uploads(ops) -> dict[str, str]:
    return {c[1]: c[2] for _, cmds in ops for c in cmds if c[0] == "upload"}


PBT_UEFI = "pbt: 2F6A-1B2C is configured with: uefi (versions: 6.8.12-4-pve)"


def test_systemd_boot_host_gets_kernel_cmdline_and_proxmox_boot_tool():
    from gpuserve.roles import kernel

    ops = plan(kernel.configure_kernel, {
        "proxmox-boot-tool status": [PBT_UEFI],
        "cat /etc/kernel/cmdline": ["root=ZFS=rpool/ROOT/pve-1 boot=zfs"],
    }, params=["intel_iommu=on", "iommu=pt"])
    files = uploads(ops)
    assert files == {"/etc/kernel/cmdline":
                     "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt\n"}
    assert "proxmox-boot-tool refresh" in runs(ops)
    assert not any("update-grub" in r for r in runs(ops))


def test_grub_host_edits_default_grub_and_runs_update_grub():
    from gpuserve.roles import kernel

    grub = ['GRUB_DEFAULT=0', 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"', 'GRUB_CMDLINE_LINUX=""']
    ops = plan(kernel.configure_kernel, {
        "/boot/grub/grub.cfg": ["grub_cfg: yes"],
        "cat /etc/default/grub": grub,
    }, params=["iommu=pt"])
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"' in uploads(ops)["/etc/default/grub"]
    assert runs(ops)[-1] == "update-grub"
    assert not any("proxmox-boot-tool" in r for r in runs(ops))
    # already configured: nothing to do
    grub[1] = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"'
    again = plan(kernel.configure_kernel, {"/boot/grub/grub.cfg": ["grub_cfg: yes"],
                                           "cat /etc/default/grub": grub}, params=["iommu=pt"])
    assert uploads(again) == {} and runs(again) == []


@pytest.mark.parametrize(("running", "allow", "expect_reboot"), [
    ("BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet", True, True),
    ("BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet", False, False),
    ("BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet intel_iommu=on iommu=pt", True, False),
])
def test_reboot_only_when_pending_and_allowed(running, allow, expect_reboot):
    from gpuserve.roles import kernel

    ops = plan(kernel.activate_kernel, {"cat /proc/cmdline": [running]},
               params=["intel_iommu=on", "iommu=pt"], allow_reboot=allow)
    functions = [c[1] for _, cmds in ops for c in cmds if c[0] == "function"]
    assert ("wait_and_reconnect" in functions) is expect_reboot


LSB_DEBIAN = {
    "/etc/os-release": ["ID=debian", 'VERSION_ID="12"', "VERSION_CODENAME=bookworm"],
}
# pyinfra's LinuxDistribution fact: every /etc/*-release file, "---" after each
OS_RELEASE_DEBIAN12 = {
    LinuxDistribution().command(): [
        "/etc/os-release", "NAME=\"Debian GNU/Linux\"", "ID=debian", 'VERSION_ID="12"',
        "VERSION_CODENAME=bookworm", "---"],
}


def _driver_plan(responses, **kwargs):
    from gpuserve.roles import nvidia_driver

    args = dict(repo_url="http://10.0.2.2:8080/cuda/repos/debian12/x86_64/", branch=580)
    args.update(kwargs)
    fm = args.pop("fm", None)
    return plan(nvidia_driver.install_nvidia_driver, {**OS_RELEASE_DEBIAN12, **responses},
                want=nvidia_driver.DriverRequest(**args), fm=fm)


def test_driver_install_plan_uses_keyring_deb822_and_branch_pin():
    ops = _driver_plan({"uname -r": ["6.1.0-28-amd64"]})
    names = [n for n, _ in ops]
    assert any("cuda-keyring" in n for n in names)
    files = uploads(ops)
    source = files["/etc/apt/sources.list.d/cuda-debian12-x86_64.sources"]
    assert "URIs: http://10.0.2.2:8080/cuda/repos/debian12/x86_64/" in source
    assert "Suites: /" in source
    assert "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in source
    assert files["/etc/modprobe.d/blacklist-nouveau.conf"].count("blacklist nouveau") == 1
    dropin = files["/etc/systemd/system/nvidia-persistenced.service.d/override.conf"]
    assert "--persistence-mode" in dropin
    commands = " ;; ".join(runs(ops))
    assert "cuda-keyring_1.1-1_all.deb" in commands
    assert re.search(r"install .*nvidia-driver-pinning-580", commands)
    assert re.search(r"install .*nvidia-open-580", commands)
    assert commands.index("nvidia-driver-pinning-580") < commands.index("nvidia-open-580")
    assert "linux-headers-6.1.0-28-amd64" in commands


def test_driver_590_uses_pinning_then_unversioned_meta():
    commands = " ;; ".join(runs(_driver_plan({}, branch=590, install_headers=False)))
    assert re.search(r"install .*nvidia-driver-pinning-590", commands)
    assert re.search(r"install .*'?nvidia-open'?( |$)", commands)
    assert "nvidia-open-590" not in commands


def test_driver_refuses_proprietary_on_blackwell_before_any_change():
    smi = "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-1, 00000000:01:00.0, " \
          "97887, 0, 580.126.20, 12.0, Enabled"
    with pytest.raises(HostRefusal, match="open kernel modules"):
        _driver_plan({"nvidia-smi --query-gpu": [smi]}, flavour="proprietary")
    sysfs = ["dev 0000:01:00.0 0x10de 0x2bb5 0x030200"]
    with pytest.raises(HostRefusal, match="10de:2bb5"):
        _driver_plan({"/sys/bus/pci/devices": sysfs}, flavour="proprietary")


def test_driver_stops_on_secure_boot_with_mok_instructions():
    with pytest.raises(HostRefusal, match="MOK"):
        _driver_plan({"mokutil --sb-state": ["SecureBoot enabled"]})
    _driver_plan({"mokutil --sb-state": ["SecureBoot enabled"]}, mok_enrolled=True)


def test_cuda_lane_refused_for_old_installed_driver():
    from gpuserve.roles import cuda_toolkit

    dpkg = ["##gpuserve-section:dpkg##", "ii\tnvidia-kernel-open-dkms\t575.57.08-1"]
    with pytest.raises(HostRefusal, match="580.65.06"):
        plan(cuda_toolkit.install_cuda_toolkit, {"dpkg-query": dpkg}, lane="13.0", branch=580)
    ops = plan(cuda_toolkit.install_cuda_toolkit, {}, lane="12.8", branch=580)
    commands = " ;; ".join(runs(ops))
    assert "cuda-toolkit-12-8" in commands
    assert "update-alternatives --set cuda /usr/local/cuda-12.8" in commands
    assert "/usr/local/cuda-12.8/bin" in uploads(ops)["/etc/profile.d/gpuserve-cuda.sh"]


P2P_CNS = [" \tGPU0\tGPU1\t", " GPU0\tX\tCNS\t", " GPU1\tCNS\tX\t"]
P2P_OK = [" \tGPU0\tGPU1\t", " GPU0\tX\tOK\t", " GPU1\tOK\tX\t"]


def test_nccl_env_in_vm_disables_p2p_and_records_custom_all_reduce():
    from gpuserve.roles import nccl

    ops = plan(nccl.configure_nccl, {"systemd-detect-virt": ["kvm"],
                                     "topo -p2p": P2P_CNS})
    files = uploads(ops)
    env = files["/etc/gpuserve/nccl.env"]
    assert "NCCL_P2P_DISABLE=1" in env.splitlines()
    assert '"disable_custom_all_reduce": true' in files["/etc/gpuserve/host.json"]


def test_nccl_env_bare_metal_p2p_ok_and_overrides():
    from gpuserve.roles import nccl

    ops = plan(nccl.configure_nccl, {"systemd-detect-virt": ["none"], "topo -p2p": P2P_OK},
               overrides={"NCCL_DEBUG": "WARN"})
    env = uploads(ops)["/etc/gpuserve/nccl.env"]
    assert "NCCL_P2P_DISABLE" not in env
    assert "NCCL_DEBUG=WARN" in env.splitlines()
    assert "# NCCL_DEBUG: set in host data" in env


def test_nccl_env_leaves_the_serve_deploys_config_dir_alone():
    """/etc/gpuserve is 0750 root:sglang once served (it holds the secrets): the host
    deploy writes its files there without loosening the directory again."""
    from gpuserve.roles import nccl

    served = re.compile(r"test -e /etc/gpuserve \|\|")
    ops = plan(nccl.configure_nccl, {
        served: ["user=root group=sglang mode=drwxr-x--- atime=0 mtime=0 ctime=0 size=4096 "
                 "'/etc/gpuserve'"],
        "systemd-detect-virt": ["kvm"], "topo -p2p": P2P_CNS})
    assert set(uploads(ops)) == {"/etc/gpuserve/nccl.env", "/etc/gpuserve/host.json"}
    touching_dir = [r for r in runs(ops) if r.split()[-1] == "/etc/gpuserve"]
    assert touching_dir == []


QM_CURRENT = [
    "boot: order=scsi0;net0",
    "cores: 32",
    "cpu: host",
    "machine: q35",
    "bios: ovmf",
    "efidisk0: local-lvm:vm-101-disk-1,efitype=4m,size=4M",
    "hostpci0: 0000:01:00.0,pcie=1",
    "memory: 262144",
]


def test_hypervisor_sets_only_differing_qm_keys():
    from gpuserve.roles import proxmox

    responses = {"qm config 101": QM_CURRENT, "qm status": ["status: stopped"]}
    gpus = ["0000:01:00.0", "0000:02:00.0"]
    ops = plan(proxmox.configure_vm, responses, vmid=101, gpus=gpus, mmio_mb=524288, clique=0)
    qm = [r for r in runs(ops) if r.startswith("qm set")]
    assert len(qm) == 1
    assert "--hostpci1 0000:02:00.0,pcie=1" in qm[0]
    assert "--args" in qm[0] and "X-PciMmio64Mb,string=524288" in qm[0]
    for unchanged in ("--cpu", "--machine", "--bios", "--hostpci0"):
        assert unchanged not in qm[0]
    done = QM_CURRENT + [
        "hostpci1: 0000:02:00.0,pcie=1",
        "args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288 "
        "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0",
    ]
    again = plan(proxmox.configure_vm, {"qm config 101": done}, vmid=101,
                 gpus=["0000:01:00.0", "0000:02:00.0"], mmio_mb=524288, clique=0)
    assert runs(again) == []


def test_vfio_binding_writes_ids_modules_and_initramfs():
    from gpuserve.roles import proxmox

    ops = plan(proxmox.bind_vfio, {}, vfio_ids=["10de:2bb5"])
    assert "options vfio-pci ids=10de:2bb5" in uploads(ops)["/etc/modprobe.d/vfio.conf"]
    commands = " ;; ".join(runs(ops))
    for module in ("vfio", "vfio_iommu_type1", "vfio_pci"):
        assert f"echo {module} >> /etc/modules" in commands
    assert "update-initramfs -u -k all" in commands


def test_installed_keyring_is_not_downloaded_again():
    # dpkg-query -W -f='${Status}|${Version}\n' cuda-keyring on a host that has it
    dpkg = ["install ok installed|1.1-1"]
    commands = " ;; ".join(runs(_driver_plan({"dpkg-query -W -f='${Status}|${Version}": dpkg},
                                              install_headers=False)))
    assert "cuda-keyring_1.1-1_all.deb" not in commands
    assert "nvidia-open-580" in commands


DEBIAN12_KEYRING = "e7f219eab6fe4819cdb5c15b98233dc3420302d9c00883219cd3d896857cf48d"


def _keyring_command(ops) -> str:
    return next(c for c in runs(ops) if "cuda-keyring_1.1-1_all.deb" in c)


def test_keyring_download_is_checked_by_sha256_before_dpkg():
    ops = _driver_plan({}, install_headers=False,
                       repo_url="https://mirror.example/cuda/repos/debian12/x86_64/")
    cmd = _keyring_command(ops)
    # the published digest for the host's distribution (os-release: debian 12)
    check = f"echo {DEBIAN12_KEYRING}\"  $d/cuda-keyring.deb\" | sha256sum -c --strict -"
    assert check in cmd
    assert cmd.index("curl ") < cmd.index("sha256sum -c") < cmd.index("dpkg -i")
    assert " && " in cmd[cmd.index("sha256sum"):cmd.index("dpkg -i")]  # dpkg only on match
    # over https curl refuses a downgrade to http on redirect
    assert "--proto =https --proto-redir =https" in cmd
    assert 'rm -rf "$d"' in cmd


def test_keyring_sha256_given_wins_over_the_published_one():
    # deploy/host.py passes the host plan's nvidia_keyring_sha256
    # (tests/unit/host/test_host_deploy_scripts.py covers that path through pyinfra)
    own = "0123456789abcdef" * 4
    ops = _driver_plan({}, install_headers=False, keyring_sha256=own)
    cmd = _keyring_command(ops)
    assert own in cmd and DEBIAN12_KEYRING not in cmd
    # plain http (a trusted loopback mirror): no https-only curl flags, still checked
    assert "--proto" not in cmd and "sha256sum -c --strict" in cmd


def test_keyring_refused_without_a_known_digest():
    from gpuserve.errors import InputError

    ubuntu2004 = {LinuxDistribution().command(): [
        "/etc/os-release", "ID=ubuntu", 'VERSION_ID="20.04"', "---"]}
    from gpuserve.roles import nvidia_driver

    with pytest.raises(InputError) as info:
        plan(nvidia_driver.install_nvidia_driver, ubuntu2004,
             want=nvidia_driver.DriverRequest(repo_url=None, branch=580))
    assert info.value.field == "nvidia_keyring_sha256"
    assert "ubuntu2004/x86_64" in info.value.message
    # a digest in host data (the function argument the deploy fills from it) is enough
    ops = plan(nvidia_driver.install_nvidia_driver, ubuntu2004,
               want=nvidia_driver.DriverRequest(repo_url=None, branch=580,
                                                keyring_sha256="ab" * 32, install_headers=False))
    cmd = _keyring_command(ops)
    assert "ab" * 32 in cmd
    assert "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64/" in cmd
