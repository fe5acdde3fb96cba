"""The serve deploy's operations, in order, prepared on pyinfra's @fake host (the shared
``fake_deploy`` harness): a fresh host installs, writes the service's files, starts it
and checks it; a rerun on a host that already serves the plan adds only the checks
(reads); a switch behind SGLang's gateway takes the worker out before its server
restarts and puts it back after its checks, and ``--dry`` says so. The plan's host reads
(GPUs, driver) are an 8-GPU R580 host's; every other fact answers from the responses."""

from __future__ import annotations

import logging
import re

import pytest

import gpuserve.roles.deploys.serve as deploy
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.launch.venvs import requirements_path
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.plans.serve import HostReads, ServePlan
from gpuserve.roles.base.managed import sha1
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.checks.scripts import SCRIPTS
from gpuserve.roles.service import service_files
from gpuserve.roles.sglang import ACCOUNT_MARK, NOLOGIN, VERIFY, directories
from gpuserve.serve.service import CONFIG_DIR

HOST = "@fake/gpu1"
DATA = {"profile": "glm5-nvfp4-tp8", "results_dir": "", "preflight": "off"}
BASE = {"useradd": ["/usr/sbin/useradd"], "groupadd": ["/usr/sbin/groupadd"]}
#: a single path's stat that lists nothing: absent (the stat lines are keyed per path)
ABSENT = {re.compile(r"^stat -c 'stat "): ["-"]}
RUNNING = {"systemctl show": ["ActiveState=active", "UnitFileState=enabled",
                              "NeedDaemonReload=no"]}


def r580(home: str) -> HostRuntime:
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


@pytest.fixture(autouse=True)
def host_facts(monkeypatch) -> None:
    """The plan's own host reads (the doctor's document, the install target)."""
    monkeypatch.setattr(deploy, "host_reads", lambda first: HostReads(runtime=r580))


def serve(fake_deploy, responses: dict, data: dict | None = None, dry: bool = False,
          **fleet):
    def setup(state) -> None:
        run_context(state).dry = dry

    return fake_deploy(deploy.serve_sglang, {**BASE, **responses, **ABSENT},
                       {**DATA, **(data or {})}, host=HOST, setup=setup, **fleet)


def kinds(ops) -> list[str]:
    """Each operation as what it does, in order (its name, without its deploy's)."""
    return [name.rsplit(" | ", 1)[-1] for name in ops.names()]


def plan_of(ops) -> ServePlan:
    return run_context(ops.state).host(HOST).serve_plan


def test_a_fresh_host_installs_then_configures_starts_and_checks(fake_deploy) -> None:
    ops = serve(fake_deploy, {})
    plan = plan_of(ops)
    names = kinds(ops)
    order = ["Service group sglang", "Service user sglang",
             f"venv {plan.venv} from lock {plan.lock.name}",
             "host script /opt/gpuserve/bin/sglang_probe.py",
             "EnvironmentFile /etc/gpuserve/sglang.env (0600 root)",
             "systemd unit /etc/systemd/system/gpuserve-sglang.service",
             "activate gpuserve-sglang.service: daemon-reload, restart, enable",
             "health gate: gpuserve-sglang.service answers /health 200",
             "smoke completion on port 30000",
             "quality check on port 30000 (docs/quality.md)",
             "throughput checks (2 scenarios, SGLang's benchmark client)",
             "keep this configuration as the last good one (root-only copies)",
             f"record what {HOST} runs (/etc/gpuserve/running.json)",
             f"prune venvs beyond keep_venvs={plan.keep_venvs}"]
    assert [n for n in names if n in order] == order, names
    assert not any("gateway" in n for n in names)
    assert "no --config file /etc/gpuserve/sglang-secrets.yaml (no API key)" not in names


def served(plan: ServePlan) -> dict:
    """@fake answers of a host that already serves ``plan``: every directory and file as
    the deploy writes it, the account gpuserve made, the venv verified, the unit running."""
    files = {requirements_path(plan.home, plan.lock): ("644", "root", "root",
                                                      plan.lock.requirements_text()),
             f"{plan.home}/bin/{VERIFY}": ("755", "root", "root",
                                          (SCRIPTS_DIR / VERIFY).read_text()),
             **{f"{plan.bin_dir}/{s}": ("755", "root", "root", (SCRIPTS_DIR / s).read_text())
                for s in SCRIPTS},
             **{f.dest: (f.mode, f.user, f.group, f.contents())
                for f in service_files(plan.service)}}
    dirs = {**{path: (mode, owner, owner) for path, owner, mode in
               directories(plan.user, plan.home)},
            CONFIG_DIR: ("750", "root", plan.user)}
    answers = {f"-- {path} 2>": [f"stat {mode} {user} {group} regular file|{path}",
                                 f"{sha1(text)}  {path}"]
               for path, (mode, user, group, text) in files.items()}
    answers |= {f"-- {path} 2>": [f"stat {mode} {user} {group} directory|{path}"]
                for path, (mode, user, group) in dirs.items()}
    state_dir = f"{plan.home}/cache"
    return {**answers, f"getent passwd {plan.user}": [
        f"passwd={plan.user}:x:998:998:{ACCOUNT_MARK}:{state_dir}:{NOLOGIN}",
        f"group={plan.user}:x:998:", f"primary={plan.user}"],
        "dpkg-query": ["python3-venv install ok installed"],
        f"{plan.venv}/.gpuserve-verified": [plan.lock.hash], **RUNNING}


def test_a_rerun_on_a_host_serving_the_plan_adds_only_the_checks(fake_deploy) -> None:
    plan = plan_of(serve(fake_deploy, {}))
    ops = serve(fake_deploy, served(plan))
    changing = [name for name, commands in ops if commands]
    assert changing == [], changing  # nothing that runs a command at prepare time
    assert kinds(ops) == [
        "health gate: gpuserve-sglang.service answers /health 200",
        "smoke completion on port 30000",
        "quality check on port 30000 (docs/quality.md)",
        "throughput checks (2 scenarios, SGLang's benchmark client)",
        "keep this configuration as the last good one (root-only copies)",
        f"record what {HOST} runs (/etc/gpuserve/running.json)",
        f"prune venvs beyond keep_venvs={plan.keep_venvs}"]


def fleet(data: dict | None = None) -> dict:
    """This worker and a second one behind the gateway on this host (as
    inventory/lab_fleet.py has them)."""
    mine = {"private_address": "10.77.0.1", "listen_address": "10.77.0.1",
            "router_workers_group": "gpu", "router_api_key": "k" * 20, **(data or {})}
    other = {**DATA, "private_address": "10.77.0.2", "listen_address": "10.77.0.2"}
    return {"data": mine, "others": {"@fake/gpu2": other},
            "groups": {"gpu": [HOST, "@fake/gpu2"]}}


def test_a_switch_behind_the_gateway_takes_the_worker_out_and_puts_it_back(
        fake_deploy) -> None:
    ops = serve(fake_deploy, RUNNING, **fleet())
    names = kinds(ops)
    url = "http://10.77.0.1:30000"
    order = ["rolling switch behind the gateway on @fake/gpu1: no earlier worker failed",
             f"venv {plan_of(ops).venv} from lock {plan_of(ops).lock.name}",
             f"take {url} out of the gateway on {HOST}, wait until it is dropped and idle",
             "EnvironmentFile /etc/gpuserve/sglang.env (0600 root)",
             "activate gpuserve-sglang.service: daemon-reload, reset-failed, restart",
             "health gate: gpuserve-sglang.service answers /health 200",
             "throughput checks (2 scenarios, SGLang's benchmark client)",
             f"put {url} back into the gateway on {HOST}, wait until it is ready",
             f"judge {url} by live traffic for 300 s against the workers not switched yet",
             "keep this configuration as the last good one (root-only copies)"]
    assert [n for n in names if n in order] == order, names
    # the take-out is the last operation before the first file the server runs from
    assert names[names.index(order[2]) + 1].startswith("/etc/gpuserve")


def test_a_worker_not_restarting_behind_the_gateway_stays_in(fake_deploy) -> None:
    plan = plan_of(serve(fake_deploy, {}, **fleet()))
    names = kinds(serve(fake_deploy, served(plan), **fleet()))
    assert not any(n.startswith(("take ", "put ", "judge ")) for n in names), names


def test_dry_lists_the_take_out_and_put_back_the_live_judge_and_the_prune(
        fake_deploy, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        ops = serve(fake_deploy, RUNNING, dry=True, **fleet({"rolling_live_window": 60}))
    plan, url = plan_of(ops), "http://10.77.0.1:30000"
    said = [r.getMessage().removeprefix(f"{HOST}: preview: operation: ")
            for r in caplog.records if ": preview: operation: " in r.getMessage()]
    order = [f"install the venv {plan.venv} and verify it against the lock",
             f"take {url} out of the gateway on {HOST}",
             "write /etc/gpuserve/sglang.env",
             "systemctl daemon-reload, reset-failed, restart gpuserve-sglang.service",
             "health gate on port 30000 (a read; waits 900 s at most after a restart)",
             "smoke completion (a read)",
             "quality check against the checkpoint's reference (a read)",
             f"put {url} back into the gateway on {HOST}",
             f"judge {url} by live traffic for 60 s against the workers not switched yet "
             "(a read)",
             "keep this configuration as the last good one",
             f"prune venvs beyond keep_venvs={plan.keep_venvs} (those the units name are "
             "kept)"]
    assert [line for line in said if line in order] == order, said
    text = caplog.text
    assert f"{HOST}: preview: changes (nothing on the host was changed)" in text
    assert re.search(rf"{HOST}: preview: server: restart: .*sglang\.env.* would change", text)


def test_dry_of_a_host_serving_the_plan_says_no_changes(fake_deploy, caplog) -> None:
    plan = plan_of(serve(fake_deploy, {}, **fleet()))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        serve(fake_deploy, served(plan), dry=True, **fleet())
    text = caplog.text
    assert f"{HOST}: preview: no changes (nothing on the host was changed)" in text, text
    assert f"{HOST}: preview: server: no restart" in text
    assert "gateway" not in text.split(f"{HOST}: preview: no changes", 1)[1]
