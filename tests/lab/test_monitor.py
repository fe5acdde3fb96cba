"""The monitor deploy on the lab host (container tier): Debian's real prometheus and
prometheus-node-exporter from Debian's archive, the lab host as its own monitor host
(inventory/lab_monitor.py). Every target is up with the inventory's labels, SGLang's
``sglang:`` series arrive, the server-down alert fires within its ``for:`` window once
the service stops and resolves once it is back, and a rerun changes nothing.

Not proven here: NVIDIA's DCGM exporter (not in the lab's repository; the unit tier
scrapes lab/dcgm_standin), a monitor on another host than the one it watches, Grafana.
Runs after the serve modules (conftest); serves the host itself when run alone. Every
wait is bounded in count and time; all traffic stays inside the lab host.
"""

from __future__ import annotations

import json
import re
import time

import pytest

pytestmark = pytest.mark.lab

INVENTORY = "inventory/lab_monitor.py"
UNIT = "gpuserve-sglang.service"
FOR_S = 10  # inventory/lab_monitor.py: monitor_alert_for
SCRAPE_S = 2
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _api(lab, path: str) -> dict:
    r = lab.ssh(f"curl -s -m 5 'http://127.0.0.1:9090{path}'", check=True, timeout=30)
    return json.loads(r.stdout)


def _wait(what: str, check, timeout: float, step: float = 1.0):
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / step) + 2):
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def _alert(lab, name: str) -> str | None:
    alerts = _api(lab, "/api/v1/alerts")["data"]["alerts"]
    return next((a["state"] for a in alerts if a["labels"].get("alertname") == name), None)


@pytest.fixture(scope="module")
def monitored(lab):
    if lab.ssh(f"systemctl is-active {UNIT}").stdout.strip() != "active":
        lab.run_pyinfra("deploy/serve.py", "--data", "bench=off")
    r = lab.run_pyinfra("deploy/monitor.py", inventory=INVENTORY)
    # systemd says started before Prometheus listens: its API is asked once it is ready
    _wait("Prometheus ready", lambda: lab.ssh(
        "curl -sf -m 5 http://127.0.0.1:9090/-/ready").returncode == 0, timeout=60)
    yield ANSI.sub("", r.stdout)
    # leave the host as the other modules expect it: serving, no scraper running
    lab.ssh(f"systemctl start {UNIT}; systemctl stop prometheus prometheus-node-exporter")


def test_every_target_up_with_the_inventorys_labels(lab, monitored) -> None:
    def all_up():
        targets = _api(lab, "/api/v1/targets")["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = _wait("every target up", all_up, timeout=60)
    assert sorted(t["labels"]["job"] for t in targets) == ["node", "sglang"]
    for t in targets:
        labels = t["labels"]
        assert {k: labels[k] for k in ("host", "group", "profile")} == {
            "host": "lab-gpu", "group": "gpu", "profile": "glm5-nvfp4-tp8"}
        assert labels["model"] == "glm-5" and labels["sglang_version"].startswith("0.5.23")
        assert labels["gpu"]
    series = _wait("sglang: series", lambda: _api(
        lab, "/api/v1/query?query=count%28%7B__name__%3D~%22sglang%3A.%2B%22%2C"
             "host%3D%22lab-gpu%22%7D%29")["data"]["result"], timeout=30)
    assert float(series[0]["value"][1]) >= 10


def test_server_down_alert_fires_within_its_window_and_resolves(lab, monitored) -> None:
    _wait("sglang target up", lambda: any(
        t["health"] == "up" for t in _api(lab, "/api/v1/targets")["data"]["activeTargets"]
        if t["labels"]["job"] == "sglang"), timeout=60)
    assert _alert(lab, "SGLangServerDown") is None
    lab.ssh(f"systemctl stop {UNIT}", check=True)
    stopped = time.monotonic()
    _wait("SGLangServerDown firing", lambda: _alert(lab, "SGLangServerDown") == "firing",
          timeout=FOR_S + 30, step=0.5)
    took = time.monotonic() - stopped
    assert FOR_S - 1 <= took <= FOR_S + 4 * SCRAPE_S + 6, took
    lab.ssh(f"systemctl start {UNIT}", check=True)
    _wait("SGLangServerDown resolved", lambda: _alert(lab, "SGLangServerDown") is None,
          timeout=90, step=1.0)


def test_rerun_changes_nothing(lab, monitored) -> None:
    r = lab.run_pyinfra("deploy/monitor.py", inventory=INVENTORY)
    out = ANSI.sub("", r.stdout)
    total = [line for line in out.splitlines() if line.strip().startswith("Grand total")]
    assert total and total[-1].split()[3] == "-", out[-3000:]  # no operation succeeded
