"""The monitor plan: targets and labels from the inventory, per-host thresholds, and
host data checked by name before any host changes."""

from __future__ import annotations

import json

import pytest

from gpuserve.errors import InputError
from gpuserve.monitor.plan import CONFIG_PATH, RULES_DIR, TARGETS_DIR, plan_monitor
from tests.unit.monitor.helpers import PROFILE, entries, profile_with_slo


def _plan(**data):
    return plan_monitor(entries(), data, "inventory/fleet.py", profile_with_slo)


def test_every_exporter_of_every_host_is_a_target_with_the_inventorys_labels() -> None:
    plan = _plan()
    sglang = json.loads(plan.files[f"{TARGETS_DIR}/sglang.json"])
    # gpu1 listens on its private address, gpu2 with a key on all of them (its ssh
    # address), gpu3 on loopback only: not scrapeable, and said so
    assert [t["targets"] for t in sglang] == [["10.0.0.11:30000"], ["10.0.0.12:30000"]]
    assert sglang[0]["labels"] == {
        "host": "gpu1", "group": "gpus", "profile": PROFILE,
        "model": sglang[0]["labels"]["model"], "sglang_version": "0.5.23",
        "gpu": "8x NVIDIA H200"}
    assert sglang[0]["labels"]["model"]
    assert sglang[1]["labels"]["gpu"] == "unknown"  # never measured
    assert any("gpu3" in w and "127.0.0.1" in w for w in plan.warnings)
    dcgm = json.loads(plan.files[f"{TARGETS_DIR}/dcgm.json"])
    assert [t["targets"] for t in dcgm] == [["10.0.0.11:9400"], ["10.0.0.13:9400"]]
    node = json.loads(plan.files[f"{TARGETS_DIR}/node.json"])
    assert [t["labels"]["host"] for t in node] == ["gpu1", "gpu2", "gpu3", "router1"]
    smg = json.loads(plan.files[f"{TARGETS_DIR}/smg.json"])
    assert smg == [{"targets": ["10.0.0.2:29000"], "labels": {
        "host": "router1", "group": "routers", "profile": "", "model": "",
        "sglang_version": "", "gpu": ""}}]


def test_thresholds_come_from_the_profile_and_the_last_benchmark() -> None:
    text = _plan().files[f"{RULES_DIR}/thresholds.yml"]
    assert "gpuserve:ttft_slo_seconds" in text and "vector(0.8)" in text
    assert "vector(1200.0)" in text and "vector(64.0)" in text and "vector(8.0)" in text
    # only gpu1 was benchmarked: one baseline, three SLOs (the profile is shared)
    assert text.count("gpuserve:bench_output_tok_s") == 1
    assert text.count("gpuserve:ttft_slo_seconds") == 3


def test_for_windows_follow_host_data() -> None:
    text = _plan(monitor_alert_for={"SGLangServerDown": 10}).files[f"{RULES_DIR}/alerts.yml"]
    assert "alert: SGLangServerDown\n    expr: up{job=\"sglang\"} == 0\n    for: 10s" in text
    assert "for: 300s" in text  # the others keep theirs


def test_same_inventory_same_files() -> None:
    assert _plan().files == _plan().files  # a rerun writes nothing new
    assert "alertmanagers" in _plan().files[CONFIG_PATH]
    assert "alertmanagers" not in _plan(monitor_alertmanager=False).files[CONFIG_PATH]


@pytest.mark.parametrize(("data", "field"), [
    ({"monitor_scrape_interval": 0}, "monitor_scrape_interval"),
    ({"monitor_scrape_interval": True}, "monitor_scrape_interval"),
    ({"monitor_alert_for": {"NoSuchAlert": 10}}, "monitor_alert_for.NoSuchAlert"),
    ({"monitor_alert_for": {"KVCacheFull": -1}}, "monitor_alert_for.KVCacheFull"),
    ({"monitor_alert_for": "10"}, "monitor_alert_for"),
    ({"monitor_retention": "15 days"}, "monitor_retention"),
    ({"monitor_alertmanager": "yes"}, "monitor_alertmanager"),
])
def test_bad_monitor_data_names_the_key(data, field) -> None:
    with pytest.raises(InputError) as info:
        _plan(**data)
    assert (info.value.file, info.value.field) == ("inventory/fleet.py", field)


def test_bad_exporter_data_names_the_key() -> None:
    bad = entries()
    bad[0].data["node_exporter_port"] = 70000
    with pytest.raises(InputError) as info:
        plan_monitor(bad, {}, "inv.py", profile_with_slo)
    assert info.value.field == "node_exporter_port"


def test_prometheus_listens_on_the_monitor_hosts_listen_address() -> None:
    from gpuserve.monitor.plan import DEFAULTS_PATH

    assert "--web.listen-address" not in _plan().files[DEFAULTS_PATH]
    text = _plan(listen_address="10.0.0.3").files[DEFAULTS_PATH]
    assert 'ARGS="--storage.tsdb.retention.time=15d --web.listen-address=10.0.0.3:9090"' in text
    with pytest.raises(InputError) as info:
        _plan(listen_address="monitor.example")
    assert info.value.field == "listen_address"


def test_the_monitor_host_scrapes_its_own_loopback_server() -> None:
    plan = plan_monitor(entries(), {}, "inv.py", profile_with_slo, monitor_host="gpu3")
    sglang = json.loads(plan.files[f"{TARGETS_DIR}/sglang.json"])
    assert ["127.0.0.1:30000"] in [t["targets"] for t in sglang]
    assert not any("gpu3" in w for w in plan.warnings)
