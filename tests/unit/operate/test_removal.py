"""The remove deploy's plan: what goes, what stays, bad host data refused first."""

from __future__ import annotations

import pytest

from gpuserve.errors import InputError
from gpuserve.plans import removal
from gpuserve.plans import router as router_plan
from gpuserve.plans.removal import plan_removal
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
            "/etc/gpuserve-router", "/opt/gpuserve-router/venvs",
            "/opt/gpuserve/tools", "/opt/gpuserve-router/tools",  # the pinned uv
            "/etc/gpuserve/running.json"} <= gone
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


def test_a_host_the_monitor_scrapes_is_named_with_the_way_out() -> None:
    """The remove deploy's line before any change (gpuserve/operate/monitor_note.py)."""
    from gpuserve.operate.monitor_note import monitor_note

    data = {"profile": "glm5-nvfp4-tp8"}
    assert monitor_note("gpu1", data, ["mon1"], "inventory/gpu.py", marked=True) == (
        "gpu1: leaves the monitor's plan (marked removed in its results directory): "
        "pyinfra -y inventory/gpu.py deploy/monitor.py --limit monitor drops its SGLang "
        "target on mon1 (node and DCGM stay); until then SGLangServerDown fires for "
        "host=gpu1: silence it there")
    unmarked = monitor_note("gpu1", data, ["mon1"], "inventory/gpu.py", marked=False)
    assert unmarked.startswith("gpu1: still scraped by the monitor on mon1 (recording is "
                               "off, so it cannot be marked removed): remove its profile")
    assert monitor_note("gpu1", data, [], "inv.py", marked=True) is None  # no monitor
    assert monitor_note("box", {}, ["mon1"], "inv.py", marked=True) is None  # no server


def test_a_removed_host_leaves_the_monitor_plan_until_its_next_record(tmp_path) -> None:
    """The marker after the newest record drops the SGLang target (node stays) and the
    running profile; a newer record (the next serve deploy) brings them back."""
    from gpuserve.measure.results import ResultRecord, write_record
    from gpuserve.monitor.records import recorded
    from gpuserve.monitor.removed import (
        mark_removed,
        marked_since_last_record,
        removed_marker,
    )
    from gpuserve.monitor.targets import HostEntry, targets_of

    data = {"profile": "glm5-nvfp4-tp8", "results_dir": str(tmp_path),
            "listen_address": "10.0.0.11"}

    def smoke(ts: str) -> None:
        write_record(tmp_path, ResultRecord(kind="smoke", profile="glm5-nvfp4-tp8",
                                            host="gpu1", timestamp=ts, launch_hash="h",
                                            figures={"tok_s": 90.0}))

    smoke("2026-12-06T10:00:00Z")
    marker = removed_marker("gpu1", data, "inv.py")
    assert marker == tmp_path / "gpu1" / ".removed" and not marked_since_last_record(marker)
    mark_removed(marker, "2026-12-06T11:00:00Z")
    assert marked_since_last_record(marker)
    rec = recorded("gpu1", data)
    assert (rec.removed, rec.running, rec.error) == ("2026-12-06T11:00:00Z", None, None)
    out = targets_of([HostEntry("gpu1", data, "gpus", rec.run, None, rec.removed)], "inv.py")
    assert sorted(t.job for t in out.targets) == ["dcgm", "node"]
    assert any("removed at 2026-12-06T11:00:00Z" in w for w in out.warnings)
    smoke("2026-12-06T12:00:00Z")  # served again
    rec = recorded("gpu1", data)
    assert rec.removed is None and rec.running.profile == "glm5-nvfp4-tp8"
    assert not marked_since_last_record(marker)
    assert removed_marker("gpu1", {**data, "results_dir": None}, "inv.py") is None
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
