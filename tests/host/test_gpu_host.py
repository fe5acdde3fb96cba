"""Is this GPU host ready to serve? Checked over SSH on every host of an inventory.

    pytest tests/host --inventory inventory/gpu.py

Expectations come from the host's own inventory data, validated and defaulted exactly
as deploy/host.py does (gpuserve.host.host_data + the roles' DEFAULTS), and the outputs are
read with gpuserve's parsers, so the suite checks what the deploy promised. On a
container host (a Proxmox LXC container, say) the kernel is its host's: instead of the
kernel parameters, modules and persistence mode, the suite checks that the userspace
driver is exactly the loaded kernel module's version.
"""

from __future__ import annotations

import json

import pytest

from gpuserve.host import boot, container, nccl_env
from gpuserve.host.host_data import HostSettings, host_settings
from gpuserve.measure import gate_runs
from gpuserve.parsers import cpuinfo, cuda, nvidia_driver, nvidia_smi, proc_modules
from gpuserve.roles import cuda_toolkit, kernel, nccl
from gpuserve.roles import nvidia_driver as nvidia_role

DPKG = "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'"


@pytest.fixture(scope="module")
def expected(inventory_host) -> HostSettings:
    defaults = {**kernel.DEFAULTS, **nvidia_role.DEFAULTS, **cuda_toolkit.DEFAULTS,
                **nccl.DEFAULTS}
    data = {**defaults, **{k: v for k, v in inventory_host.data.items() if k in defaults}}
    return host_settings(data, inventory_host.source)


@pytest.fixture(scope="module")
def kernel_params(gpu_host, expected) -> list[str]:
    vendor = cpuinfo.parse_cpu_vendor(gpu_host.check_output("grep -m1 '^vendor_id' "
                                                            "/proc/cpuinfo || true"))
    tables = {t for t in ("DMAR", "IVRS")
              if gpu_host.file(f"/sys/firmware/acpi/tables/{t}").exists}
    return expected.kernel.params(vendor, tables)


@pytest.fixture(scope="module")
def container_kind(gpu_host) -> str | None:
    """"lxc", "systemd-nspawn", ... on a container host, else None."""
    return container.parse_container(
        gpu_host.check_output("systemd-detect-virt --container || true").splitlines())


@pytest.fixture
def not_a_container(container_kind) -> None:
    if container_kind:
        pytest.skip(f"container host ({container_kind}): the kernel, its parameters, "
                    "modules and persistence mode are its host's")


def _smi_gpus(gpu_host):
    result = gpu_host.run(nvidia_smi.QUERY_COMMAND)
    assert result.rc == 0, f"nvidia-smi failed: {result.stdout}{result.stderr}"
    gpus = nvidia_smi.parse_query_gpu(result.stdout)
    assert gpus, "nvidia-smi lists no GPU"
    return gpus


def test_container_userspace_matches_the_kernel_module(gpu_host, container_kind):
    """In a container the module is its host's: NVML needs the userspace of exactly its
    version ("Driver/library version mismatch" otherwise)."""
    if not container_kind:
        pytest.skip("not a container host: the driver test checks module and userspace")
    proc = gpu_host.file("/proc/driver/nvidia/version")
    assert proc.exists, "no /proc/driver/nvidia/version: the module is not visible inside"
    module = nvidia_driver.parse_proc_version(proc.content_string)["version"]
    assert {g["driver_version"] for g in _smi_gpus(gpu_host)} == {module}
    installed = gpu_host.run(f"dpkg-query -W -f '${{Version}}' {container.USERSPACE_PACKAGE}")
    assert installed.rc == 0 and installed.stdout.split("-")[0] == module, installed.stdout


def test_driver_present_with_expected_flavour_and_branch(gpu_host, expected, not_a_container):
    installed = nvidia_driver.parse_dpkg_installed(gpu_host.check_output(DPKG))
    proc = gpu_host.file("/proc/driver/nvidia/version")
    if proc.exists:  # the loaded module is the truth
        banner = nvidia_driver.parse_proc_version(proc.content_string)
        flavour, version = banner["flavour"], banner["version"]
    else:
        flavour = nvidia_driver.flavour_from_packages(installed)
        version = nvidia_driver.driver_version_from_packages(installed)
    assert flavour == expected.flavour
    assert version and version.split(".")[0] == str(expected.branch), version
    for gpu in _smi_gpus(gpu_host):
        assert gpu["driver_version"].split(".")[0] == str(expected.branch), gpu


def test_cuda_lane(gpu_host, expected):
    lane = expected.cuda_lane
    version_json = gpu_host.file("/usr/local/cuda/version.json")
    assert version_json.exists, "/usr/local/cuda/version.json missing"
    assert cuda.parse_version_json(version_json.content_string) == lane
    nvcc = gpu_host.check_output(f"/usr/local/cuda-{lane}/bin/nvcc --version")
    assert cuda.parse_nvcc_version(nvcc) == lane


def test_persistence_on(gpu_host, expected, not_a_container):
    if not expected.persistence:
        pytest.skip("nvidia_persistenced is off in host data")
    service = gpu_host.service("nvidia-persistenced")
    assert service.is_enabled and service.is_running
    assert {g["persistence_mode"] for g in _smi_gpus(gpu_host)} == {"Enabled"}


def test_iommu_on(gpu_host, kernel_params, not_a_container):
    cmdline = gpu_host.file("/proc/cmdline").content_string
    assert boot.missing_params(cmdline, kernel_params) == []
    groups = int(gpu_host.check_output(
        "find /sys/kernel/iommu_groups -mindepth 1 -maxdepth 1 -type d | wc -l"))
    assert groups > 0, "no IOMMU groups: the IOMMU is off"


def test_nouveau_absent(gpu_host, not_a_container):
    modules = proc_modules.parse_proc_modules(gpu_host.file("/proc/modules").content_string)
    assert "nouveau" not in modules
    assert gpu_host.file("/etc/modprobe.d/blacklist-nouveau.conf").contains("^blacklist nouveau")


def test_p2p_verdict_consistent_with_nccl_env(gpu_host, expected):
    """nccl.env and host.json are what roles/nccl derives from the driver's verdict, or
    from the measured choice once roles/gpu_gates has measured."""
    matrices = [nvidia_smi.parse_p2p_matrix(gpu_host.check_output(f"nvidia-smi topo -p2p {m}"))
                for m in ("r", "w")]
    verdict = nvidia_smi.p2p_verdict(*matrices)
    virt = gpu_host.check_output("systemd-detect-virt || true").strip() or None
    # once the measuring stage ran, its choice (measured.json) decides, not the verdict
    measured = gpu_host.file(gate_runs.MEASURED_JSON)
    doc = gate_runs.read_measured(measured.content_string) if measured.exists else None
    want = nccl_env.plan_nccl(virt, verdict, expected.nccl_overrides, len(matrices[0].gpus),
                              measured=None if doc is None else doc.get("choice"))
    env_file = gpu_host.file(nccl_env.NCCL_ENV_PATH)
    assert env_file.exists, f"{nccl_env.NCCL_ENV_PATH} missing"
    assert nccl_env.parse_env_file(env_file.content_string) == want.env
    doc = json.loads(gpu_host.file(nccl_env.HOST_JSON_PATH).content_string)
    assert doc["p2p"] == verdict
    assert doc["disable_custom_all_reduce"] is want.disable_custom_all_reduce


def test_reboot_not_pending(gpu_host, kernel_params, not_a_container):
    cmdline = gpu_host.file("/proc/cmdline").content_string
    missing = boot.missing_params(cmdline, kernel_params)
    assert not missing, f"reboot pending: the running kernel lacks {' '.join(missing)}"
    assert not gpu_host.file("/run/reboot-required").exists
    assert "nouveau" not in proc_modules.parse_proc_modules(
        gpu_host.file("/proc/modules").content_string)
