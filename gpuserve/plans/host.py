"""Prepare-time plan of the host deploy (deploy/host.py): the host data, validated.

Why a module of its own: deploy/host.py and ``gpuserve check`` must run the very same
checks, and the deploy reads ``host.data`` (pyinfra's per-host context) while the check
reads an inventory it never connects to. This function takes the data as a plain dict,
so both call it; what needs the host itself (the CPU vendor and ACPI tables behind the
IOMMU parameters, the boot loader, the running kernel) stays in the roles, read as facts.
"""

from __future__ import annotations

import dataclasses

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.host import defaults as host_defaults
from gpuserve.host import fabric, keyring, mirrors, rdma, rdma_pairs
from gpuserve.host.host_data import HostSettings, host_settings
from gpuserve.measure import gate_runs
from gpuserve.settings import settings as merged


def defaults() -> dict:
    """Every host-data key deploy/host.py reads, with its documented default."""
    return merged({}, host_defaults.KERNEL, host_defaults.NVIDIA_DRIVER,
                  host_defaults.FABRIC_MANAGER, host_defaults.CUDA_TOOLKIT,
                  host_defaults.NCCL, host_defaults.GPU_GATES, host_defaults.RDMA,
                  {"results_dir": "results"})


def plan_host(host_data: dict, source: str) -> HostSettings:
    """``host_data`` (a host's whole data; keys the roles do not document are ignored)
    merged over :func:`defaults` and validated; ``InputError`` names ``source`` and the
    key before any operation exists. ``nvidia_repo_url`` must be https (or file://) unless
    ``trusted_mirrors`` marks it trusted; ``nvidia_keyring_sha256`` must be a sha256."""
    data = merged(host_data, defaults())
    for key, value in data.items():  # bounded before any message repeats a value
        safeload.check_value(value, source, key)
    settings = host_settings(data, source)
    trusted = mirrors.validate_trusted_mirrors(data["trusted_mirrors"], source)
    mirrors.require_https(settings.repo_url, "nvidia_repo_url", trusted, source,
                          allow_file=True)
    keyring_sha256 = keyring.validate_sha256(data["nvidia_keyring_sha256"], source)
    results_dir = data["results_dir"]
    if not isinstance(results_dir, str):
        raise InputError(source, "results_dir", "must be a path (\"\" turns recording off)")
    # the measuring stage (roles/gpu_gates): modes, timeout, pinned-source overrides, and
    # the collectives (an EP profile named by the serve deploy's ``profile`` adds two)
    gates = gate_runs.gate_settings(data, source, profile_ref=host_data.get("profile"))
    return dataclasses.replace(settings, gates=gates, results_dir=results_dir,
                               fabric=fabric.fabric_settings(data, source),
                               rdma=rdma.rdma_mode(data["rdma"], source),
                               rdma_loopback=rdma.loopback_seconds(data["rdma_loopback"],
                                                                   source),
                               rdma_pairs=rdma_pairs.pair_settings(data, source),
                               keyring_sha256=keyring_sha256)
