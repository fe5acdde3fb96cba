"""Container GPU hosts: what the container shows (its kind, its host's kernel module, the
repository's versions), the userspace package chosen from them or the refusal naming
both versions, and deploy/host.py on a fake container host: no kernel step, one line
per skipped step, nothing changed when the repository lacks the module's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.host import container
from gpuserve.host.nccl_env import is_vm
from tests.cli_fork import run_pyinfra

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "gpuhost"
OPEN_NVRM = FIXTURES / "proc_driver_nvidia_version_open_composed.txt"  # labelled composed
URL = "http://10.0.2.2:8080/cuda/repos/debian12/x86_64/"
# Package:/Version: lines as the lab's NVIDIA-layout repository lists them (lab/nvidia_repo)
INDEX = ["Package: nvidia-driver", "Version: 580.126.20-1",
         "Package: nvidia-driver-cuda", "Version: 580.126.20-1",
         "Package: nvidia-driver-cuda", "Version: 590.48.01-1",
         "Package: cuda-toolkit-13-0", "Version: 13.0.88-1"]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_container_kinds_are_systemds_names_and_nothing_else():
    assert container.parse_container(["lxc"]) == "lxc"
    assert container.parse_container(["systemd-nspawn\n"]) == "systemd-nspawn"
    assert container.parse_container(["none"]) is None
    assert container.parse_container([]) is None
    assert container.parse_container(["kvm"]) is None  # a VM is no container


def test_a_container_is_not_a_vm_guest_for_the_nccl_choice():
    assert is_vm("kvm") and not is_vm("none") and not is_vm(None)
    assert not is_vm("lxc") and not is_vm("systemd-nspawn")


def test_module_version_from_the_proc_file_or_nvidia_smi():
    assert container.parse_module_version(lines(OPEN_NVRM)) == "590.48.01"
    assert container.parse_module_version(
        lines(FIXTURES / "proc_driver_nvidia_version_proprietary_composed.txt")) is not None
    assert container.parse_module_version(["580.126.20"]) == "580.126.20"  # nvidia-smi
    assert container.parse_module_version([]) is None
    with pytest.raises(ValueError):
        container.parse_module_version(["NVRM version: something else"])


def test_index_versions_of_one_package():
    assert container.parse_index_versions(INDEX, "nvidia-driver-cuda") == [
        "580.126.20-1", "590.48.01-1"]
    assert container.parse_index_versions(INDEX, "nvidia-open") == []


def plan(module, available=INDEX):
    versions = (None if available is None
                else container.parse_index_versions(available, container.USERSPACE_PACKAGE))
    return container.userspace_plan(module, versions, container="lxc", repo_url=URL,
                                    source="inventory/gpu.py", host="gpu1")


def test_the_userspace_package_is_exactly_the_modules_version_and_pinned():
    p = plan("580.126.20")
    assert p.package_spec == "nvidia-driver-cuda=580.126.20-1" and p.branch == 580
    pin = p.pin_text()
    assert "Pin: version 580.126.20-1" in pin and "Pin-Priority: 1000" in pin
    assert "Package: nvidia-* libnvidia-*" in pin


def test_a_module_the_repository_lacks_is_refused_naming_both_versions():
    with pytest.raises(InputError) as exc:
        plan("580.95.05")
    text = str(exc.value)
    assert text.startswith("inventory/gpu.py: nvidia_repo_url: gpu1: ")
    assert "kernel module is 580.95.05" in text and "580.126.20-1" in text
    assert "590.48.01" not in text  # what the module's branch offers


def test_no_module_in_sight_and_an_unreadable_index_are_refused():
    with pytest.raises(InputError, match="no NVIDIA kernel module in sight"):
        plan(None)
    with pytest.raises(InputError, match="could not read .*Packages.gz"):
        plan("580.126.20", None)


def test_each_skipped_step_has_one_line_with_its_reason():
    out = container.skipped_lines("gpu1", "lxc")
    assert len(out) == len(container.SKIPPED) == 5
    assert all(line.startswith("gpu1: container host (lxc): ") and " skipped: " in line
               for line in out)


# -- deploy/host.py on a fake container host -----------------------------------------

def responses(nvrm: list[str]) -> dict:
    # first match wins (pyinfra's @fake connector): the container read before the VM one
    return {"systemd-detect-virt --container": ["lxc"], "systemd-detect-virt": ["lxc"],
            "/proc/driver/nvidia/version": nvrm, "Packages.gz": [*INDEX, "# index read"],
            "uname -s": ["Linux"], "cat /proc/cmdline": ["BOOT_IMAGE=/vmlinuz ro quiet"]}


def run(tmp_path: Path, nvrm: list[str], *flags: str,
        os_release: list[str] | None = None) -> tuple[int, str]:
    inventory = tmp_path / "fakeinv.py"
    fake = responses(nvrm)
    if os_release is not None:  # first match wins: the release read before the rest
        fake = {"-release": ["/etc/os-release", *os_release, "---"], **fake}
    data = {"fake_delay": 0, "fake_delay_jitter": 0, "fake_responses": fake,
            "nvidia_repo_url": URL, "trusted_mirrors": ["http://10.0.2.2:8080/"],
            "nvidia_keyring_sha256": "ab" * 32, "gates": "off"}
    inventory.write_text(f"fakeinv = [('@fake/gpu1', {data!r})]\n")
    r = run_pyinfra([*flags, str(inventory), "deploy/host.py"], REPO, timeout=120)
    return r.returncode, r.stdout + r.stderr


NVRM = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (x@y)"


def test_dry_run_on_a_container_host_has_no_kernel_step(tmp_path):
    rc, out = run(tmp_path, [NVRM.format("580.126.20")], "--dry")
    assert rc == 0, out
    assert "NVIDIA userspace driver nvidia-driver-cuda=580.126.20-1 (no kernel module)" in out
    assert "apt pin: NVIDIA userspace 580.126.20-1 only" in out
    assert "CUDA 13.0 toolkit (cuda-toolkit-13-0)" in out
    for absent in ("Kernel parameters", "Blacklist nouveau", "Kernel headers",
                   "Reboot if the running kernel", "nvidia-persistenced"):
        assert absent not in out.replace("nvidia-persistenced skipped", ""), absent
    for step, _ in container.SKIPPED:
        assert f"@fake/gpu1: container host (lxc): {step} skipped: " in out, step


def test_a_module_version_the_repository_lacks_stops_before_any_operation(tmp_path):
    rc, out = run(tmp_path, [NVRM.format("575.57.08")], "-y")
    assert rc != 0
    assert (f"{tmp_path / 'fakeinv.py'}: nvidia_repo_url: @fake/gpu1: the container host's NVIDIA "
            "kernel module is 575.57.08") in out
    assert "Traceback" not in out and "Beginning operation run" not in out


# gpuserve/data/distros/debian13/os-release: recorded from Debian 13 (SOURCES.md there)
DEBIAN13 = (REPO / "gpuserve" / "data" / "distros" / "debian13" / "os-release")


def test_debian13_refuses_an_r580_module_saying_why_before_any_operation(tmp_path):
    release = lines(DEBIAN13)
    rc, out = run(tmp_path, [NVRM.format("580.126.20")], "-y", os_release=release)
    assert rc != 0
    assert ("@fake/gpu1: container host (lxc): its kernel module 580.126.20 is its host's, "
            "and no userspace driver of branch 580 can be installed on debian13: NVIDIA's "
            "debian13 repository carries no R580 driver") in out, out
    assert "load a driver of branch 590 or later on the container's host" in out
    assert "Traceback" not in out and "Beginning operation run" not in out
    # a 590 module on the same host is planned from the repository
    rc, out = run(tmp_path, [NVRM.format("590.48.01")], "--dry", os_release=release)
    assert rc == 0, out
    assert "NVIDIA userspace driver nvidia-driver-cuda=590.48.01-1 (no kernel module)" in out
