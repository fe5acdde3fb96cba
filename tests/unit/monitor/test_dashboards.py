"""Our fleet dashboard loads as Grafana JSON: it parses, every panel has what Grafana's
dashboard model needs, its queries name only series the exporters and the rules make,
and promtool parses each of them. The upstream dashboards are not shipped (their
catalog and fetch: test_upstream_dashboards.py); the grafana plan carries their
fetches."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuserve.monitor import rules
from gpuserve.monitor.dashboards import (
    FLEET_FILE,
    dashboard_files,
    fleet_dashboard,
    provisioning_files,
)
from gpuserve.monitor.upstream_dashboards import upstream_dashboards
from gpuserve.paths import DATA_DIR
from tests.unit.monitor.test_promtool import PROMTOOL, needs_promtool


def _panels(doc: dict) -> list[dict]:
    out = []
    for panel in doc["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return out


@pytest.mark.parametrize("name", sorted(dashboard_files()))
def test_dashboard_is_grafana_json(name: str) -> None:
    doc = json.loads(dashboard_files()[name])
    assert isinstance(doc["title"], str) and doc["title"]
    panels = _panels(doc)
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert isinstance(panel["type"], str)
        assert {k: type(v) for k, v in panel["gridPos"].items()} == {
            "h": int, "w": int, "x": int, "y": int}
        for target in panel.get("targets", []):
            assert target["expr"].strip()


def _known_series() -> set[str]:
    recording, _ = rules.load_rules()
    counters = (DATA_DIR / "monitor" / "dcgm-counters.csv").read_text()
    return ({r["record"] for r in recording}
            | {line.split(",")[0].strip() for line in counters.splitlines()
               if line and not line.startswith("#")}
            | {"sglang:inter_token_latency_seconds_bucket"})


def test_fleet_queries_name_only_series_that_exist() -> None:
    known = _known_series()
    exprs = [t["expr"] for p in fleet_dashboard()["panels"] for t in p["targets"]]
    for expr in exprs:
        names = set(re.findall(r"(?:gpuserve|sglang):[A-Za-z0-9_:]+|DCGM_FI_[A-Z0-9_]+", expr))
        assert names and names <= known, (expr, names - known)
    titles = " ".join(p["title"] for p in fleet_dashboard()["panels"])
    for what in ("tokens/s per host", "per profile", "Running", "Queued", "KV", "TTFT",
                 "ITL", "power", "PCIe", "NVLink"):
        assert what in titles


@needs_promtool
def test_promtool_parses_every_fleet_query(tmp_path: Path) -> None:
    exprs = [t["expr"] for p in fleet_dashboard()["panels"] for t in p["targets"]]
    doc = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{n}", "expr": e} for n, e in enumerate(exprs)]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_provisioning_points_grafana_at_the_monitor_and_the_files() -> None:
    files = provisioning_files("http://10.0.0.3:9090")
    datasource = yaml.safe_load(files["/etc/grafana/provisioning/datasources/gpuserve.yaml"])
    assert datasource["datasources"][0]["url"] == "http://10.0.0.3:9090"
    provider = yaml.safe_load(files["/etc/grafana/provisioning/dashboards/gpuserve.yaml"])
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/gpuserve"
    assert FLEET_FILE in dashboard_files()


def test_grafana_plan_needs_the_keys_digest_and_carries_every_dashboard() -> None:
    from gpuserve.errors import InputError
    from gpuserve.monitor.dashboards import GRAFANA_DASHBOARDS, plan_grafana

    with pytest.raises(InputError) as info:
        plan_grafana({}, "inv.py", "http://10.0.0.3:9090")
    assert (info.value.file, info.value.field) == ("inv.py", "grafana_keyring_sha256")
    with pytest.raises(InputError) as info:
        plan_grafana({"grafana_keyring_sha256": "a" * 64, "grafana_version": "1; true"},
                     "inv.py", "http://10.0.0.3:9090")
    assert info.value.field == "grafana_version"
    plan = plan_grafana({"grafana_keyring_sha256": "A" * 64, "grafana_version": "11.6.0"},
                        "inv.py", "http://10.0.0.3:9090")
    assert plan.package == "grafana=11.6.0" and plan.keyring_sha256 == "a" * 64
    assert {f"{GRAFANA_DASHBOARDS}/{name}" for name in dashboard_files()} <= set(plan.files)
    assert "Signed-By: /usr/share/keyrings/grafana.gpg" in plan.files[
        "/etc/apt/sources.list.d/grafana.sources"]
    # the upstream ones: fetched from their pinned raw URLs, checked by the catalog's digest
    catalog = {e.name: e for e in upstream_dashboards()}
    assert {f.name: (f.url, f.sha256, f.dest) for f in plan.fetches} == {
        name: (e.url, e.sha256, f"{GRAFANA_DASHBOARDS}/{e.file}")
        for name, e in catalog.items()}
    assert not set(plan.files) & {f.dest for f in plan.fetches}


@pytest.mark.parametrize("mirror, url", [
    ("https://mirror.example/dash/", "https://mirror.example/dash/sgl-project/sglang/"),
    ("file:///srv/dash", "file:///srv/dash/sgl-project/sglang/"),
    ("/srv/dash", "file:///srv/dash/sgl-project/sglang/"),
    ("http://10.0.0.9:8000/", "http://10.0.0.9:8000/sgl-project/sglang/"),
])
def test_grafana_dashboards_mirror_moves_every_fetch(mirror, url) -> None:
    from gpuserve.monitor.dashboards import plan_grafana

    data = {"grafana_keyring_sha256": "a" * 64, "grafana_dashboards_mirror": mirror,
            "trusted_mirrors": ["http://10.0.0.9:8000/"]}
    plan = plan_grafana(data, "inv.py", "http://10.0.0.3:9090")
    sglang = next(f for f in plan.fetches if f.name == "sglang")
    entry = next(e for e in upstream_dashboards() if e.name == "sglang")
    assert sglang.url == f"{url}{entry.commit}/{entry.path}"


@pytest.mark.parametrize("mirror", ["http://10.0.0.8/", "ftp://mirror/", 42])
def test_an_untrusted_or_odd_mirror_is_refused_naming_the_key(mirror) -> None:
    from gpuserve.errors import InputError
    from gpuserve.monitor.dashboards import plan_grafana

    with pytest.raises(InputError) as info:
        plan_grafana({"grafana_keyring_sha256": "a" * 64,
                      "grafana_dashboards_mirror": mirror}, "inv.py", "http://10.0.0.3:9090")
    assert (info.value.file, info.value.field) == ("inv.py", "grafana_dashboards_mirror")
