"""deploy/host.py on a container GPU host: the container lab host stands in for a Proxmox
LXC container whose GPUs' kernel module is its host's.

The lab's stand-in for that module is the version file the lab binds at
/proc/driver/nvidia/version (lab/container.py); nothing of a real module is there, so
this shows the deploy's decisions and operations, not a real driver/library match.
Runs right after the container self-test (conftest.py): the serve modules after it use
the host it provisions, as they would on a real container host. On the provisioned host
it also previews (``--dry --diff``) a changed NCCL override and a no-op.
"""

from __future__ import annotations

import re

import pytest
from labhelpers import clean, no_changes

pytestmark = pytest.mark.lab

SKIPPED = ("kernel parameters", "nouveau blacklist and initramfs",
           "NVIDIA kernel module (DKMS, linux-headers)", "nvidia-persistenced",
           "reboot for the kernel")
MISSING = "575.57.08"  # a version the lab's repository (lab/nvidia_repo) lacks


def host_deploy(lab, *extra: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/host.py", *extra, check=False)
    return r.returncode, clean(r.stdout)


def fingerprint(lab) -> str:
    return lab.ssh("ls -la --time-style=full-iso /etc/apt/sources.list.d "
                   "/etc/apt/preferences.d /etc/modprobe.d 2>&1; dpkg -l | md5sum; "
                   "cat /proc/cmdline", check=True).stdout


@pytest.fixture(scope="module")
def provisioned(lab):
    module = lab.state.extra["driver_version"]
    # a module the repository has no userspace for: refused before any change
    lab.set_host_driver_version(MISSING)
    try:
        before = fingerprint(lab)
        refused = host_deploy(lab)
        unchanged = before == fingerprint(lab)
    finally:
        lab.set_host_driver_version(module)
    cmdline = lab.ssh("cat /proc/cmdline", check=True).stdout
    rc, out = host_deploy(lab)
    return module, refused, unchanged, cmdline, rc, out


def test_module_without_userspace_in_the_repository_is_refused_before_any_change(
        provisioned) -> None:
    module, (rc, out), unchanged, *_ = provisioned
    assert rc != 0, out[-4000:]
    assert re.search(rf"the container host's NVIDIA kernel module is {re.escape(MISSING)}, "
                     rf"but \S+ has no nvidia-driver-cuda of that version \(it offers "
                     rf"[^)]*{re.escape(module)}", out), out[-4000:]
    assert "Beginning operation run" not in out and unchanged


def test_container_host_gets_the_modules_userspace_and_none_of_the_kernels(
        lab, provisioned) -> None:
    module, _, _, cmdline, rc, out = provisioned
    assert rc == 0, out[-6000:]
    for step in SKIPPED:
        assert f"lab-gpu: container host (systemd-nspawn): {step} skipped: " in out, step
    smi = lab.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u",
                  check=True).stdout.split()
    assert smi == [module]
    kernel_packages = lab.ssh("dpkg-query -W -f '${Package} ${Status}\\n' | "
                              "grep -E 'dkms|linux-headers' | grep ' installed$' || true",
                              check=True).stdout
    assert kernel_packages == ""
    assert lab.ssh("test -e /etc/modprobe.d/blacklist-nouveau.conf").returncode == 1
    pin = lab.ssh("cat /etc/apt/preferences.d/gpuserve-nvidia-userspace", check=True).stdout
    assert f"Pin: version {module}-1" in pin
    assert lab.ssh("cat /proc/cmdline", check=True).stdout == cmdline
    # the measuring stage ran as on any host
    assert "lab-gpu: gates: recorded " in out


def test_container_host_rerun_reports_no_changes(lab, provisioned) -> None:
    rc, out = host_deploy(lab)
    assert rc == 0, out[-4000:]
    assert no_changes(out), out[-4000:]


NCCL_FILES = "/etc/gpuserve/nccl.env /etc/gpuserve/host.json"


def test_dry_diff_of_a_changed_nccl_env_shows_the_diff_and_changes_nothing(
        lab, provisioned) -> None:
    before = lab.ssh(f"sha256sum {NCCL_FILES}", check=True).stdout
    rc, out = host_deploy(lab, "--dry", "--diff", "--data", 'nccl_env={"NCCL_DEBUG": "INFO"}')
    assert rc == 0, out[-6000:]
    assert "lab-gpu: preview: changes (nothing on the host was changed)" in out, out[-6000:]
    assert "lab-gpu: preview: diff of /etc/gpuserve/nccl.env:" in out
    assert "+NCCL_DEBUG=INFO" in [line.strip() for line in out.splitlines()]
    assert "lab-gpu: preview: diff of /etc/gpuserve/host.json:" in out
    assert "lab-gpu: preview: operation: write /etc/gpuserve/nccl.env" in out
    assert "Beginning operation run" not in out
    assert lab.ssh(f"sha256sum {NCCL_FILES}", check=True).stdout == before


def test_dry_diff_of_a_no_op_shows_no_diff(lab, provisioned) -> None:
    rc, out = host_deploy(lab, "--dry", "--diff")
    assert rc == 0, out[-6000:]
    assert "lab-gpu: preview: no changes (nothing on the host was changed)" in out, out[-6000:]
    assert "preview: diff of" not in out and "preview: would " not in out
