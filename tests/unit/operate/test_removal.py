"""The remove deploy's plan: what goes, what stays, bad host data refused first."""

from __future__ import annotations

import pytest

from gpuserve.errors import InputError
from gpuserve.operate import removal
from gpuserve.operate.removal import plan_removal
from gpuserve.plans import router as router_plan
from gpuserve.roles.service.rollback import LAST_GOOD_DIR
from gpuserve.serve import install


def paths(plan) -> set[str]:
    return {t.path for t in (*plan.files, *plan.directories)}


def test_defaults_follow_the_deploys_registries() -> None:
    assert install.DEFAULTS["sglang_home"] == removal.SGLANG_HOME
    assert router_plan.DEFAULTS["router_home"] == removal.ROUTER_HOME
    assert removal.LAST_GOOD_DIR == LAST_GOOD_DIR


def test_units_configs_and_venvs_go_records_and_weights_stay() -> None:
    plan = plan_removal({}, "inventory/gpu.py")
    assert [u for u, _ in plan.units] == ["gpuserve-sglang.service", "gpuserve-router.service"]
    gone = paths(plan)
    assert {"/etc/systemd/system/gpuserve-sglang.service", "/etc/gpuserve/sglang.env",
            "/etc/gpuserve/sglang-secrets.yaml", "/opt/gpuserve/venvs", "/opt/gpuserve/bin",
            "/etc/gpuserve/last-good", "/etc/systemd/system/gpuserve-router.service",
            "/etc/gpuserve-router", "/opt/gpuserve-router/venvs"} <= gone
    for kept in ("/etc/gpuserve", "/etc/gpuserve/host.json", "/etc/gpuserve/nccl.env",
                 "/etc/gpuserve/measured.json", "/opt/gpuserve", "/opt/gpuserve/bench",
                 "/opt/gpuserve/models", "/opt/gpuserve/cache", "/opt/gpuserve-router"):
        assert kept not in gone
    assert any("weights" in line for line in plan.kept)


def test_remove_weights_takes_the_models_directory() -> None:
    plan = plan_removal({"remove_weights": True, "models_dir": "/srv/models"}, "inv.py")
    assert {"/srv/models", "/opt/gpuserve/cache"} <= paths(plan)
    assert not any("weights" in line for line in plan.kept)


@pytest.mark.parametrize(("data", "field"), [
    ({"remove_weights": "yes"}, "remove_weights"),
    ({"sglang_home": "/"}, "sglang_home"),
    ({"router_home": "relative"}, "router_home"),
    ({"models_dir": "/srv/../etc"}, "models_dir"),
])
def test_bad_host_data_is_refused(data, field) -> None:
    with pytest.raises(InputError) as info:
        plan_removal(data, "inventory/gpu.py")
    assert info.value.file == "inventory/gpu.py" and info.value.field == field


def test_jit_caches_are_kept_unless_asked() -> None:
    kept = plan_removal({}, "inv.py")
    assert "/opt/gpuserve/cache/jit" not in paths(kept)
    assert any("/opt/gpuserve/cache/jit" in line for line in kept.kept)
    gone = plan_removal({"remove_caches": True}, "inv.py")
    assert "/opt/gpuserve/cache/jit" in paths(gone)
    assert "/opt/gpuserve/cache" not in paths(gone)  # the Hub cache stays
    with pytest.raises(InputError) as info:
        plan_removal({"remove_caches": "yes"}, "inv.py")
    assert info.value.field == "remove_caches"
