"""``gpuserve check --deploy monitor``: the monitor deploy's own plans
(gpuserve.monitor.host_plan, which roles/deploys/monitor.py runs) for every host of a
real inventory file, and ``ssh_key`` files, judged without connecting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuserve.cli import main
from tests.cli_fork import run_pyinfra
from tests.unit.serve.test_check_inventory import REPO, line, no_network  # noqa: F401

KEYRING = "a" * 64


def inventory(tmp_path: Path, monitor: dict | None = None, grafana: dict | None = None,
              gpu: dict | None = None) -> Path:
    """gpu1 (GLM-5 baseline) in ``gpu``; mon1 in ``monitor``; graf1 in ``grafana``."""
    path = tmp_path / "inv.py"
    gpu_data = {"ssh_hostname": "192.0.2.10", "profile": "glm5-nvfp4-tp8", **(gpu or {})}
    text = f"gpu = [('gpu1', {gpu_data!r})]\n" \
           f"monitor = [('mon1', {{'ssh_hostname': '192.0.2.20', **{monitor or {}!r}}})]\n"
    if grafana is not None:
        text += f"grafana = [('graf1', {{'ssh_hostname': '192.0.2.30', **{grafana!r}}})]\n"
    path.write_text(text)
    return path


def check(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out + err


@pytest.mark.parametrize("data, field, said", [
    ({"monitor_scrape_interval": 0}, "monitor_scrape_interval", "whole seconds in 1..300"),
    ({"monitor_retention": "forever"}, "monitor_retention", "a duration like 15d"),
    ({"monitor_alertmanager": "yes"}, "monitor_alertmanager", "true or false"),
])
def test_monitor_host_mistakes_are_refused_with_file_and_field(tmp_path, capsys, data,
                                                               field, said) -> None:
    inv = inventory(tmp_path, monitor=data)
    rc, out = check(capsys, str(inv), "--deploy", "monitor")
    assert rc == 1, out
    assert f"{inv}: {field}: " in line(out, "mon1", "monitor") and said in out
    assert " ok " in line(out, "gpu1", "monitor")  # its exporters are fine


def test_a_grafana_host_without_the_keyring_digest_is_refused(tmp_path, capsys) -> None:
    inv = inventory(tmp_path, grafana={})
    rc, out = check(capsys, str(inv), "--deploy", "monitor")
    assert rc == 1
    assert f"{inv}: grafana_keyring_sha256: required on a grafana host" in \
        line(out, "graf1", "monitor")


def test_all_checks_every_group_for_what_it_is(tmp_path, capsys) -> None:
    inv = inventory(tmp_path, grafana={"grafana_keyring_sha256": KEYRING})
    rc, out = check(capsys, str(inv))
    assert rc == 0, out
    kinds = {tuple(ln.split()[:2]) for ln in out.splitlines()
             if ln[:1] not in ("#", " ")}  # host lines, not their indented warnings
    assert kinds == {("gpu1", "serve"), ("gpu1", "host"), ("gpu1", "monitor"),
                     ("mon1", "monitor"), ("graf1", "monitor")}
    assert "Prometheus for 3 hosts, every 5 s, Alertmanager" in line(out, "mon1", "monitor")
    assert "exporters: node, DCGM" in line(out, "gpu1", "monitor")
    assert "Grafana (grafana)" in line(out, "graf1", "monitor")
    assert "# not checked without the host (monitor): " in out
    # the deploy's own warnings come with it: SGLang on loopback cannot be scraped
    assert "gpu1: SGLang listens on 127.0.0.1 only" in out


def test_exporter_mistakes_on_a_gpu_host_are_refused(tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gpu={"node_exporter_port": 0})
    rc, out = check(capsys, str(inv))
    assert rc == 1
    assert f"{inv}: node_exporter_port: must be a port" in line(out, "gpu1", "monitor")


def test_ssh_key_missing_or_world_readable_is_refused(tmp_path, capsys) -> None:
    key = tmp_path / "id_ed25519"
    inv = inventory(tmp_path, gpu={"ssh_key": str(key)})
    rc, out = check(capsys, str(inv), "--deploy", "host")
    assert rc == 1 and f"{inv}: ssh_key: no such file: {key}" in line(out, "gpu1", "host")
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    os.chmod(key, 0o644)
    rc, out = check(capsys, str(inv), "--deploy", "host")
    assert rc == 1 and "is readable by every user (mode 0644)" in line(out, "gpu1", "host")
    os.chmod(key, 0o600)
    rc, out = check(capsys, str(inv), "--deploy", "host")
    assert rc == 0, out


def test_an_inventory_without_monitor_groups_is_checked_as_before(tmp_path, capsys) -> None:
    inv = tmp_path / "inv.py"
    inv.write_text("gpu = [('gpu1', {'ssh_hostname': '192.0.2.10', "
                   "'profile': 'glm5-nvfp4-tp8'})]\n")
    rc, out = check(capsys, str(inv))
    assert rc == 0, out
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("gpu1")] == \
        ["serve", "host"]


def test_same_refusal_as_the_monitor_deploy_through_pyinfra(tmp_path, capsys) -> None:
    """The deploy (real pyinfra CLI, @fake hosts) and the check print the same line."""
    inv = tmp_path / "fakeinv.py"
    inv.write_text("gpu = [('@fake/gpu1', {'fake_delay': 0, 'profile': 'glm5-nvfp4-tp8'})]\n"
                   "monitor = [('@fake/mon1', {'fake_delay': 0, "
                   "'monitor_scrape_interval': 0})]\n")
    deploy = run_pyinfra(["-y", str(inv), "deploy/monitor.py"], REPO, timeout=120)
    expected = f"{inv}: monitor_scrape_interval: must be whole seconds in 1..300, got 0"
    assert deploy.returncode != 0 and expected in deploy.stdout + deploy.stderr
    rc, out = check(capsys, str(inv), "--deploy", "monitor")
    assert rc == 1 and expected in line(out, "@fake/mon1", "monitor")
