"""The exporters' plan: node exporter arguments, DCGM packages pinned like the driver,
the dcgm-exporter drop-in, and bad host data named before any host changes."""

from __future__ import annotations

import pytest

from gpuserve.errors import InputError
from gpuserve.monitor.exporters import COUNTERS_PATH, plan_exporters


def test_defaults_switch_both_on_listening_where_the_api_does() -> None:
    plan = plan_exporters({"listen_address": "10.0.0.5"}, "inv.py", gpu_host=True)
    assert plan.node and plan.dcgm
    assert "--web.listen-address=10.0.0.5:9100" in plan.node_args
    assert "nvidia-fabricmanager" in plan.node_args and "\\" not in plan.node_args
    assert f"-f {COUNTERS_PATH} -a 10.0.0.5:9400" in plan.dcgm_dropin
    assert "ExecStart=\n" in plan.dcgm_dropin  # replaces the upstream command, not adds
    assert "NoNewPrivileges=yes" in plan.dcgm_dropin
    assert plan.dcgm_packages == ("datacenter-gpu-manager-4-core",
                                  "datacenter-gpu-manager-exporter")
    assert not plan.warnings


def test_counters_carry_what_the_alerts_read() -> None:
    counters = plan_exporters({}, "inv.py", gpu_host=True).counters
    fields = {line.split(",")[0].strip() for line in counters.splitlines()
              if line and not line.startswith("#")}
    for name in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_THERMAL_VIOLATION",
                 "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                 "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert name in fields


def test_pins_and_switches() -> None:
    plan = plan_exporters({"dcgm_version": "1:4.6.0-1", "dcgm_exporter_version": "4.8.3-1",
                           "node_exporter": False}, "inv.py", gpu_host=True)
    assert plan.dcgm_packages == ("datacenter-gpu-manager-4-core=1:4.6.0-1",
                                  "datacenter-gpu-manager-exporter=4.8.3-1")
    assert not plan.node
    assert any("all addresses" in w for w in plan.warnings)
    # a router host: node metrics only
    assert not plan_exporters({}, "inv.py", gpu_host=False).dcgm


@pytest.mark.parametrize(("data", "field"), [
    ({"dcgm_exporter": "no"}, "dcgm_exporter"),
    ({"node_exporter_port": 0}, "node_exporter_port"),
    ({"dcgm_version": "1.0; rm -rf /"}, "dcgm_version"),
    ({"exporters_listen_address": "example.com"}, "exporters_listen_address"),
])
def test_bad_data_names_the_key(data, field) -> None:
    with pytest.raises(InputError) as info:
        plan_exporters(data, "inv.py", gpu_host=True)
    assert (info.value.file, info.value.field) == ("inv.py", field)


def test_gpuserve_check_knows_the_monitor_keys_and_catches_their_typos() -> None:
    from gpuserve.commands.check import misspelt_keys

    misspelt_keys({"dcgm_exporter_version": "4.8.3-1", "monitor_alert_for": {},
                   "grafana_keyring_sha256": "a" * 64}, "inv.py")  # known: no error
    with pytest.raises(InputError) as info:
        misspelt_keys({"monitor_scrape_intervall": 5}, "inv.py")
    assert "did you mean monitor_scrape_interval" in info.value.message
