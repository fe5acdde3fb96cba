"""Pure host-provisioning decisions: IOMMU params, cmdline edits, lanes, NCCL, qm diff."""

from __future__ import annotations

import json

import pytest

from gpuserve.errors import InputError
from gpuserve.host import boot, driver, nccl_env, passthrough
from gpuserve.host.host_data import host_settings, hypervisor_settings

# ---------------------------------------------------------------- kernel command line


def test_iommu_params_per_vendor():
    assert boot.iommu_params("GenuineIntel") == ["intel_iommu=on", "iommu=pt"]
    assert boot.iommu_params("intel", passthrough=False) == ["intel_iommu=on"]
    # AMD: on by default, amd_iommu=on is not a switch.
    assert boot.iommu_params("AuthenticAMD") == ["iommu=pt"]
    assert boot.iommu_params("amd", noacs=True) == ["iommu=pt", "pci=noacs"]


def test_iommu_kind_prefers_acpi_tables():
    assert boot.iommu_kind("amd", {"DMAR"}) == "intel"  # q35 + intel-iommu under TCG
    assert boot.iommu_kind("GenuineIntel", {"IVRS"}) == "amd"
    assert boot.iommu_kind("GenuineIntel", set()) == "intel"
    assert boot.iommu_kind(None, None) is None
    assert boot.iommu_params(boot.iommu_kind("amd", {"DMAR"})) == ["intel_iommu=on", "iommu=pt"]


DEBIAN_GRUB = """\
# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${NAME:-Debian} ) 2>/dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX=""
"""


def test_grub_edit_merges_and_is_idempotent():
    params = ["intel_iommu=on", "iommu=pt"]
    once = boot.edit_grub_default(DEBIAN_GRUB, params)
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"' in once
    assert 'GRUB_CMDLINE_LINUX=""' in once  # the other key is untouched
    assert boot.edit_grub_default(once, params) == once
    assert boot.grub_default_value(once) == "quiet intel_iommu=on iommu=pt"


def test_grub_edit_replaces_conflicting_value_and_appends_missing_key():
    text = "GRUB_CMDLINE_LINUX_DEFAULT='quiet intel_iommu=off pci=realloc'\n"
    out = boot.edit_grub_default(text, ["intel_iommu=on", "pci=noacs"])
    assert boot.grub_default_value(out) == "quiet intel_iommu=on pci=realloc,noacs"
    assert boot.edit_grub_default("GRUB_TIMEOUT=5\n", ["iommu=pt"]).endswith(
        'GRUB_CMDLINE_LINUX_DEFAULT="iommu=pt"\n'
    )


def test_kernel_cmdline_file_is_one_line():
    text = "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n"
    out = boot.edit_kernel_cmdline_file(text, ["iommu=pt"])
    assert out == "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n"
    assert boot.edit_kernel_cmdline_file(out, ["iommu=pt"]) == out


def test_missing_params_reads_the_running_cmdline():
    running = "BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=x ro quiet intel_iommu=on"
    assert boot.missing_params(running, ["intel_iommu=on", "iommu=pt"]) == ["iommu=pt"]
    assert boot.missing_params(running + " iommu=pt", ["intel_iommu=on", "iommu=pt"]) == []
    # the last occurrence wins, as in the kernel
    assert boot.missing_params("iommu=pt iommu=nopt", ["iommu=pt"]) == ["iommu=pt"]
    assert boot.missing_params(None, ["iommu=pt"]) == ["iommu=pt"]


def test_boot_loader_config():
    assert boot.boot_loader_config("systemd-boot") == (
        "/etc/kernel/cmdline", "proxmox-boot-tool refresh")
    assert boot.boot_loader_config("grub") == ("/etc/default/grub", "update-grub")
    assert boot.boot_loader_config(None) == ("/etc/default/grub", "update-grub")


# ---------------------------------------------------------------- driver and lanes


def test_driver_plan_versioned_meta_up_to_580_pinning_from_590():
    assert driver.driver_plan(580, "open").packages == (
        "nvidia-driver-pinning-580", "nvidia-open-580")
    assert driver.driver_plan(575, "proprietary").packages == ("cuda-drivers-575",)
    assert driver.driver_plan(575, "open").pinning_package is None
    plan = driver.driver_plan(590, "open")
    assert plan.packages == ("nvidia-driver-pinning-590", "nvidia-open")
    assert plan.pinning_package == "nvidia-driver-pinning-590"


def test_lane_minimums_from_release_notes():
    assert driver.lane_problem("13.0", 580) is None
    assert "580.65.06" in driver.lane_problem("13.0", 575)
    assert driver.lane_problem("12.9", 575) is None
    assert "575.51.03" in driver.lane_problem("12.9", 570)
    assert driver.lane_problem("12.8", 570) is None
    # an installed driver older than the GA minimum is refused too
    assert "580.65.06" in driver.lane_problem("13.0", 580, "580.40.01")
    assert driver.lane_problem("13.0", 580, "580.126.20") is None
    assert "unknown CUDA lane" in driver.lane_problem("11.8", 580)
    assert driver.sglang_release_for_lane("12.8") == "0.5.10.post1"
    assert driver.sglang_release_for_lane("13.0") == "0.5.23"


def test_proprietary_refused_on_blackwell_from_smi_or_pci():
    blackwell = [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "compute_cap": "12.0"}]
    with pytest.raises(driver.HostRefusal, match="open kernel modules"):
        driver.check_flavour("proprietary", blackwell, None)
    with pytest.raises(driver.HostRefusal, match=r"10de:2bb5"):
        driver.check_flavour("proprietary", None,
                             [{"address": "0000:01:00.0", "vendor": "10de", "device": "2bb5"}])
    hopper = [{"name": "NVIDIA H200", "compute_cap": "9.0"}]
    driver.check_flavour("proprietary", hopper, [{"vendor": "10de", "device": "2335"}])
    driver.check_flavour("open", blackwell, None)


def test_secure_boot_stops_with_mok_instructions():
    with pytest.raises(driver.HostRefusal, match="mokutil --import"):
        driver.check_secure_boot(True, False, "gpu1")
    driver.check_secure_boot(True, True, "gpu1")
    driver.check_secure_boot(False, False, "gpu1")
    driver.check_secure_boot(None, False, "gpu1")


def test_repo_url_and_contrib():
    assert driver.repo_url_for("debian", "12", "x86_64") == (
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/")
    assert driver.repo_url_for("ubuntu", "24.04", "aarch64").endswith("/ubuntu2404/sbsa/")
    assert driver.repo_list_name("http://10.0.2.2:8080/cuda/repos/debian12/x86_64/") == (
        "cuda-debian12-x86_64")
    one_line = "deb http://deb.debian.org/debian bookworm main\n# deb-src x y main\n"
    assert driver.with_contrib(one_line) == (
        "deb http://deb.debian.org/debian bookworm main contrib\n# deb-src x y main\n")
    deb822 = "Types: deb\nURIs: http://deb.debian.org/debian\nComponents: main\n"
    assert driver.with_contrib(deb822).endswith("Components: main contrib\n")
    done = driver.with_contrib(one_line)
    assert driver.with_contrib(done) == done


# ---------------------------------------------------------------- NCCL


VM_CNS = [["X"] + ["CNS"] * 7] + [["CNS"] * i + ["X"] + ["CNS"] * (7 - i) for i in range(1, 8)]


def test_nccl_vm_disables_p2p_and_custom_all_reduce():
    plan = nccl_env.plan_nccl("kvm", VM_CNS)
    assert plan.p2p == "none"
    assert plan.env == {"NCCL_P2P_DISABLE": "1"}
    assert plan.disable_custom_all_reduce
    text = nccl_env.render_env_file(plan)
    assert nccl_env.parse_env_file(text) == {"NCCL_P2P_DISABLE": "1"}
    assert "# NCCL_P2P_DISABLE: running in a kvm guest" in text
    doc = json.loads(nccl_env.host_json(plan))
    assert doc["disable_custom_all_reduce"] is True and doc["p2p"] == "none"


def test_nccl_bare_metal_p2p_ok_keeps_defaults():
    ok = [["X", "OK"], ["OK", "X"]]
    plan = nccl_env.plan_nccl("none", ok)
    assert plan.p2p == "ok" and plan.env == {} and not plan.disable_custom_all_reduce
    assert "No overrides" in nccl_env.render_env_file(plan)


def test_nccl_partial_and_overrides():
    partial = [["X", "OK", "CNS"], ["OK", "X", "CNS"], ["CNS", "CNS", "X"]]
    assert nccl_env.plan_nccl("none", partial).env == {"NCCL_P2P_DISABLE": "1"}
    plan = nccl_env.plan_nccl("kvm", VM_CNS, {"NCCL_P2P_DISABLE": "", "NCCL_DEBUG": "WARN"})
    assert plan.env == {"NCCL_DEBUG": "WARN"} and not plan.disable_custom_all_reduce
    assert "set in host data" in nccl_env.render_env_file(plan)
    with pytest.raises(ValueError, match="variable name"):
        nccl_env.validate_overrides({"PATH": "/bin"})
    with pytest.raises(ValueError, match="one line"):
        nccl_env.validate_overrides({"NCCL_DEBUG": "a\nb"})


# ---------------------------------------------------------------- passthrough / qm

# The sysfs 'resource' format (start end flags, hex) of an RTX PRO 6000 Server Edition:
# BAR0 64 MiB 32-bit, BAR1 128 GiB 64-bit prefetchable, BAR3 32 MiB 64-bit prefetchable.
SYSFS = """\
dev 0000:01:00.0 0x10de 0x2bb5 0x030200
res 0x00000000fa000000 0x00000000fbffffff 0x0000000000040200
res 0x0000020000000000 0x0000021fffffffff 0x000000000014220c
res 0x0000000000000000 0x0000000000000000 0x0000000000000000
res 0x0000022000000000 0x0000022001ffffff 0x000000000014220c
dev 0000:01:00.1 0x10de 0x22e8 0x040300
res 0x00000000fc080000 0x00000000fc083fff 0x0000000000040200
"""


def test_sysfs_pci_parse_and_vfio_ids():
    functions = passthrough.parse_sysfs_pci(SYSFS)
    gpu = functions[0]
    assert gpu.is_gpu and gpu.address == "0000:01:00.0"
    assert gpu.bars == [128 * 1024**3, 32 * 1024**2]
    gpus, ids = passthrough.gpus_and_companions(functions)
    assert [g.address for g in gpus] == ["0000:01:00.0"]
    assert ids == ["10de:2bb5", "10de:22e8"]


def test_mmio_window_sizing():
    one = [128 * 1024**3, 32 * 1024**2]
    assert passthrough.mmio_window_mb([one]) == 262144  # 256 GiB fits 128 GiB + 32 MiB
    assert passthrough.mmio_window_mb([one] * 8) == 2097152  # 2 TiB for 8 cards
    assert passthrough.mmio_window_mb([[256 * 1024**2]]) == 32768  # never below OVMF's 32 GiB


PVE_CONF = """\
boot: order=scsi0
cores: 32
cpu: x86-64-v2-AES,hidden=1
efidisk0: local-lvm:vm-101-disk-1,efitype=4m,size=4M
machine: q35
memory: 262144
hostpci0: 0000:01:00.0,pcie=1
scsi0: local-lvm:vm-101-disk-0,size=200G

[snap1]
cpu: host
"""


def test_qm_diff_sets_only_what_differs():
    current = passthrough.parse_qm_config(PVE_CONF)
    assert current["cpu"] == "x86-64-v2-AES,hidden=1"  # snapshot section ignored
    gpus = ["0000:01:00.0", "0000:02:00.0"]
    changes = passthrough.desired_vm_changes(current, gpus, 524288, 0)
    assert set(changes) == {"bios", "cpu", "hostpci1", "args"}
    assert changes["cpu"] == "host"
    assert changes["hostpci1"] == "0000:02:00.0,pcie=1"
    assert changes["args"] == (
        "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288 "
        "-set device.hostpci0.x-nv-gpudirect-clique=0 "
        "-set device.hostpci1.x-nv-gpudirect-clique=0"
    )
    applied = dict(current, **changes)
    assert passthrough.desired_vm_changes(applied, gpus, 524288, 0) == {}
    cmd = passthrough.qm_set_command(101, {"cpu": "host", "args": changes["args"]})
    assert cmd.startswith("qm set 101 --args '-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288 ")
    assert cmd.endswith(" --cpu host")


def test_qm_args_keep_foreign_options_and_resize():
    args = "-cpu host,kvm=on -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
    merged = passthrough.merge_args(args, 262144, None, 1)
    assert merged == "-cpu host,kvm=on -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"


# ---------------------------------------------------------------- host data validation


def _host_defaults(**kw):
    from gpuserve.roles import cuda_toolkit, kernel, nccl, nvidia_driver

    data = {**kernel.DEFAULTS, **nvidia_driver.DEFAULTS, **cuda_toolkit.DEFAULTS, **nccl.DEFAULTS}
    data.update(kw)
    return data


def test_host_settings_defaults_are_valid():
    settings = host_settings(_host_defaults(), "inventory/gpu.py")
    assert settings.branch == 580 and settings.cuda_lane == "13.0" and settings.flavour == "open"
    assert settings.kernel.params("GenuineIntel") == ["intel_iommu=on", "iommu=pt"]


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("cuda_lane", "13.0", "580.65.06"),  # with branch 575 below
        ("nvidia_driver_flavour", "closed", "open, proprietary"),
        ("allow_reboot", "yes", "True or False"),
        ("nvidia_repo_url", "ftp://x", "URL"),
        ("nccl_env", {"NCCL_DEBUG": ["x"]}, "string or number"),
        ("kernel_extra_params", ["a b"], "kernel parameters"),
    ],
)
def test_host_settings_errors_name_file_and_field(key, value, needle):
    data = _host_defaults(**{key: value})
    if key == "cuda_lane":
        data["nvidia_driver_branch"] = 575
    with pytest.raises(InputError) as exc:
        host_settings(data, "inventory/gpu.py")
    assert str(exc.value).startswith(f"inventory/gpu.py: {key}: ")
    assert needle in str(exc.value)


def test_hypervisor_settings():
    from gpuserve.roles import kernel, proxmox

    base = {**kernel.DEFAULTS, **proxmox.DEFAULTS}
    with pytest.raises(InputError, match="proxmox_vmid"):
        hypervisor_settings(base, "inventory/proxmox.py")
    with pytest.raises(InputError, match=r"proxmox_gpus: .*explicit \.0"):
        hypervisor_settings(dict(base, proxmox_vmid=101, proxmox_gpus=["01:00"]), "inv.py")
    ok = hypervisor_settings(dict(base, proxmox_vmid=101), "inv.py")
    assert ok.vmid == 101 and ok.gpus is None and ok.clique == 0


def test_debian13_refuses_r580_and_names_the_branch_it_can_have() -> None:
    """NVIDIA's debian13 repository has no R580 driver (NVIDIA/cuda-repo-management#38);
    the IDs are Debian 13's recorded os-release (gpuserve/data/distros/debian13)."""
    from gpuserve.host.driver import repository_branch_problem
    from gpuserve.launch.interpreter import recorded_facts

    r = recorded_facts("debian13").os_release
    problem = repository_branch_problem(r["ID"], r["VERSION_ID"], 580)
    assert problem and "cannot be installed on debian13" in problem
    assert "nvidia_driver_branch=590" in problem and "#38" in problem
    assert repository_branch_problem(r["ID"], r["VERSION_ID"], 590) is None
    d12 = recorded_facts("debian12").os_release
    assert repository_branch_problem(d12["ID"], d12["VERSION_ID"], 580) is None


def _initramfs_step(tmp_path, images: dict[str, str | None]) -> tuple[int, str, list[str]]:
    """Run the nouveau rebuild step under /bin/sh over ``images`` (kernel version ->
    what lsinitramfs lists, None: it cannot list it), lsinitramfs and update-initramfs
    stubbed on PATH; (exit status, output, the versions rebuilt)."""
    import subprocess

    boot_dir, bin_dir = tmp_path / "boot dir", tmp_path / "bin"
    boot_dir.mkdir()
    bin_dir.mkdir()
    for version, listing in images.items():
        (boot_dir / f"initrd.img-{version}").write_text("")
        if listing is not None:
            (tmp_path / f"{version}.list").write_text(listing)
    rebuilt = tmp_path / "rebuilt"
    (bin_dir / "lsinitramfs").write_text(
        f'#!/bin/sh\ncat "{tmp_path}/${{1##*initrd.img-}}.list"\n')
    (bin_dir / "update-initramfs").write_text(
        f'#!/bin/sh\n[ "$1 $2" = "-u -k" ] && echo "$3" >> "{rebuilt}"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    r = subprocess.run(["/bin/sh", "-c", boot.rebuild_initramfs_holding("nouveau",
                                                                         str(boot_dir))],
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True,
                       text=True, timeout=30)
    done = rebuilt.read_text().split() if rebuilt.exists() else []
    return r.returncode, r.stdout + r.stderr, done


NOUVEAU_LISTING = ("usr/lib/modules/6.8.0-90-generic/kernel/drivers/gpu/drm/nouveau\n"
                   "usr/lib/modules/6.8.0-90-generic/kernel/drivers/gpu/drm/nouveau/"
                   "nouveau.ko.zst\n")


def test_only_an_initramfs_holding_nouveau_is_rebuilt(tmp_path):
    rc, out, rebuilt = _initramfs_step(tmp_path, {
        "6.8.0-90-generic": NOUVEAU_LISTING,
        "6.1.0-41-amd64": "usr/lib/modules/6.1.0-41-amd64/kernel/drivers/virtio/virtio.ko\n"})
    assert rc == 0, out
    assert rebuilt == ["6.8.0-90-generic"]


def test_no_initramfs_with_nouveau_rebuilds_none_and_says_so(tmp_path):
    # a directory named nouveau without the module, and a module that only starts so
    rc, out, rebuilt = _initramfs_step(tmp_path, {"6.1.0-41-amd64": (
        "usr/lib/modules/6.1.0-41-amd64/kernel/drivers/gpu/drm/nouveau\n"
        "usr/lib/modules/6.1.0-41-amd64/kernel/drivers/gpu/drm/nouveau_extra.ko\n")})
    assert (rc, rebuilt) == (0, [])
    assert "no initramfs holds nouveau: none rebuilt" in out


def test_an_initramfs_that_cannot_be_listed_is_rebuilt(tmp_path):
    rc, out, rebuilt = _initramfs_step(tmp_path, {"6.1.0-41-amd64": None})
    assert (rc, rebuilt) == (0, ["6.1.0-41-amd64"]), out
