"""SGLang's gateway (the real smg wheel from PyPI) in front of the lab host's server.

The lab host is its own router and only worker (inventory/lab.py: router_workers_group
"gpu"). Runs after the serve modules (conftest.py orders it before the faults), whose
last state is a served profile: the ``worker`` fixture makes sure of it with the
serve deploy (bench off; a no-op when the host already serves the lab profile without a
key). One gateway deploy, its checks, a rerun, then a drain and a return through the
manifest alone. The gateway is stopped at the end so the fault tests see the host as
before.
"""

from __future__ import annotations

import json
import time

import pytest
from labhelpers import clean, no_changes

pytestmark = pytest.mark.lab

UNIT = "gpuserve-router.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
MANIFEST = "/etc/gpuserve-router/workers.json"
KEY_PATH = "/etc/gpuserve-router/api-key"
# inventory/lab.py's router_api_key (the lab's own key; it still takes the secret's path)
KEY = "lab-router-key-not-a-secret-0001"
PORT = 30080
WORKER = "http://127.0.0.1:30000"


def router(lab, *args: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/router.py", *args, check=False)
    return r.returncode, clean(r.stdout)


def get(lab, path: str, key: str | None = KEY) -> tuple[int, str]:
    auth = f"-H 'Authorization: Bearer {key}' " if key else ""
    r = lab.ssh(f"curl -s -w '\\n%{{http_code}}' {auth}http://127.0.0.1:{PORT}{path}",
                timeout=60)
    body, _, code = r.stdout.rpartition("\n")
    return int(code or 0), body


def workers(lab) -> list[dict]:
    code, body = get(lab, "/workers")
    assert code == 200, body
    return json.loads(body)["workers"]


def invocation(lab) -> str:
    return lab.ssh(f"systemctl show -p InvocationID,MainPID {UNIT}", check=True).stdout


@pytest.fixture(scope="module")
def worker(lab):
    lab.run_pyinfra("deploy/serve.py", "--data", "bench=off")


@pytest.fixture(scope="module")
def first_run(lab, worker):
    t0 = time.monotonic()
    rc, out = router(lab)
    yield rc, out, time.monotonic() - t0
    lab.ssh(f"systemctl disable --now {UNIT}", timeout=120)


def test_gateway_deploy_installs_the_locked_smg_and_finds_the_worker_ready(first_run) -> None:
    rc, out, seconds = first_run
    assert rc == 0, out[-6000:]
    print(f"first gateway deploy: {seconds:.1f} s")
    assert "router venv: verified smg 1.13.0" in out
    assert "lab-gpu: router: 1/1 workers ready on 0.0.0.0:30080" in out, out[-3000:]


def test_workers_lists_the_lab_worker_ready(lab, first_run) -> None:
    found = workers(lab)
    assert [(w["url"], w["status"], w["is_healthy"]) for w in found] == [
        (WORKER, "ready", True)]
    assert json.loads(lab.ssh(f"cat {MANIFEST}", check=True).stdout) == {
        "version": 1, "workers": [{"url": WORKER}]}


def test_completion_through_the_gateway_needs_the_key(lab, first_run) -> None:
    body = json.dumps({"model": "glm-5", "prompt": "hello", "max_tokens": 8})

    def complete(auth: str):
        return lab.ssh(f"curl -s -w '\\n%{{http_code}}' -H 'content-type: application/json' "
                       f"{auth}http://127.0.0.1:{PORT}/v1/completions -d '{body}'",
                       timeout=120)

    r = complete(f"-H 'Authorization: Bearer {KEY}' ")
    text, _, code = r.stdout.rpartition("\n")
    assert code == "200", r.stdout
    assert json.loads(text)["usage"]["completion_tokens"] == 8
    r = complete("")
    assert r.stdout.rpartition("\n")[2] == "401", r.stdout
    assert get(lab, "/workers", key=None)[0] == 401
    assert get(lab, "/workers", key="wrong-key-0123456789")[0] == 401
    assert get(lab, "/liveness", key=None)[0] == 200  # public, as in smg


def test_key_is_a_credential_never_on_a_command_line_nor_in_logs(lab, first_run) -> None:
    _, out, _ = first_run
    assert KEY not in out
    assert lab.ssh(f"stat -c '%a %U %G' {KEY_PATH}", check=True).stdout.split() == [
        "600", "root", "root"]
    assert lab.ssh(f"stat -c '%a %U %G' {MANIFEST}", check=True).stdout.split() == [
        "640", "root", "smg"]
    seen = lab.ssh(f"ps -eo args; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; "
                   f"cat {UNIT_PATH}; journalctl -u {UNIT} --no-pager -o cat; "
                   f"systemctl show {UNIT}", timeout=120).stdout
    assert "smg::router" in seen
    assert KEY not in seen


def test_unit_is_hardened(lab, first_run) -> None:
    props = lab.ssh(f"systemctl show -p User -p NoNewPrivileges -p ProtectSystem "
                    f"-p PrivateDevices -p CapabilityBoundingSet -p MemoryDenyWriteExecute "
                    f"{UNIT}", check=True).stdout
    assert "User=smg" in props and "NoNewPrivileges=yes" in props
    assert "ProtectSystem=strict" in props and "PrivateDevices=yes" in props
    assert "MemoryDenyWriteExecute=yes" in props and "CapabilityBoundingSet=\n" in props
    score = lab.ssh(f"systemd-analyze security {UNIT} --no-pager | tail -n 1",
                    timeout=120).stdout.strip()
    print(f"systemd-analyze security: {score}")
    value = float(score.split("exposure level for ")[1].split(": ")[1].split()[0])
    assert value <= 3.0, score


def test_rerun_reports_no_changes(lab, first_run) -> None:
    before = invocation(lab)
    t0 = time.monotonic()
    rc, out = router(lab)
    print(f"no-op gateway rerun: {time.monotonic() - t0:.1f} s")
    assert rc == 0, out[-4000:]
    assert no_changes(out), out[-4000:]
    assert invocation(lab) == before


def test_draining_the_worker_is_a_manifest_change_without_restart(lab, first_run) -> None:
    before = invocation(lab)
    rc, out = router(lab, "--data", "router_drain=true")
    assert rc == 0, out[-4000:]
    assert "every worker of group gpu is drained" in out
    assert json.loads(lab.ssh(f"cat {MANIFEST}", check=True).stdout)["workers"] == []
    states, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 60:
        found = workers(lab)
        states.append(found[0]["status"] if found else "gone")
        if not found:
            break
        time.sleep(1)
    assert states[-1] == "gone", states
    print(f"drained in {time.monotonic() - t0:.1f} s: {states}")
    assert invocation(lab) == before  # smg reread its manifest; no restart
    # back again: the same file change, and the worker is ready without a restart
    rc, out = router(lab)
    assert rc == 0 and "lab-gpu: router: 1/1 workers ready" in out, out[-4000:]
    assert invocation(lab) == before
