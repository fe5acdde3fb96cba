"""The gateway deploy's plan (gpuserve/plans/router.py): manifest, unit, refusals, lock.

Everything here runs at prepare time, before any host changes, and again in
``gpuserve check`` (through the same ``plan_router``)."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

from gpuserve.commands.check import check_host
from gpuserve.errors import InputError
from gpuserve.fleet.multinode import Member
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.launch.locks import app_locks, load_app_lock
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.plans.router import (
    KEY_PATH,
    MANIFEST_PATH,
    choose_app_lock,
    manifest_text,
    plan_router,
    render_unit,
)

KEY = "router-key-0123456789abcdef"
SRC = "inventory/fleet.py"
PROFILE = "glm5-nvfp4-tp8"


def plan(router: dict | None = None, workers: list[tuple[str, dict]] | None = None,
         host_name: str = "gw", **kwargs):
    data = {"router_workers_group": "gpu", "router_api_key": KEY, **(router or {})}
    if workers is None:
        workers = [("gpu-a", {"profile": PROFILE, "private_address": "10.0.0.21",
                              "listen_address": "10.0.0.21"}),
                   ("gpu-b", {"profile": PROFILE, "private_address": "10.0.0.22",
                              "sglang_api_key": KEY})]
    groups = {"gpu": [Member(n, d) for n, d in workers], "router": [Member(host_name, data)]}
    return plan_router(data, SRC, host_name=host_name, group_members=groups.get, **kwargs)


def refused(field: str, **kwargs) -> str:
    with pytest.raises(InputError) as exc:
        plan(**kwargs)
    assert exc.value.file == SRC and exc.value.field == field, str(exc.value)
    return exc.value.message


# ------------------------------------------------------------------ the manifest


def test_manifest_lists_each_worker_at_its_address_and_profile_port() -> None:
    p = plan()
    doc = json.loads(manifest_text(p.workers))
    assert doc == {"version": 1, "workers": [{"url": "http://10.0.0.21:30000"},
                                             {"url": "http://10.0.0.22:30000"}]}


def test_router_host_that_is_its_own_worker_reaches_it_on_loopback() -> None:
    # the lab's layout: one host, no private_address, its server on 127.0.0.1 (no key)
    p = plan(workers=[("lab", {"profile": PROFILE})], host_name="lab")
    assert json.loads(manifest_text(p.workers))["workers"] == [{"url": "http://127.0.0.1:30000"}]


def test_drained_worker_leaves_the_manifest_and_all_drained_warns() -> None:
    p = plan(workers=[("gpu-a", {"profile": PROFILE, "private_address": "10.0.0.21",
                                 "listen_address": "0.0.0.0", "sglang_api_key": KEY,
                                 "router_drain": True}),
                      ("gpu-b", {"profile": PROFILE, "private_address": "10.0.0.22",
                                 "sglang_api_key": KEY})])
    assert [w.url for w in p.served] == ["http://10.0.0.22:30000"]
    assert "10.0.0.21" not in manifest_text(p.workers)
    assert p.warnings == ()
    everyone = plan(workers=[("lab", {"profile": PROFILE, "router_drain": True})],
                    host_name="lab")
    assert json.loads(manifest_text(everyone.workers)) == {"version": 1, "workers": []}
    assert "every worker of group gpu is drained" in everyone.warnings[0]


def test_ipv6_worker_address_is_bracketed() -> None:
    p = plan(workers=[("v6", {"profile": PROFILE, "private_address": "fd00::21",
                              "sglang_api_key": KEY})])
    assert p.workers[0].url == "http://[fd00::21]:30000"


# ------------------------------------------------------------------ the unit


def test_unit_runs_the_launcher_without_the_key_and_loads_it_as_a_credential() -> None:
    p = plan(python="3.11.2", glibc="2.36")
    unit = render_unit(p)
    assert f"LoadCredential=api-key:{KEY_PATH}" in unit
    exec_start = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    assert KEY not in unit and "--api-key" not in exec_start
    assert exec_start.startswith(f"{p.venv}/bin/python /opt/gpuserve-router/bin/smg_launch.py")
    for flags in (["--discovery-provider", "file"], ["--discovery-file", MANIFEST_PATH],
                  ["--host", "0.0.0.0"], ["--port", "30080"], ["--prometheus-port", "29000"],
                  ["--health-check-endpoint", "/health"], ["--disable-tokenizer-autoload"],
                  ["--worker-startup-timeout-secs", "1800"]):
        assert " ".join(flags) in exec_start, flags
    for line in ("User=smg", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "ReadWritePaths=/opt/gpuserve-router/cache", "PrivateDevices=yes",
                 "CapabilityBoundingSet=", "MemoryDenyWriteExecute=yes",
                 "SystemCallFilter=@system-service", "Environment=PYTHONSAFEPATH=1"):
        assert f"\n{line}\n" in unit, line
    assert p.venv.startswith("/opt/gpuserve-router/venvs/smg-1.13.0-")


def test_settings_from_host_data_reach_the_arguments() -> None:
    p = plan({"router_port": 8080, "router_prometheus_port": 9100,
              "router_listen_address": "10.0.0.5", "router_prometheus_address": "127.0.0.1",
              "router_policy": "round_robin", "router_health_check_interval": 3,
              "router_worker_startup_timeout": 3600, "router_discovery_interval": 7})
    args = " ".join(p.args)
    for part in ("--host 10.0.0.5", "--port 8080", "--prometheus-host 127.0.0.1",
                 "--prometheus-port 9100", "--policy round_robin",
                 "--health-check-interval-secs 3", "--worker-startup-timeout-secs 3600",
                 "--discovery-check-interval-secs 7"):
        assert part in args


# ------------------------------------------------------------------ refusals


def test_router_host_without_workers_group_or_with_an_unknown_group() -> None:
    assert "required on a router host" in refused("router_workers_group",
                                                  router={"router_workers_group": None})
    assert "no inventory group 'gpus'" in refused("router_workers_group",
                                                  router={"router_workers_group": "gpus"})


@pytest.mark.parametrize(("key", "words"), [
    (None, "required"), ("k3y", "too short"), (12345678901234567, "must be a string"),
    ("two\nlines-0123456789", "single line")])
def test_api_key_missing_short_or_malformed_is_refused_without_showing_it(key, words) -> None:
    message = refused("router_api_key", router={"router_api_key": key})
    assert words in message
    if isinstance(key, str):
        assert key not in message


def test_duplicate_worker_addresses_are_refused_naming_both_hosts() -> None:
    message = refused("private_address (host gpu-b)", workers=[
        ("gpu-a", {"profile": PROFILE, "private_address": "10.0.0.21", "sglang_api_key": KEY}),
        ("gpu-b", {"profile": PROFILE, "private_address": "10.0.0.21", "sglang_api_key": KEY})])
    assert "http://10.0.0.21:30000 is also host gpu-a's" in message


def test_gateway_port_clashing_with_the_servers_own_port_is_refused() -> None:
    message = refused("router_port", router={"router_port": 30000},
                      workers=[("lab", {"profile": PROFILE})], host_name="lab")
    assert "30000 is also the port of the SGLang server on this host" in message
    refused("router_prometheus_port", router={"router_prometheus_port": 30000},
            workers=[("lab", {"profile": PROFILE})], host_name="lab")
    assert "also router_port" in refused("router_prometheus_port",
                                         router={"router_prometheus_port": 30080})
    # a remote worker on the gateway's port is no clash (another host)
    assert plan({"router_port": 30000}).port == 30000


def test_remote_worker_needs_an_address_the_gateway_can_reach() -> None:
    assert "required: the address the gateway on gw reaches" in refused(
        "private_address (host gpu-a)", workers=[("gpu-a", {"profile": PROFILE})])
    # no key and no listen_address: the server listens on 127.0.0.1 only
    message = refused("private_address (host gpu-a)", workers=[
        ("gpu-a", {"profile": PROFILE, "private_address": "10.0.0.21"})])
    assert "listens only on 127.0.0.1" in message and "listen_address" in message
    message = refused("private_address (host gpu-a)", workers=[
        ("gpu-a", {"profile": PROFILE, "private_address": "10.0.0.21",
                   "listen_address": "10.0.0.99"})])
    assert "listens on 10.0.0.99" in message


def test_worker_with_another_api_key_is_refused() -> None:
    message = refused("sglang_api_key (host gpu-b)", workers=[
        ("gpu-b", {"profile": PROFILE, "private_address": "10.0.0.22",
                   "sglang_api_key": "another-key-0123456789"})])
    assert "smg sends its own key to the workers" in message
    assert "another-key" not in message


@pytest.mark.parametrize(("router", "field", "words"), [
    ({"router_policy": "fastest"}, "router_policy", "not one of smg's policies"),
    ({"router_port": 0}, "router_port", "whole number in [1, 65535]"),
    ({"router_port": True}, "router_port", "whole number"),
    ({"router_health_check_interval": 0}, "router_health_check_interval", "[1, 3600]"),
    ({"router_listen_address": "gateway.local"}, "router_listen_address", "not an IP"),
    ({"router_user": "root"}, "router_user", "root cannot run"),
    ({"router_home": "relative/dir"}, "router_home", "absolute directory"),
    ({"router_pip_find_links": "http://mirror.example/wheels/"}, "pip_find_links", "https"),
    ({"router_version": "9.9.9"}, "router_version", "no smg lock for 9.9.9"),
])
def test_bad_router_settings_are_refused_naming_the_field(router, field, words) -> None:
    with pytest.raises(InputError) as exc:
        plan(router)
    assert exc.value.field == field and words in exc.value.message, str(exc.value)


def test_worker_without_profile_and_bad_drain_flag_are_refused() -> None:
    assert "required on every worker" in refused("profile (host gpu-a)", workers=[
        ("gpu-a", {"private_address": "10.0.0.21"})])
    assert "true or false" in refused("router_drain (host lab)", workers=[
        ("lab", {"profile": PROFILE, "router_drain": "yes"})], host_name="lab")


def test_check_command_runs_the_same_plan_on_router_hosts() -> None:
    groups = {"gpu": [Member("lab", {"profile": PROFILE})]}
    ok = check_host("lab", {"router_workers_group": "gpu", "router_api_key": KEY,
                            "profile": PROFILE}, SRC, "router", groups)
    assert ok.ok and "1 worker (http://127.0.0.1:30000)" in ok.summary
    assert "smg-1.13.0-py311" in ok.summary
    bad = check_host("lab", {"router_workers_group": "gpu", "router_api_key": "short",
                             "profile": PROFILE}, SRC, "router", groups)
    assert not bad.ok and bad.error.startswith(f"{SRC}: router_api_key: too short")
    typo = check_host("lab", {"router_workers_group": "gpu", "router_api_key": KEY,
                              "router_polcy": "random", "profile": PROFILE}, SRC, "router",
                      groups)
    assert not typo.ok and "did you mean router_policy?" in typo.error


# ------------------------------------------------------------------ the lock


def test_committed_smg_locks_pin_every_wheel_by_hash() -> None:
    locks = app_locks("smg")
    assert [lk.name for lk in locks] == ["smg-1.13.0-py311", "smg-1.13.0-py312"]
    for lock in locks:
        assert lock.package_name == "smg" and lock.version == "1.13.0"
        assert lock.glibc_min == "2.17" and lock.generator == "tools/gen_lock.py"
        names = {p.name for p in lock.packages}
        # smg 1.13.0's Requires-Dist (fleet.md section 2) and theirs
        assert {"smg", "setproctitle", "grpcio", "grpcio-health-checking", "pyyaml",
                "protobuf"} <= names
        lines = lock.requirements_text().splitlines()
        assert len(lines) == len(lock.packages)
        assert all(" --hash=sha256:" in line for line in lines)
        assert all(p.url.startswith("https://files.pythonhosted.org/") for p in lock.packages)
        assert lock.package("smg").sha256 == lock.sha256
    assert locks[0].hash != locks[1].hash  # cp311 and cp312 wheels differ


def test_lock_for_the_hosts_python_is_chosen_and_an_unfit_host_refused() -> None:
    locks = app_locks("smg")
    assert choose_app_lock(locks, "3.12.3", "2.39", "h").name == "smg-1.13.0-py312"
    assert plan(python="3.11.2", glibc="2.36").lock.name == "smg-1.13.0-py311"
    with pytest.raises(PreflightError, match="no smg lock fits this host"):
        choose_app_lock(locks, "3.10.12", "2.35", "h")


def _tampered(tmp_path: Path, change) -> Path:
    src = next(p for p in app_locks("smg")).path
    doc = json.loads(src.read_text())
    change(doc)
    path = tmp_path / src.name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.update(sha256="0" * 64), "sha256"),
    (lambda d: d["packages"][0].update(sha256=None), "packages[0] (grpcio).sha256"),
    (lambda d: d["packages"].append(dict(d["packages"][0])), "packages"),
    (lambda d: d.update(download_bytes=1), "download_bytes"),
    (lambda d: d.update(glibc_min="2.5"), "glibc_min"),
    (lambda d: d["packages"][1].update(external=True), "packages[1] (grpcio-health-checking)"
                                                       ".external"),
])
def test_tampered_lock_is_refused_naming_the_field(tmp_path, change, field) -> None:
    with pytest.raises(InputError) as exc:
        load_app_lock(_tampered(tmp_path, change), "smg")
    assert exc.value.field == field, str(exc.value)


def test_a_lock_of_another_package_is_not_taken_for_smg(tmp_path) -> None:
    path = tmp_path / "smg-1.13.0-py311.json"
    shutil.copy(next(p for p in app_locks("smg")).path, path)
    with pytest.raises(InputError, match="this is a lock of smg, not of sglang-router"):
        load_app_lock(path, "sglang-router")


# ------------------------------------------------------------------ the launcher


def test_launcher_refuses_a_key_on_the_command_line_and_needs_the_credential(
        tmp_path, monkeypatch, capsys) -> None:
    launcher = runpy.run_path(str(SCRIPTS_DIR / "smg_launch.py"))
    assert launcher["key_flags"](["--port", "1", "--api-k=x"]) == ["--api-k=x"]
    assert launcher["main"](["--api-key", "x"]) == 2
    assert "must not be given on the command line" in capsys.readouterr().err
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert launcher["main"]([]) == 2
    assert "LoadCredential" in capsys.readouterr().err
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    (tmp_path / "api-key").write_text("\n")
    assert launcher["main"]([]) == 2
    assert "is empty" in capsys.readouterr().err
