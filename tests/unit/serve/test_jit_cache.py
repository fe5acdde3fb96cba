"""The JIT and autotune caches' one directory, rendered into the unit's environment."""

from __future__ import annotations

from gpuserve.serve.jit_cache import CACHES, jit_env
from gpuserve.serve.launch_view import unit_environment
from gpuserve.serve.render import UnitSpec, render_unit


def _unit(version: str) -> dict[str, str]:
    spec = UnitSpec(user="sglang", group="sglang", state_dir="/opt/gpuserve/cache",
                    env_file="/etc/gpuserve/sglang.env",
                    launcher=["/opt/gpuserve/venvs/x/bin/python", "-m", "sglang.launch_server"],
                    sglang_version=version)
    return dict(unit_environment(render_unit(spec)))


def test_every_cache_is_placed_under_the_state_directory() -> None:
    env = _unit("0.5.23")
    for cache in CACHES:
        assert env[cache.variable].startswith("/opt/gpuserve/cache/jit/"), cache.variable


def test_safely_keyed_caches_are_shared_across_versions_the_others_split() -> None:
    old, new = _unit("0.5.19"), _unit("0.5.23")
    for cache in CACHES:
        same = old[cache.variable] == new[cache.variable]
        assert same == cache.shared, cache.variable
    assert new["FLASHINFER_WORKSPACE_BASE"] == "/opt/gpuserve/cache/jit/sglang-0.5.23/flashinfer"
    # SGLang overwrites DG_JIT_CACHE_DIR from SGLANG_DG_CACHE_DIR: that is the one to set
    assert "SGLANG_DG_CACHE_DIR" in new and "DG_JIT_CACHE_DIR" not in new


def test_a_version_that_is_no_plain_name_gets_no_path_built_from_it() -> None:
    env = dict(jit_env("/s", "../../etc"))
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/s/jit/sglang-other/flashinfer"
