"""The generated Prometheus files pass Prometheus's own checks: ``promtool check
config`` on the config (with its rule files and targets beside it), and ``promtool
test rules`` on every alert: each fires on a bad series and stays quiet on a healthy
one (tests/fixtures/promtool/alerts_test.yml). promtool comes from Debian's
``prometheus`` package (``python -m lab deps`` installs it; so does CI)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuserve.monitor import rules
from gpuserve.monitor.plan import OWN_DIR, PROM_DIR, plan_monitor
from tests.unit.monitor.helpers import entries, profile_with_slo

PROMTOOL = shutil.which("promtool")
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "promtool" / "alerts_test.yml"
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian's prometheus package: run "
    "python -m lab deps as root)")


def _write(plan, root: Path) -> Path:
    """The plan's files under ``root``, paths rewritten so promtool reads them there."""
    for path, text in plan.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace(f"{PROM_DIR}/", f"{root}/etc/prometheus/"))
    return root / PROM_DIR.lstrip("/")


@needs_promtool
def test_generated_config_passes_promtool_check_config(tmp_path: Path) -> None:
    plan = plan_monitor(entries(), {}, "inv.py", profile_with_slo)
    prom = _write(plan, tmp_path)
    result = subprocess.run([PROMTOOL, "check", "config", str(prom / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@needs_promtool
def test_every_alert_fires_and_stays_quiet_under_promtool(tmp_path: Path) -> None:
    # rule groups evaluated at the test's own 15 s steps; the thresholds the fixture
    # names (gpu1 only), in the generated file's form
    plan = plan_monitor(entries(), {"monitor_scrape_interval": 15}, "inv.py", profile_with_slo)
    prom = _write(plan, tmp_path)
    rules_dir = prom / OWN_DIR.removeprefix(PROM_DIR + "/") / "rules"
    (rules_dir / rules.THRESHOLDS_FILE).write_text(rules.thresholds_text(
        [rules.HostThresholds("gpu1", 0.8, 1200.0, 64.0, 8)], 15))
    doc = yaml.safe_load(FIXTURE.read_text())
    runbooks = {a.name: a.runbook for a in rules.load_rules()[1]}
    fired, quiet = set(), set()
    for case in doc["tests"]:
        for check in case["alert_rule_test"]:
            name = check["alertname"]
            (fired if check["exp_alerts"] else quiet).add(name)
            for alert in check["exp_alerts"]:
                alert["exp_annotations"]["runbook"] = runbooks[name]
    assert fired == quiet == set(runbooks), "every alert needs a firing and a quiet test"
    test_file = rules_dir / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@needs_promtool
def test_a_broken_rule_fails_promtool(tmp_path: Path) -> None:
    """The check can fail: a rule file promtool cannot parse is refused."""
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n- name: x\n  rules:\n  - alert: X\n    expr: up ==\n")
    result = subprocess.run([PROMTOOL, "check", "rules", str(bad)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
