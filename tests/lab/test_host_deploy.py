"""deploy/host.py and deploy/hypervisor.py on the lab host, through the real pyinfra CLI.

One module-scoped sequence, kept short because every deploy and reboot runs under TCG:
bare lab Debian -> deploy/host.py (NVIDIA-layout mirror, GRUB change, a real reboot
because the lab inventory sets allow_reboot) -> the IOMMU fact reads on, and a probe
parameter put in /etc/default/grub before the deploy is on the rebooted kernel's command
line (update-grub and a reboot through GRUB: the deploy's own, no second reboot) -> the
rerun reports no changes -> ``pytest tests/host --inventory inventory/lab.py`` passes -> the
proprietary flavour is refused on the Blackwell box before anything changes -> the
bare-metal box changes the NCCL env -> the hypervisor deploy writes the VM config
through the qm stand-in and its rerun changes nothing.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.host import nccl_env
from lab.state import pid_alive

pytestmark = [pytest.mark.lab, pytest.mark.vm]  # the kernel: GRUB, initramfs, reboot

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The lab image has no DKMS build to feed (the stand-in has no kernel module); fetching
# gcc and headers under TCG would only cost minutes.
NO_HEADERS = ("--data", "nvidia_install_headers=False")
VMID = 101
GPUS = [f"0000:{b:02x}:00.0" for b in range(1, 9)]  # the reference box's eight GPUs


def clean(text: str) -> str:
    return ANSI.sub("", text)


def host_deploy(lab, *extra: str, check: bool = True):
    r = lab.run_pyinfra("deploy/host.py", *NO_HEADERS, *extra, check=check)
    return r.returncode, clean(r.stdout)


def no_changes(out: str) -> bool:
    """pyinfra prints "[host] Success" for an operation that ran commands and
    "[host] No changes" for one that had nothing to do."""
    return "[lab-gpu] No changes" in out and not re.search(r"\[lab-gpu\] (Success|Error)", out)


@pytest.fixture(scope="module")
def provisioned(lab):
    """The host deploy on the cold-booted image (IOMMU off), with a probe parameter
    added to GRUB_CMDLINE_LINUX_DEFAULT first (no update-grub: the deploy runs it):
    (what was before, exit status, output)."""
    before = {
        "boot_id": lab.boot_id(),
        "groups": lab.ssh("ls /sys/kernel/iommu_groups | wc -l").stdout.strip(),
        "grub": lab.ssh("grep ^GRUB_CMDLINE_LINUX_DEFAULT /etc/default/grub").stdout,
        "probe": f"gpuserve_lab_probe={secrets.token_hex(4)}",
        "qemu_pid": lab.state.pid,
        # does the running kernel's initramfs hold nouveau, and when was it written
        "initramfs": lab.ssh(INITRAMFS, check=True).stdout.split(),
    }
    lab.ssh("sed -i 's/^GRUB_CMDLINE_LINUX_DEFAULT=\"\\(.*\\)\"/"
            f"GRUB_CMDLINE_LINUX_DEFAULT=\"\\1 {before['probe']}\"/' /etc/default/grub",
            check=True)
    rc, out = host_deploy(lab)
    return before, rc, out


INITRAMFS = ("img=/boot/initrd.img-$(uname -r); lsinitramfs $img | grep -c '/nouveau\\.ko'; "
             "stat -c %Y $img")


def test_the_initramfs_is_rebuilt_only_where_it_holds_nouveau(lab, provisioned):
    """The blacklist changes on a bare host; the initramfs is rebuilt if it held
    nouveau (none on the lab image: MODULES=dep, no GPU of the guest's own), else left."""
    before, rc, out = provisioned
    assert rc == 0, out[-4000:]
    held, written = before["initramfs"]
    _, written_now = lab.ssh(INITRAMFS, check=True).stdout.split()
    assert (written_now != written) == (held != "0"), (held, written, written_now)


def test_bare_host_provisioned_with_grub_change_and_reboot(lab, provisioned):
    before, rc, out = provisioned
    assert rc == 0, out[-4000:]
    assert before["groups"] == "0" and "intel_iommu=off" in before["grub"]
    assert lab.boot_id() != before["boot_id"], "allow_reboot is set: the deploy must reboot"
    grub = lab.ssh("grep ^GRUB_CMDLINE_LINUX_DEFAULT /etc/default/grub").stdout
    # the deploy's value replaced at its place, the unrelated probe kept at its own
    assert grub.strip() == (f'GRUB_CMDLINE_LINUX_DEFAULT="intel_iommu=on {before["probe"]} '
                            'iommu=pt"')
    cmdline = lab.ssh("cat /proc/cmdline").stdout.split()
    assert "intel_iommu=on" in cmdline and "iommu=pt" in cmdline
    fact = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "inventory/lab.py", "fact",
         "gpuserve.facts.host.IommuGroups"],
        cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=600)
    text = clean(fact.stdout + fact.stderr)  # pyinfra prints fact data on stderr
    start = text.index("{", text.index("Fact data for"))
    groups = json.loads(text[start:text.rindex("}") + 1])
    assert groups["lab-gpu"], "the IommuGroups fact reads no group after the reboot"
    installed = lab.ssh("dpkg-query -W -f='${Package} ${Version}\\n' nvidia-open-580 "
                        "nvidia-kernel-open-dkms cuda-toolkit-13-0").stdout
    assert "nvidia-open-580 580.126.20-1" in installed
    assert "cuda-toolkit-13-0 13.0.88-1" in installed


def test_cmdline_change_via_update_grub_survives_a_reboot(lab, provisioned):
    """The lab VM's kernel takes its command line from /etc/default/grub through
    update-grub and GRUB across a guest reboot (the deploy's), as a real host's does:
    the probe parameter no deploy knows is on the running kernel's command line, the
    IOMMU groups appear (intel_iommu=on after the image's intel_iommu=off: the kernel
    honours the last value), and the reboot kept the QEMU process."""
    before, rc, out = provisioned
    assert rc == 0, out[-4000:]
    r = lab.ssh("cat /proc/cmdline; ls /sys/kernel/iommu_groups | wc -l", check=True)
    cmdline, groups = r.stdout.splitlines()
    assert before["probe"] in cmdline.split()
    assert int(groups) >= 4, "intel_iommu=on after a reboot must give IOMMU groups"
    assert lab.state.pid == before["qemu_pid"] and pid_alive(before["qemu_pid"]), \
        "a guest reboot must keep the QEMU process"


def test_rerun_reports_no_changes(lab, provisioned):
    boot_id = lab.boot_id()
    rc, out = host_deploy(lab)
    assert rc == 0, out[-4000:]
    assert no_changes(out), out[-4000:]
    assert lab.boot_id() == boot_id


def test_testinfra_suite_passes_on_the_lab_inventory(lab, provisioned):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/host", "--inventory", "inventory/lab.py"],
                       cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "11 passed" in r.stdout  # 7 host checks + 4 measured-gate checks (test_gpu_gates.py)


def test_proprietary_flavour_refused_on_blackwell_before_any_change(lab, provisioned):
    rc, out = host_deploy(lab, "--data", "nvidia_driver_flavour=proprietary", check=False)
    assert rc != 0
    assert "refused" in out and "open kernel modules" in out
    assert "RTX PRO 6000 Blackwell" in out
    held = lab.ssh("dpkg-query -W -f='${db:Status-Abbrev}' nvidia-kernel-dkms 2>/dev/null")
    assert not held.stdout.startswith("ii")


def test_bare_metal_box_changes_the_nccl_env(lab, provisioned, tmp_path):
    vm_env = lab.ssh(f"cat {nccl_env.NCCL_ENV_PATH}", check=True).stdout
    assert nccl_env.parse_env_file(vm_env) == {"NCCL_P2P_DISABLE": "1"}
    lab.ssh("echo rtxpro6000-baremetal > /etc/gpuserve-lab/box", check=True)
    try:
        rc, out = host_deploy(lab)
        assert rc == 0, out[-4000:]
        bare = lab.ssh(f"cat {nccl_env.NCCL_ENV_PATH}", check=True).stdout
        assert nccl_env.parse_env_file(bare) == {}
        assert "P2P verdict (nvidia-smi topo -p2p r/w): ok" in bare
        doc = json.loads(lab.ssh(f"cat {nccl_env.HOST_JSON_PATH}", check=True).stdout)
        assert doc["p2p"] == "ok" and doc["disable_custom_all_reduce"] is False
    finally:
        # Back to the reference box, and its NCCL env (only the NCCL role, to stay short).
        lab.ssh("echo rtxpro6000-kvm > /etc/gpuserve-lab/box", check=True)
        restore = tmp_path / "nccl_only.py"
        restore.write_text("from gpuserve.roles import nccl\n\nnccl.configure_nccl()\n")
        lab.run_pyinfra(str(restore))
    again = lab.ssh(f"cat {nccl_env.NCCL_ENV_PATH}", check=True).stdout
    assert nccl_env.parse_env_file(again) == {"NCCL_P2P_DISABLE": "1"}


@pytest.fixture(scope="module")
def hypervisor_data(lab, tmp_path_factory) -> Path:
    """The lab VM stands in for a Proxmox host: the qm stand-in plus group data naming
    the reference box's GPUs (the lab's sysfs has no NVIDIA device to read them from)."""
    from lab.qm import install_command

    lab.ssh(install_command(VMID), check=True)
    d = tmp_path_factory.mktemp("hv_group_data")
    (d / "all.py").write_text(
        f"proxmox_vmid = {VMID}\nproxmox_gpus = {GPUS!r}\n"
        "proxmox_vfio_ids = ['10de:2bb5']\nproxmox_mmio_window_mb = 2097152\n"
    )
    return d


def test_hypervisor_deploy_writes_vm_config_and_rerun_changes_nothing(lab, provisioned,
                                                                       hypervisor_data):
    r = lab.run_pyinfra("deploy/hypervisor.py", "--group-data", str(hypervisor_data))
    conf = dict(line.split(": ", 1) for line in
                lab.ssh(f"qm config {VMID}", check=True).stdout.splitlines())
    assert conf["machine"] == "q35" and conf["bios"] == "ovmf" and conf["cpu"] == "host"
    for n, address in enumerate(GPUS):
        assert conf[f"hostpci{n}"] == f"{address},pcie=1"
    assert conf["args"].startswith("-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=2097152 ")
    assert conf["args"].count("x-nv-gpudirect-clique=0") == 8
    assert conf["scsi0"].startswith("local-lvm:vm-101-disk-0")  # untouched keys kept
    vfio = lab.ssh("cat /etc/modprobe.d/vfio.conf; grep -c ^vfio /etc/modules").stdout
    assert "options vfio-pci ids=10de:2bb5" in vfio and vfio.strip().endswith("3")
    before = lab.ssh(f"md5sum /etc/pve/qemu-server/{VMID}.conf").stdout
    again = lab.run_pyinfra("deploy/hypervisor.py", "--group-data", str(hypervisor_data))
    assert no_changes(clean(again.stdout)), clean(again.stdout)[-4000:]
    assert lab.ssh(f"md5sum /etc/pve/qemu-server/{VMID}.conf").stdout == before
    assert r.returncode == 0

