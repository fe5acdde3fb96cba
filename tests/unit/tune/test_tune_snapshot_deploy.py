"""The tune's host snapshot (roles/deploys/tune.py) plans the incumbent as the serve
deploy does, once: its GPUs and lock are the serve plan's (no second interpreter
choice or runtime read), prepared on pyinfra's @fake host (the fake_deploy harness)."""

from __future__ import annotations

import json

import gpuserve.roles.deploys.serve as serve_deploy
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.plans.serve import HostReads
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.deploys.tune import tune_snapshot

GPUS = tuple({"name": "NVIDIA H200", "memory_total_mib": 143771, "index": i} for i in range(8))


def test_the_snapshot_takes_gpus_and_lock_from_the_serve_plan(fake_deploy, monkeypatch,
                                                             tmp_path) -> None:
    runtimes: list[str] = []

    def runtime(home: str) -> HostRuntime:
        runtimes.append(home)
        return HostRuntime(name="gpu1", python="3.12.3", glibc="2.39", driver="580.126.20",
                           cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8,
                           gpu_list=GPUS)

    monkeypatch.setattr(serve_deploy, "host_reads", lambda first: HostReads(runtime=runtime))
    target = tmp_path / "snap.json"
    ops = fake_deploy(tune_snapshot, {}, {"profile": "deepseek-v3-fp8-h200-tp8",
                                          "preflight": "off", "tune_snapshot": str(target)})
    assert ops == []  # a read: no operation
    plan = run_context(ops.state).host("@fake/gpu1").serve_plan
    doc = json.loads(target.read_text())
    assert doc["gpus"] == [dict(g) for g in GPUS]
    assert doc["lock"] == f"{plan.lock.name}@{plan.lock.hash}"
    assert doc["sglang_version"] == plan.version and doc["checkpoint"] is None
    assert runtimes == ["/opt/gpuserve"]  # the host's runtime read once, by the plan
