"""The venv verification points at Fabric Manager when CUDA fails with error 802."""

from __future__ import annotations

import json

from gpuserve.launch.locks import available_locks
from gpuserve.launch.verify import judge

# torch's warning for cudaGetDeviceCount() failing with 802 (pytorch/pytorch#35710,
# microsoft/lisa#2823; shared reference hosts.md §1.6)
NOT_READY = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run "
             "some cuda functions before calling NumCudaDevices() that might have already set "
             "an error? Error 802: system not yet initialized")


def _report(**kw) -> list[str]:
    base = {"python": "3.11.2", "sglang": "0.5.23", "torch": "2.14.1+cu130",
            "torch_dist": "2.14.1", "torch_cuda": "13.0", "cuda_available": False,
            "error": None, "devices": []}
    base.update(kw)
    return [json.dumps(base)]


def test_802_names_fabric_manager_and_the_doctor_rule():
    lock = next(lk for lk in available_locks() if lk.sglang == "0.5.23")
    verdict = judge(_report(cuda_warning=NOT_READY), lock, expect_gpus=8)
    assert not verdict.ok
    (problem,) = verdict.problems
    assert "Error 802: system not yet initialized" in problem
    assert "Fabric Manager" in problem and "fabric-not-ready" in problem
    other = judge(_report(cuda_warning="CUDA unknown error"), lock, expect_gpus=8)
    assert "Fabric Manager" not in other.problems[0]
