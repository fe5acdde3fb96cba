"""deploy/host.py and deploy/hypervisor.py through the real pyinfra CLI on @fake hosts:
bad host data stops the run naming inventory and key before any operation; --dry
shows the plan."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli_fork import run_pyinfra

REPO = Path(__file__).resolve().parents[3]

RESPONSES = {
    "uname -s": ["Linux"],
    "cat /proc/cmdline": ["BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet"],
    "vendor_id": ["vendor_id\t: GenuineIntel"],
    "/boot/grub/grub.cfg": ["grub_cfg: yes"],
    "systemd-detect-virt": ["kvm"],
}


def run(tmp_path: Path, deploy: str, data: dict, *flags: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "fakeinv.py"
    host_data = {"fake_delay": 0, "fake_delay_jitter": 0, "fake_responses": RESPONSES, **data}
    inventory.write_text(f"fakeinv = [('@fake/gpu1', {host_data!r})]\n")
    return run_pyinfra([*flags, str(inventory), deploy], REPO, timeout=120)


def test_bad_host_data_names_inventory_and_key(tmp_path):
    r = run(tmp_path, "deploy/host.py", {"nvidia_driver_branch": 575, "cuda_lane": "13.0"}, "-y")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"{tmp_path / 'fakeinv.py'}: cuda_lane: CUDA 13.0 needs driver >= 580.65.06" in out
    assert "Traceback" not in out
    assert "Beginning operation run" not in out


MIRROR = {"nvidia_repo_url": "http://10.0.2.2:8080/cuda/repos/debian12/x86_64",
          "trusted_mirrors": ["http://10.0.2.2:8080/"], "nvidia_keyring_sha256": "ab" * 32}


def test_dry_run_shows_the_plan(tmp_path):
    r = run(tmp_path, "deploy/host.py", MIRROR, "--dry")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for op in ("Kernel parameters intel_iommu=on iommu=pt (grub)",
               "Install cuda-keyring (sha256 abababababab...)",
               "Lock driver branch 580", "CUDA 13.0 toolkit (cuda-toolkit-13-0)",
               "NCCL env and host.json from the P2P verdict"):
        assert op in out, op
    assert "Reboot if the running kernel lacks the configuration" in out


def test_dry_diff_previews_packages_files_and_the_reboot(tmp_path):
    """--dry --diff: what would be installed, each file's diff, the initramfs and the
    reboot that would follow, from the state read before any change (roles/base/preview.py)."""
    r = run(tmp_path, "deploy/host.py", {**MIRROR, "allow_reboot": True}, "--dry", "--diff")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    h = "@fake/gpu1: preview: "
    assert f"{h}changes (nothing on the host was changed)" in out
    for line in ("would install nvidia-driver-pinning-580", "would install nvidia-open-580, "
                 "nvidia-persistenced", "would install cuda-toolkit-13-0",
                 "would install cuda-keyring 1.1-1",
                 "reboot: would follow: the running kernel lacks intel_iommu=on iommu=pt",
                 "operation: update-grub (the boot loader's configuration)",
                 "operation: update-initramfs -u (the initramfs without nouveau)",
                 "operation: reboot the host and wait for it",
                 "diff of /etc/default/grub:", "diff of /etc/modprobe.d/blacklist-nouveau.conf:",
                 "diff of /etc/gpuserve/nccl.env:"):
        assert h + line in out, line
    assert '    +GRUB_CMDLINE_LINUX_DEFAULT="intel_iommu=on iommu=pt"' in out
    assert "    +NCCL_P2P_DISABLE=1" in out and "    +blacklist nouveau" in out
    assert "Beginning operation run" not in out
    r = run(tmp_path, "deploy/host.py", MIRROR, "--dry")
    out = r.stdout + r.stderr
    assert f"{h}reboot: pending, not taken (allow_reboot is off)" in out
    assert f"{h}diff of /etc/default/grub:" in out and "(changes; --diff shows them)" in out


def test_untrusted_http_repo_stops_before_any_operation(tmp_path):
    data = {**MIRROR, "trusted_mirrors": []}
    r = run(tmp_path, "deploy/host.py", data, "-y")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"{tmp_path / 'fakeinv.py'}: nvidia_repo_url: " in out
    assert 'trusted_mirrors: ["http://10.0.2.2:8080/"]' in out
    assert "Traceback" not in out and "Beginning operation run" not in out


def test_mirror_without_known_distribution_needs_keyring_sha256(tmp_path):
    # no os-release answer: the published digest cannot be chosen, so the deploy stops
    data = {k: v for k, v in MIRROR.items() if k != "nvidia_keyring_sha256"}
    r = run(tmp_path, "deploy/host.py", data, "-y")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"{tmp_path / 'fakeinv.py'}: nvidia_keyring_sha256: " in out
    assert "Traceback" not in out and "Beginning operation run" not in out


def test_hypervisor_requires_vmid_and_gpus(tmp_path):
    r = run(tmp_path, "deploy/hypervisor.py", {}, "-y")
    assert r.returncode != 0
    assert "fakeinv.py: proxmox_vmid: must be a Proxmox VM id" in r.stdout + r.stderr
    r = run(tmp_path, "deploy/hypervisor.py", {"proxmox_vmid": 101}, "-y")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "proxmox_gpus: no NVIDIA GPU found in sysfs" in out
    assert "Traceback" not in out and "Beginning operation run" not in out


def test_hypervisor_container_without_the_hosts_driver_stops_before_any_operation(tmp_path):
    r = run(tmp_path, "deploy/hypervisor.py", {"proxmox_ctid": 120}, "-y")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert ("fakeinv.py: proxmox_ctid: container 120 on @fake/gpu1: no /dev/nvidiactl and "
            "/dev/nvidiaN (major 195) on the Proxmox host") in out
    assert "Traceback" not in out and "Beginning operation run" not in out
