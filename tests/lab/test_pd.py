"""A PD fleet in the lab: one prefill host, one decode host, SGLang's gateway (the real
smg 1.13.0) in PD mode on the first, all from inventory/lab_pd.py.

The decode host is a clone of the session's served host (lab/fleet.py), joined to it by
the lab's private network (10.77.0.1-2). Both run the SGLang stand-in in its PD role
(lab/sglang_standin, pd.py): the prefill's bootstrap server answers SGLang's routes and
the KV bytes move over the stand-in's own TCP transfer (not Mooncake, not RDMA: the lab
records no RDMA device, so the launch falls back to mooncake_tcp, warned). SGLang's
benchmark client (the stand-in of sglang.benchmark.serving) runs on the first host
against the gateway: every request must be answered, and each one's KV hand-off is in
the decode server's journal.

What this cannot show: InfiniBand, GPUDirect RDMA, KV transfer at GPU speed
(docs/disaggregation.md).
"""

from __future__ import annotations

import http.client
import json
import re

import pytest
from labhelpers import ENV_PATH, clean, unit_venv

from lab.locks import locks_dir

PD_INVENTORY = "inventory/lab_pd.py"
KEY = "lab-router-key-not-a-secret-0001"  # inventory/lab.py: the lab's own, not a secret
HOSTS = ("lab-gpu", "lab-gpu-2")
URLS = {h: f"http://10.77.0.{i + 1}:30000" for i, h in enumerate(HOSTS)}
PROMPTS = 24


class PdFleet:
    def __init__(self, lab, other: str, gateway_port: int):
        self.lab, self.other, self.gateway_port = lab, other, gateway_port
        self.env = dict(lab.env, GPUSERVE_LAB_FLEET=f"{lab.name},{other}")

    def pyinfra(self, deploy: str, *data: str, serial: bool = False, check: bool = True):
        """pyinfra over the PD inventory (``--serial`` before it, ``data`` after)."""
        r = self.lab.run_tool("pyinfra", "-y", *(["--serial"] if serial else []),
                              PD_INVENTORY, deploy, *data, env=self.env, timeout=1800)
        if check and r.returncode != 0:
            raise AssertionError(f"pyinfra {deploy} {' '.join(data)} failed ({r.returncode}):\n"
                                 + r.stdout[-6000:])
        r.stdout = clean(r.stdout)
        return r

    def ssh(self, host: str, cmd: str, check: bool = True) -> str:
        if host == HOSTS[0]:
            return self.lab.ssh(cmd, check=check).stdout
        return self.lab.lab_cli("ssh", "--name", self.other, "--", cmd, check=check,
                                timeout=120).stdout

    def workers(self) -> list[dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway_port, timeout=30)
        try:
            conn.request("GET", "/workers", headers={"Authorization": f"Bearer {KEY}"})
            return json.loads(conn.getresponse().read())["workers"]
        finally:
            conn.close()


@pytest.fixture(scope="module")
def pd_fleet(lab):
    other = f"{lab.name}-2"
    try:
        lab.lab_cli("up", "--name", other, "--clone-from", lab.name, timeout=900)
        lab.lab_cli("link", lab.name, other)
        port = int(lab.lab_cli("forward", "--name", lab.name, "30080")
                   .stdout.strip().splitlines()[-1])
        fleet = PdFleet(lab, other, port)
        fleet.serve = fleet.pyinfra("deploy/serve.py", "--data", "bench=off", serial=True)
        yield fleet
    finally:
        lab.lab_cli("down", "--name", other, check=False)
        lab.lab_cli("unlink", "--name", lab.name, check=False)


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
    assert "PD prefill (1 prefill : 1 decode), mooncake_tcp" in ok.stdout


def test_the_pd_fleet_answers_every_bench_request_through_the_gateway(pd_fleet) -> None:
    out = pd_fleet.serve.stdout
    # no RDMA device recorded in the lab: the TCP fallback, warned with its cost
    assert "PD prefill: no /etc/gpuserve/host.json" in out or "TCP fallback" in out, \
        out[-4000:]
    for host, role in zip(HOSTS, ("prefill", "decode"), strict=True):
        args = pd_fleet.ssh(host, f"grep ^GPUSERVE_SGLANG_ARGS= {ENV_PATH}")
        assert re.search(rf"--disaggregation-mode['\s]+{role}\b", args), args
        assert re.search(r"--disaggregation-transfer-backend['\s]+mooncake_tcp\b", args), args
        assert ("--disaggregation-bootstrap-port" in args) == (role == "prefill"), args
    r = pd_fleet.pyinfra("deploy/router.py")
    assert "2/2 workers ready" in r.stdout, r.stdout[-4000:]
    types = {w["url"].rstrip("/"): w.get("worker_type") for w in pd_fleet.workers()}
    assert types == {URLS["lab-gpu"]: "prefill", URLS["lab-gpu-2"]: "decode"}, types
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
    journal = pd_fleet.ssh(HOSTS[1], "journalctl -u gpuserve-sglang --no-pager -o cat")
    handed = re.findall(r"PD decode: room \d+: (\d+) KV bytes from 10\.77\.0\.1:\d+ "
                        r"\(bootstrap 10\.77\.0\.1:8998; stand-in TCP transfer", journal)
    # every request of the run (the client's warmup too) got its KV cache from the prefill
    assert len(handed) >= PROMPTS, journal[-3000:]
