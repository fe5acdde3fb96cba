"""Three lab hosts behind SGLang's gateway: a rolling profile switch with a client
streaming requests through the gateway the whole time, one host out at a time
(``router_max_unavailable`` 1), never the last ready one.

The second and third hosts are clones of the session's served host (lab/fleet.py: a
point-in-time copy of its disk, booted as an instance of its own with its own SSH
port), joined to it by a private network (10.77.0.1-3). The gateway runs on the first
host (test_router.py installed it, and stopped it at its end); inventory/lab_fleet.py
lists every host as its workers.
The client runs on this machine against the gateway's port forwarded to 127.0.0.1, one
request at a time, bounded in count and time; every request must succeed.

Each switched host is judged by live traffic over 20 s against the hosts not switched
yet (inventory/lab_fleet.py): an equal profile goes on, a slower one is rolled back.
A profile whose launch fails the output-quality check (on for that switch only) is
rolled back on the first host, before it is back in the gateway, and the roll stops.

Runs last (conftest): it changes where the first host's server listens, and takes the
other instances down at the end.
"""

from __future__ import annotations

import http.client
import json
import re
import time

import pytest
from labhelpers import ENV_PATH, FLEET_HOSTS, ROUTER_KEY, Client, LabFleet, clean, linked_clones

FLEET_INVENTORY = "inventory/lab_fleet.py"
KEY = ROUTER_KEY
SWITCH_TO = "glm5-nvfp4-tp8-eagle3"
BACK_TO = "glm5-nvfp4-tp8"
SLOWER = "tests/fixtures/profiles/lab-slower-decode.yaml"  # SWITCH_TO, eager: 30 % slower
BROKEN = "tests/fixtures/profiles/lab-quality-broken.yaml"  # NaN logprobs from token 4
HOSTS = FLEET_HOSTS
URLS = {h: f"http://10.77.0.{i + 1}:30000" for i, h in enumerate(HOSTS)}


class Fleet(LabFleet):
    def pyinfra(self, *args: str, fail: str = "", check: bool = True):
        """pyinfra over the fleet inventory: ``args`` are its options and deploy (so
        ``--serial`` goes before the deploy, as on a user's command line)."""
        env = dict(self.env, GPUSERVE_LAB_FLEET_FAIL=fail) if fail else self.env
        deploy_at = next(i for i, a in enumerate(args) if a.startswith("deploy/"))
        r = self.lab.run_pyinfra(*args[deploy_at:], check=check, inventory=FLEET_INVENTORY,
                                 env=env) if deploy_at == 0 else self.lab.run_tool(
            "pyinfra", "-y", *args[:deploy_at], FLEET_INVENTORY, *args[deploy_at:], env=env,
            timeout=1800)
        if check and r.returncode != 0:
            raise AssertionError(f"pyinfra {' '.join(args)} failed ({r.returncode}):\n"
                                 + r.stdout[-6000:])
        r.stdout = clean(r.stdout)
        return r

    def profile(self, host: str) -> str:
        text = self.ssh(host, f"sed -n 's/^# Profile: //p' {ENV_PATH}")
        return text.strip().splitlines()[-1]

    def workers(self) -> dict[str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway_port, timeout=30)
        try:
            conn.request("GET", "/workers", headers={"Authorization": f"Bearer {KEY}"})
            doc = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        return {w["url"].rstrip("/"): w["status"] for w in doc["workers"]}

    def wait_ready(self, timeout: float = 120) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            seen = self.workers()
            if all(seen.get(u) == "ready" for u in URLS.values()) or time.monotonic() > deadline:
                return seen
            time.sleep(2)


@pytest.fixture(scope="module")
def fleet(lab):
    with linked_clones(lab) as (others, port):
        f = Fleet(lab, others, port)
        # Every server listens where its source's did (the clones like their source);
        # the gateway is installed but stopped (test_router.py's end). The serve deploy
        # moves them onto their private addresses one at a time: a stopped gateway routes
        # nothing, so each restarts undrained (a fleet's first deploy, before its
        # gateway exists, goes the same way); the router deploy then starts the gateway
        # with all of them.
        # On a fresh lab (this module alone) nothing serves yet: a first start, nothing
        # to drain either.
        served = lab.ssh("systemctl is-active gpuserve-sglang.service",
                         check=False).stdout.strip() == "active"
        r = f.pyinfra("--serial", "deploy/serve.py", "--data", "bench=off")
        for host in HOSTS if served else ():
            assert (f"{host}: gateway: gpuserve-router.service on {HOSTS[0]} is inactive: "
                    "no traffic through it to drain, switching") in r.stdout
        r = f.pyinfra("deploy/router.py")
        assert f"{len(HOSTS)}/{len(HOSTS)} workers ready" in r.stdout
        seen = f.wait_ready()
        assert all(seen.get(u) == "ready" for u in URLS.values()), seen
        yield f


def test_without_serial_a_fleet_switch_is_refused_before_any_change(fleet) -> None:
    before = {h: fleet.profile(h) for h in HOSTS}
    r = fleet.pyinfra("deploy/serve.py", "--data", f"profile={SWITCH_TO}", check=False)
    assert r.returncode != 0
    assert "--serial" in r.stdout and "nothing on any host was changed" in r.stdout
    assert {h: fleet.profile(h) for h in HOSTS} == before


def test_rolling_switch_fails_no_request(fleet) -> None:
    with Client(fleet.gateway_port) as client:
        time.sleep(3)  # traffic flows before the first host leaves
        r = fleet.pyinfra("--serial", "deploy/serve.py", "--data", f"profile={SWITCH_TO}",
                          "--data", "bench=off")
        time.sleep(3)
    assert client.failures == [], client.failures[:10]
    assert client.ok >= 20, client.ok
    out = r.stdout
    # one host at a time (max_unavailable 1): each is back in the gateway before the
    # next leaves it
    marks = []
    for h in HOSTS:
        marks += [out.index(f"{h}: gateway: out of"), out.index(f"{h}: gateway: back in")]
    assert marks == sorted(marks), marks
    # judged by the gateway's traffic against the hosts after it; the last one has none
    for h in HOSTS[:-1]:
        assert f"{h}: live traffic as good as the not-yet-switched hosts" in out, out[-4000:]
    assert f"{HOSTS[-1]}: the last worker of the roll" in out
    assert {h: fleet.profile(h) for h in HOSTS} == {h: SWITCH_TO for h in HOSTS}
    seen = fleet.wait_ready(30)
    assert all(seen.get(u) == "ready" for u in URLS.values()), seen
    # gpuserve fleet status: the gateway's view of both hosts (through the forwarded port)
    status = fleet.lab.run_tool("gpuserve", "fleet", "status", FLEET_INVENTORY, "--data",
                                f"profile={SWITCH_TO}", "--gateway",
                                f"http://127.0.0.1:{fleet.gateway_port}", "--json",
                                env=fleet.env)
    assert status.returncode == 0, status.stdout[-3000:]
    doc = json.loads(status.stdout[status.stdout.index("{"):])
    views = {h["host"]: [v["view"] for v in h["gateway"]] for h in doc["hosts"]}
    assert views == {h: ["ready"] for h in HOSTS}, views
    assert {h["host"]: h["profile"] for h in doc["hosts"]} == {h: SWITCH_TO for h in HOSTS}
    assert KEY not in status.stdout


def test_a_slower_profile_is_rolled_back_by_the_live_comparison_and_the_roll_stops(
        fleet) -> None:
    assert {h: fleet.profile(h) for h in HOSTS} == {h: SWITCH_TO for h in HOSTS}
    with Client(fleet.gateway_port) as client:
        time.sleep(3)
        r = fleet.pyinfra("--serial", "deploy/serve.py", "--data", f"profile={SLOWER}",
                          "--data", "bench=off", check=False)
        time.sleep(3)
    assert r.returncode != 0
    out = r.stdout
    assert client.failures == [], client.failures[:10]
    # SGLang's default ITL buckets: 20-25 ms on the switched host, 15-20 ms on the others
    assert ("rolling switch: live traffic: lab-gpu: ITL p99 25 ms against 20 ms on the "
            "not-yet-switched hosts (x1.25, limit x1.2)") in out, out[-4000:]
    assert (f"the host was rolled back to profile {SWITCH_TO}, which is healthy again"
            in out), out[-4000:]
    assert "gateway: lab-gpu is back in lab-gpu's list and ready" in out, out[-4000:]
    assert ("rolling switch: not switched: lab-gpu failed first behind the gateway on "
            "lab-gpu; lab-gpu-2 was not changed") in out
    assert "lab-gpu-3 was not changed and keeps its current profile" in out
    assert {h: fleet.profile(h) for h in HOSTS} == {h: SWITCH_TO for h in HOSTS}
    seen = fleet.wait_ready(60)
    assert all(seen.get(u) == "ready" for u in URLS.values()), seen


def test_a_quality_regressing_profile_stops_the_roll_at_its_first_host(fleet) -> None:
    # the canary: the check runs on the first host while it is out of the gateway (on for
    # this switch only: the fleet inventory turns it off), fails, the host is rolled back
    # and put back, and no other host is touched
    assert {h: fleet.profile(h) for h in HOSTS} == {h: SWITCH_TO for h in HOSTS}
    with Client(fleet.gateway_port) as client:
        time.sleep(3)
        r = fleet.pyinfra("--serial", "deploy/serve.py", "--data", f"profile={BROKEN}",
                          "--data", "bench=off", "--data", "quality_check=true", check=False)
        time.sleep(3)
    assert r.returncode != 0
    out = r.stdout
    assert client.failures == [], client.failures[:10]
    assert "quality: profile lab-quality-broken failed its quality check: " in out, \
        out[-4000:]
    assert re.search(r"non_finite_logprobs \d+ \(limit 0\)", out), out[-4000:]
    assert (f"the host was rolled back to profile {SWITCH_TO}, which is healthy again"
            in out), out[-4000:]
    assert "gateway: lab-gpu is back in lab-gpu's list and ready" in out, out[-4000:]
    assert ("rolling switch: not switched: lab-gpu failed first behind the gateway on "
            "lab-gpu; lab-gpu-2 was not changed") in out
    assert "lab-gpu-2: gateway: out of" not in out
    assert {h: fleet.profile(h) for h in HOSTS} == {h: SWITCH_TO for h in HOSTS}
    seen = fleet.wait_ready(60)
    assert all(seen.get(u) == "ready" for u in URLS.values()), seen


def test_second_host_failing_is_rolled_back_and_put_back_and_the_first_keeps_the_new_profile(
        fleet) -> None:
    assert {h: fleet.profile(h) for h in HOSTS} == {h: SWITCH_TO for h in HOSTS}
    with Client(fleet.gateway_port) as client:
        time.sleep(3)
        # rolling_live_window 0: no live judgement (the first host's is not the point here)
        r = fleet.pyinfra("--serial", "deploy/serve.py", "--data", f"profile={BACK_TO}",
                          "--data", "bench=off", "--data", "health_timeout=300",
                          "--data", "rolling_live_window=0", fail="lab-gpu-2=oom",
                          check=False)
        time.sleep(3)
    assert r.returncode != 0
    out = r.stdout
    assert client.failures == [], client.failures[:10]
    assert re.search(r"lab-gpu-2.*profile glm5-nvfp4-tp8 failed", out), out[-4000:]
    assert "by live traffic" not in out and "live:" not in out
    assert (f"the host was rolled back to profile {SWITCH_TO}, which is healthy again"
            in out), out[-4000:]
    assert "gateway: lab-gpu-2 is back in lab-gpu's list and ready" in out, out[-4000:]
    # the host after the failed one is not switched at all
    assert ("rolling switch: not switched: lab-gpu-2 failed first behind the gateway on "
            "lab-gpu; lab-gpu-3 was not changed and keeps its current profile") in out
    assert {h: fleet.profile(h) for h in HOSTS} == {"lab-gpu": BACK_TO,
                                                     "lab-gpu-2": SWITCH_TO,
                                                     "lab-gpu-3": SWITCH_TO}
    seen = fleet.wait_ready(60)
    assert all(seen.get(u) == "ready" for u in URLS.values()), seen


TWO_NODES = "tests/fixtures/profiles/two-nodes.yaml"  # glm5-nvfp4-tp8 as TP16 over 2 hosts


def test_multi_node_profile_starts_across_both_hosts_and_only_node_0_is_a_worker(
        fleet) -> None:
    # one engine over two hosts (the fleet's first two: inventory/lab_fleet.py's group
    # is the node group): they restart together (no --serial: node 0 waits for node 1),
    # and neither is a rolling switch (node 1 serves no HTTP, node 0 has no other
    # worker to take its requests)
    fleet = Fleet(fleet.lab, fleet.others[:1], fleet.gateway_port)
    r = fleet.pyinfra("deploy/serve.py", "--data", f"profile={TWO_NODES}", "--data",
                      "bench=off", "--data", "health_timeout=300")
    assert "take http" not in r.stdout
    # the server's arguments: $GPUSERVE_SGLANG_ARGS in the EnvironmentFile
    pair = HOSTS[:2]
    units = {h: fleet.ssh(h, f"grep ^GPUSERVE_SGLANG_ARGS= {ENV_PATH}") for h in pair}
    for rank, h in enumerate(pair):
        assert re.search(r"--nnodes['\s]+2\b", units[h]), units[h]
        # node 0 is SGLang's default rank: the rendered launch leaves it out
        ranked = re.search(r"--node-rank['\s]+(\d+)", units[h])
        assert (int(ranked.group(1)) if ranked else 0) == rank, units[h]
        assert "10.77.0.1:20000" in units[h]  # node 0's private address, the profile's port
        journal = fleet.ssh(h, "journalctl -u gpuserve-sglang -n 200 --no-pager -o cat")
        assert "multi-node: all 2 nodes joined" in journal, journal[-2000:]
    assert "multi-node: node 1 serves no HTTP" in fleet.ssh(
        HOSTS[1], "journalctl -u gpuserve-sglang -n 200 --no-pager -o cat")
    # the gateway's manifest, rendered from the same group, lists node 0 only
    fleet.pyinfra("deploy/router.py", "--data", f"profile={TWO_NODES}")
    deadline = time.monotonic() + 60
    while (seen := fleet.workers()) != {URLS["lab-gpu"]: "ready"} \
            and time.monotonic() < deadline:
        time.sleep(2)
    assert seen == {URLS["lab-gpu"]: "ready"}, seen
