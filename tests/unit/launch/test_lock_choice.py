"""Lock choice, preflight, venv naming/pruning and the verification judge (pure logic).

The locks here are the committed ones (gpuserve/data/locks/, generated from PyPI by
tools/gen_lock.py) unless a test needs a property none of them has.
"""

from __future__ import annotations

import json

import pytest

from gpuserve.host import driver
from gpuserve.launch.lock_choice import (
    HostRuntime,
    PreflightError,
    choose_lock,
    cuda_home,
    preflight,
)
from gpuserve.launch.locks import available_locks
from gpuserve.launch.venvs import (
    VenvEntry,
    parse_listing,
    referenced_venvs,
    venv_path,
    venvs_to_prune,
)
from gpuserve.launch.verify import arch_of, judge, runs_on

LOCKS = available_locks()
GIB = 1024**3


def host(**kw) -> HostRuntime:
    base = dict(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                cuda_toolkit="13.0", free_bytes=200 * GIB, gpus=8)
    base.update(kw)
    return HostRuntime(**base)


def lock_of(version: str, python: str = "3.11"):
    return next(lk for lk in LOCKS if lk.sglang == version and lk.python == python)


def test_newest_lock_the_profile_renders_for_wins() -> None:
    chosen = choose_lock(LOCKS, host(), versions=["0.5.19", "0.5.23"], pinned=None,
                         profile="deepseek")
    assert (chosen.sglang, chosen.python, chosen.torch_cuda) == ("0.5.23", "3.11", "13.0")
    assert choose_lock(LOCKS, host(python="3.12.3", glibc="2.39"), versions=None, pinned=None,
                       profile="p").python == "3.12"


def test_pinned_version_picks_that_lock() -> None:
    chosen = choose_lock(LOCKS, host(), versions=None, pinned="0.5.19", profile="p")
    assert chosen.sglang == "0.5.19"


def test_old_driver_refused_with_both_ways_out() -> None:
    """R575 cannot run the CUDA 13.0 torch every PyPI sglang >= 0.5.11 pins."""
    with pytest.raises(PreflightError) as e:
        choose_lock(LOCKS, host(driver="575.57.08", cuda_toolkit="12.9"),
                    versions=["0.5.23"], pinned=None, profile="glm5-nvfp4-tp8")
    msg = str(e.value)
    assert msg.startswith("gpu1: driver 575.57.08 cannot run lock sglang-0.5.23-cu13-py311")
    assert "needs driver >= 580.65.06" in msg
    assert "nvidia_driver_branch=580" in msg and "choose a profile" in msg


def test_old_driver_gets_the_cuda12_lock_when_the_profile_allows_it() -> None:
    chosen = choose_lock(LOCKS, host(driver="570.133.20", cuda_toolkit="12.8"), versions=None,
                         pinned=None, profile="p")
    assert (chosen.sglang, chosen.torch_cuda, chosen.cuda_major) == ("0.5.10.post1", "12.8", 12)


def test_python_and_glibc_refusals_name_host_and_fix() -> None:
    with pytest.raises(PreflightError, match=r"gpu1: python3 is 3.10.12, .*Python 3.11, 3.12"):
        choose_lock(LOCKS, host(python="3.10.12"), versions=["0.5.23"], pinned=None,
                    profile="p")
    with pytest.raises(PreflightError, match=r"gpu1: .*2\.3[0-9].*cannot be installed here"):
        choose_lock(LOCKS, host(glibc="2.31"), versions=["0.5.23"], pinned=None, profile="p")


def test_no_lock_for_a_version_says_how_to_make_one() -> None:
    with pytest.raises(PreflightError, match="no lock for sglang_version 0.5.21.*gen_lock.py"):
        choose_lock(LOCKS, host(), versions=None, pinned="0.5.21", profile="p")


def test_pinned_version_the_profile_excludes_names_the_profile_not_a_missing_lock() -> None:
    with pytest.raises(PreflightError) as e:
        choose_lock(LOCKS, host(), versions=["0.5.23"], pinned="0.5.10.post1",
                    profile="glm5-nvfp4-tp8", source="inventory/gpu.py")
    msg = str(e.value)
    assert ("sglang_version 0.5.10.post1 pinned in inventory/gpu.py is excluded by profile "
            "glm5-nvfp4-tp8 (its sglang_versions: 0.5.23; a lock for 0.5.10.post1 exists)"
            ) in msg
    assert "gen_lock" not in msg


def test_preflight_disk_and_toolkit_major() -> None:
    lk = lock_of("0.5.23")
    assert preflight(lk, host()) == []
    problems = preflight(lk, host(free_bytes=3 * GIB, cuda_toolkit="12.9"))
    assert len(problems) == 2
    assert "3.0 GiB free" in problems[0] and "sglang_home" in problems[0]
    assert "CUDA toolkit 12.9 does not match" in problems[1] and "cuda_lane=13.0" in problems[1]
    assert cuda_home(host(), lk) == "/usr/local/cuda-13.0"
    assert cuda_home(host(cuda_toolkit="12.9"), lk) is None


def test_lane_table_agrees_with_the_locks() -> None:
    """nvidia.yaml's sglang/torch_cuda per lane are what the committed locks say."""
    for lane, spec in driver.lanes().items():
        locks = [lk for lk in LOCKS if lk.sglang == spec["sglang"]]
        assert locks, f"lane {lane}: no lock for sglang {spec['sglang']}"
        for lk in locks:
            assert lk.torch_cuda == spec["torch_cuda"], (lane, lk.name)
            assert str(lk.cuda_major) == lane.split(".")[0], (lane, lk.name)


def test_venv_names_and_pruning() -> None:
    lk = lock_of("0.5.23")
    path = venv_path("/opt/gpuserve", lk)
    assert path == f"/opt/gpuserve/venvs/0.5.23-{lk.hash}"
    unit = f"ExecStart={path}/bin/python -m sglang.launch_server --port 30000"
    assert referenced_venvs([unit], "/opt/gpuserve") == {path}
    entries = parse_listing([
        "100 1 /opt/gpuserve/venvs/a", "200 1 /opt/gpuserve/venvs/b",
        "300 1 /opt/gpuserve/venvs/c", "400 0 /opt/gpuserve/venvs/partial", "junk",
    ], "/opt/gpuserve")
    assert entries[0] == VenvEntry("/opt/gpuserve/venvs/a", 100, True)
    # keep 2: a (a unit names it) and the newest verified one (c); drop the rest
    assert venvs_to_prune(entries, {"/opt/gpuserve/venvs/a"}, 2) == [
        "/opt/gpuserve/venvs/b", "/opt/gpuserve/venvs/partial"]
    # a unit's venv is kept even beyond keep
    assert "/opt/gpuserve/venvs/a" not in venvs_to_prune(entries, {"/opt/gpuserve/venvs/a"}, 0)
    assert venvs_to_prune(entries, set(), 1) == [
        "/opt/gpuserve/venvs/a", "/opt/gpuserve/venvs/b", "/opt/gpuserve/venvs/partial"]


def report(**kw) -> list[str]:
    # torch.__version__ of PyPI's wheel carries the build label, its metadata does not
    base = {"python": "3.11.2", "sglang": "0.5.23", "torch": "2.14.1+cu130",
            "torch_dist": "2.14.1", "torch_cuda": "13.0",
            "cuda_available": True, "error": None,
            "devices": [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                         "capability": "12.0"}] * 2}
    base.update(kw)
    return ["some pip noise", json.dumps(base)]


def test_verification_passes_only_what_the_lock_says() -> None:
    lk = lock_of("0.5.23")
    ok = judge(report(), lk, expect_gpus=2)
    assert ok.ok and ok.summary == ("sglang 0.5.23, torch 2.14.1+cu130 (CUDA 13.0), "
                                    "2 GPU(s) sm_120")
    bad = judge(report(torch="2.13.0+cu130", torch_dist="2.13.0", torch_cuda="12.8",
                       cuda_available=False, devices=[]), lk, expect_gpus=2)
    assert not bad.ok
    assert "torch is 2.13.0, the lock says 2.14.1" in bad.problems
    assert "torch.__version__ is 2.13.0, the lock says 2.14.1" in bad.problems
    assert "torch.version.cuda is 12.8, the lock says 13.0" in bad.problems
    assert any("is_available() is False on a host with 2 GPU(s)" in p for p in bad.problems)
    # no GPU on the host: nothing to check beyond the versions
    assert judge(report(cuda_available=False, devices=[]), lk, expect_gpus=0).ok


def test_verification_refuses_an_arch_without_kernels_and_no_report() -> None:
    lk = lock_of("0.5.23")
    odd = judge(report(devices=[{"name": "Tesla V100", "capability": "7.0"}]), lk, 1)
    assert not odd.ok and "sm_70" in odd.problems[0]
    assert arch_of("9.0") == "sm_90" and arch_of("12.0") == "sm_120"
    # binary compatibility within a major: sm_80 SASS runs on an sm_86 GPU (A10, RTX 3090)
    assert judge(report(devices=[{"name": "NVIDIA A10", "capability": "8.6"}]), lk, 1).ok
    assert runs_on(["sm_80"], "8.6") and not runs_on(["sm_86"], "8.0")
    assert runs_on(["sm_90a"], "9.0") and not runs_on(["sm_90a"], "9.1")
    assert not runs_on(["sm_90"], "10.0")
    none = judge(["Traceback (most recent call last):", "ImportError: x"], lk, 1)
    assert not none.ok and "ImportError: x" in none.problems[0]
    failed = judge(report(error="ImportError: libcudart.so.13"), lk, 1)
    assert "import failed: ImportError: libcudart.so.13" in failed.problems
