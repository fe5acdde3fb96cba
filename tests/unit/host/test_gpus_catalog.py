"""gpus.yaml: every GPU cites its vendor capacity, and nvidia-smi's MiB agree with it."""

from __future__ import annotations

import pytest

from gpuserve.host.gpus import get_gpu, known_gpus

WANTED = ["L4", "L40S", "A100-40GB", "A100-80GB", "H100-PCIE", "H100", "H200", "B200", "B300",
          "GB200", "GB300",
          "RTX-4090", "RTX-5090", "RTX-PRO-6000"]


def test_the_issue_s_gpus_are_known():
    assert set(WANTED) <= set(known_gpus())


@pytest.mark.parametrize("key", WANTED)
def test_memory_total_agrees_with_the_datasheet(key):
    gpu = get_gpu(key)
    assert gpu.datasheet.startswith("https://www.nvidia.com/")
    # GB vs MiB: an 80 GB H100 shows 81559 MiB = 85.5 decimal GB (HBM sold in binary-rounded
    # GB), an L4's 24 GB shows 23034 MiB = 24.2 GB (GDDR less ECC/reserved): within 10%.
    as_gb = gpu.memory_total_mib * 2**20 / 1e9
    assert 0.9 * gpu.datasheet_gb <= as_gb <= 1.1 * gpu.datasheet_gb, (key, as_gb)


def test_sm_majors_follow_the_generation():
    assert get_gpu("L4").sm_major == 8 and get_gpu("A100-40GB").sm_major == 8
    assert get_gpu("H100-PCIE").sm_major == 9 and get_gpu("B200").sm_major == 10
    assert get_gpu("RTX-PRO-6000").sm_major == 12
