"""A small fleet for the monitor plan's tests: two GPU hosts (one benchmarked, one
never measured) behind a router host, and the monitor host."""

from __future__ import annotations

import dataclasses

from gpuserve.launch.bench import Expectation
from gpuserve.launch.profiles import load_profile
from gpuserve.measure.results import ResultRecord

PROFILE = "deepseek-v3-fp8-h200-tp8"


def profile_with_slo(name: str):
    """The repository's profile with a p99 TTFT expectation of 800 ms."""
    profile = load_profile(name)
    bench = dataclasses.replace(profile.bench, expectations=(
        Expectation("batch", "p99_ttft_ms", "<=", 800.0, "ms"),))
    return dataclasses.replace(profile, bench=bench)


def bench_run(host: str) -> ResultRecord:
    return ResultRecord(kind="bench", profile=PROFILE, host=host, scenario="batch",
                        figures={"output_throughput": 1200.0, "max_concurrency": 64},
                        context={"gpus": {"name": "NVIDIA H200", "count": 8}})


def entries():
    from gpuserve.monitor.targets import HostEntry

    return [
        HostEntry("gpu1", {"profile": PROFILE, "listen_address": "10.0.0.11",
                           "sglang_version": "0.5.23"}, "gpus", bench_run("gpu1")),
        HostEntry("gpu2", {"profile": PROFILE, "ssh_hostname": "10.0.0.12",
                           "sglang_api_key": "k" * 20, "dcgm_exporter": False}, "gpus"),
        HostEntry("gpu3", {"profile": PROFILE, "ssh_hostname": "10.0.0.13"}, "gpus"),
        HostEntry("router1", {"router_workers_group": "gpus", "ssh_hostname": "10.0.0.2",
                              "router_listen_address": "10.0.0.2"}, "routers"),
        HostEntry("mon1", {"ssh_hostname": "10.0.0.3"}, "monitor"),
    ]
