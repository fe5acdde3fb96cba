"""A PD fleet in the lab: one prefill host, two decode hosts, SGLang's gateway (the real
smg 1.13.0) in PD mode on the first, all from inventory/lab_pd.py.

The decode hosts are clones of the session's served host (lab/fleet.py), joined to it by
the lab's private network (10.77.0.1-3). Two decode hosts and one prefill host, not two
of each: the smallest fleet in which a rolling switch keeps a prefill and a decode
server serving. The switch changes the decode role's launch only
(tests/fixtures/profiles/lab-pd-decode-64.yaml), so the decode hosts roll one at a time
while the prefill host is left as it is; a fourth instance (a second prefill, for a
switch of the prefill role too) would add its clone and first deploy to CI's time and
show nothing the per-role counting (unit-tested) does not.

All run the SGLang stand-in in its PD role (lab/sglang_standin, pd.py): the prefill's
bootstrap server answers SGLang's routes and the KV bytes move over the stand-in's own
TCP transfer (not Mooncake, not RDMA: the lab records no RDMA device, so the launch
falls back to mooncake_tcp, warned). SGLang's benchmark client (the stand-in of
sglang.benchmark.serving) runs on the first host against the gateway: every request must
be answered, and each one's KV hand-off is in a decode server's journal. Then a rolling
switch of the decode role (``--serial``) under a bounded stream of requests through the
gateway: no request fails, each decode host ends on the new launch, the prefill server
is not restarted.

What this cannot show: InfiniBand, GPUDirect RDMA, KV transfer at GPU speed
(docs/disaggregation.md).
"""

from __future__ import annotations

import http.client
import json
import re
import time

import pytest
from labhelpers import (
    ENV_PATH,
    FLEET_HOSTS,
    GENERATE,
    ROUTER_KEY,
    Client,
    LabFleet,
    clean,
    linked_clones,
    unit_venv,
)

from lab.locks import locks_dir

PD_INVENTORY = "inventory/lab_pd.py"
KEY = ROUTER_KEY
HOSTS = FLEET_HOSTS
ROLES = dict(zip(HOSTS, ("prefill", "decode", "decode"), strict=True))
URLS = {h: f"http://10.77.0.{i + 1}:30000" for i, h in enumerate(HOSTS)}
PROMPTS = 24
DECODE_64 = "tests/fixtures/profiles/lab-pd-decode-64.yaml"  # the decode role's change


class PdFleet(LabFleet):
    def pyinfra(self, deploy: str, *data: str, serial: bool = False, check: bool = True,
                env: dict | None = None):
        """pyinfra over the PD inventory (``--serial`` before it, ``data`` after)."""
        r = self.lab.run_tool("pyinfra", "-y", *(["--serial"] if serial else []),
                              PD_INVENTORY, deploy, *data, env={**self.env, **(env or {})},
                              timeout=1800)
        if check and r.returncode != 0:
            raise AssertionError(f"pyinfra {deploy} {' '.join(data)} failed ({r.returncode}):\n"
                                 + r.stdout[-6000:])
        r.stdout = clean(r.stdout)
        return r

    def args(self, host: str) -> str:
        return self.ssh(host, f"grep ^GPUSERVE_SGLANG_ARGS= {ENV_PATH}")

    def main_pid(self, host: str) -> str:
        return self.ssh(host, "systemctl show -p MainPID --value gpuserve-sglang").strip()

    def workers(self) -> list[dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway_port, timeout=30)
        try:
            conn.request("GET", "/workers", headers={"Authorization": f"Bearer {KEY}"})
            return json.loads(conn.getresponse().read())["workers"]
        finally:
            conn.close()


@pytest.fixture(scope="module")
def pd_fleet(lab):
    with linked_clones(lab) as (others, port):
        fleet = PdFleet(lab, others, port)
        fleet.serve = fleet.pyinfra("deploy/serve.py", "--data", "bench=off", serial=True)
        fleet.router = fleet.pyinfra("deploy/router.py")
        yield fleet


def test_check_refuses_a_lock_without_the_transfer_engine_before_connecting(
        pd_fleet) -> None:
    # the lab's regular locks (lab/locks.py) pin no transfer engine
    regular = locks_dir(pd_fleet.lab.state.mirror_root)
    r = pd_fleet.lab.run_tool("gpuserve", "check", PD_INVENTORY, "--deploy", "serve",
                              "--data", f"sglang_locks_dir={regular}", env=pd_fleet.env)
    assert r.returncode == 1, r.stdout[-3000:]
    assert "missing from the lock" in r.stdout and "no host was connected to" in r.stdout
    ok = pd_fleet.lab.run_tool("gpuserve", "check", PD_INVENTORY, "--deploy", "serve",
                               env=pd_fleet.env)
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert "PD prefill (1 prefill : 2 decode), mooncake_tcp" in ok.stdout


def test_the_pd_fleet_answers_every_bench_request_through_the_gateway(pd_fleet) -> None:
    out = pd_fleet.serve.stdout
    # no RDMA device recorded in the lab: the TCP fallback, warned with its cost
    assert "PD prefill: no /etc/gpuserve/host.json" in out or "TCP fallback" in out, \
        out[-4000:]
    for host, role in ROLES.items():
        args = pd_fleet.args(host)
        assert re.search(rf"--disaggregation-mode['\s]+{role}\b", args), args
        assert re.search(r"--disaggregation-transfer-backend['\s]+mooncake_tcp\b", args), args
        assert ("--disaggregation-bootstrap-port" in args) == (role == "prefill"), args
    assert "3/3 workers ready" in pd_fleet.router.stdout, pd_fleet.router.stdout[-4000:]
    types = {w["url"].rstrip("/"): w.get("worker_type") for w in pd_fleet.workers()}
    assert types == {URLS[h]: role for h, role in ROLES.items()}, types
    venv = unit_venv(pd_fleet.lab)
    # the native backend (streaming /generate): smg refuses the OpenAI backend's
    # best_of with stream ("best_of is not supported when stream is enabled"), and its
    # gateway mode wants the model named in a /generate body
    bench = pd_fleet.ssh(HOSTS[0], (
        f"OPENAI_API_KEY={KEY} {venv}/bin/python -m sglang.benchmark.serving "
        "--backend sglang --host 127.0.0.1 --port 30080 --model glm-5 "
        "--tokenizer /models/GLM-5-NVFP4 --dataset-name random-ids --random-input-len 32 "
        f"--random-output-len 8 --random-range-ratio 1.0 --num-prompts {PROMPTS} "
        "--max-concurrency 4 --extra-request-body '{\"model\": \"glm-5\"}' "
        "--output-file /tmp/pd-bench.jsonl && "
        "tail -n 1 /tmp/pd-bench.jsonl"))
    result = json.loads(bench.strip().splitlines()[-1])
    assert result["completed"] == PROMPTS, bench[-3000:]
    journal = "".join(pd_fleet.ssh(h, "journalctl -u gpuserve-sglang --no-pager -o cat")
                      for h in HOSTS[1:])
    handed = re.findall(r"PD decode: room \d+: (\d+) KV bytes from 10\.77\.0\.1:\d+ "
                        r"\(bootstrap 10\.77\.0\.1:8998; stand-in TCP transfer", journal)
    # every request of the run (the client's warmup too) got its KV cache from the prefill
    assert len(handed) >= PROMPTS, journal[-3000:]


def test_a_rolling_switch_of_the_decode_role_fails_no_request(pd_fleet) -> None:
    prefill_pid, prefill_args = pd_fleet.main_pid(HOSTS[0]), pd_fleet.args(HOSTS[0])
    with Client(pd_fleet.gateway_port, GENERATE) as client:
        time.sleep(3)  # traffic flows before the first decode host leaves
        t0 = time.monotonic()
        r = pd_fleet.pyinfra("deploy/serve.py", "--data", "bench=off", serial=True,
                             env={"GPUSERVE_LAB_PD_DECODE_PROFILE": DECODE_64})
        took = time.monotonic() - t0
        time.sleep(3)
    print(f"PD rolling switch: {client.ok} requests answered, {len(client.failures)} "
          f"failed, the switch took {took:.0f} s")
    assert client.failures == [], client.failures[:10]
    assert client.ok >= 20, client.ok
    out = r.stdout
    # one decode host at a time: each back in the gateway before the other leaves it
    marks = []
    for h in HOSTS[1:]:
        marks += [out.index(f"{h}: gateway: out of"), out.index(f"{h}: gateway: back in")]
    assert marks == sorted(marks), marks
    # the prefill host's launch did not change: not taken out, not restarted
    assert f"{HOSTS[0]}: gateway:" not in out and "restarts without a drain" not in out
    assert pd_fleet.main_pid(HOSTS[0]) == prefill_pid and pd_fleet.args(HOSTS[0]) == prefill_args
    for h in HOSTS[1:]:
        assert re.search(r"--max-running-requests['\s]+64\b", pd_fleet.args(h)), h
    seen = {w["url"].rstrip("/"): w["status"] for w in pd_fleet.workers()}
    assert seen == {u: "ready" for u in URLS.values()}, seen
