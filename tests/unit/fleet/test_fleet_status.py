"""``gpuserve fleet status INVENTORY``: a real inventory file, a real HTTP server on
127.0.0.1 replaying smg 1.13.0's recorded answers (tests/fixtures/smg/), and result
records written as the serve deploy writes them; no SSH (paramiko refuses) and no
connection anywhere but to the test's own server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import paramiko
import pyinfra_cli  # noqa: F401 - gevent's patch_all first, so the guard below stays
import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.fleet import status as st
from gpuserve.fleet.rolling import GatewayWorker
from gpuserve.measure.results import ResultRecord, write_record

REPO = Path(__file__).resolve().parents[3]
SMG = REPO / "tests" / "fixtures" / "smg"
KEY = "fleet-status-key-0123456789"
PORTS = range(31100, 31200)


# ------------------------------------------------------------------ the gateway


#: The gateway: a real http.server in a process of its own (pyinfra's CLI, which the
#: command imports, monkey-patches threads with gevent, so no server thread in this
#: one). Per request it reads its state file: the recorded answer to give (a file of
#: tests/fixtures/smg/, or raw bytes as hex), a delay; without the key it answers 401,
#: as smg does. It logs each request's path and Authorization header.
SERVER = r"""
import http.server, json, sys, time
from pathlib import Path
state_file, log_file, fixtures = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
key = sys.argv[4]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        state = json.loads(state_file.read_text())
        with log_file.open("a") as log:
            log.write(json.dumps({"path": self.path,
                                  "auth": self.headers.get("Authorization")}) + "\n")
        time.sleep(state["delay"])
        if self.headers.get("Authorization") != "Bearer " + key:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if state.get("redirect"):
            self.send_response(302)
            self.send_header("Location", state["redirect"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = (bytes.fromhex(state["raw"]) if state.get("raw") is not None
                else (fixtures / state["answer"]).read_bytes())
        self.send_response(200 if self.path == "/workers" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

for port in range(31100, 31200):
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        break
    except OSError:
        continue
else:
    sys.exit("no free port in 31100-31199")
server.handle_error = lambda request, address: None  # a client gone at its timeout
print(port, flush=True)
server.serve_forever()
"""


class Gateway:
    """The gateway process: ``answer`` (a fixture name) or ``raw`` (bytes), ``delay``."""

    def __init__(self, tmp: Path) -> None:
        self.state, self.log = tmp / "gateway-state.json", tmp / "gateway-log.jsonl"
        self.set(answer="workers-ready.json")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(self.state), str(self.log), str(SMG), KEY],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():  # pragma: no cover
            self.proc.kill()
            raise RuntimeError(f"test gateway did not start: {line!r}")
        self.port = int(line)

    def set(self, answer: str = "workers-ready.json", raw: bytes | None = None,
            delay: float = 0, redirect: str | None = None) -> None:
        self.state.write_text(json.dumps({"answer": answer, "delay": delay,
                                          "raw": None if raw is None else raw.hex(),
                                          "redirect": redirect}))

    @property
    def seen(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def gateway(tmp_path):
    gw = Gateway(tmp_path)
    yield gw
    gw.close()


@pytest.fixture(autouse=True)
def no_other_network(monkeypatch, tmp_path):
    """SSH refused; sockets only to 127.0.0.1:31100-31199 (the test's gateway)."""
    def refuse_ssh(*args, **kwargs):
        raise AssertionError(f"fleet status tried SSH: {args!r:.200}")

    real = socket.create_connection

    def only_ours(address, *args, **kwargs):
        host, port = address[:2]
        if host != "127.0.0.1" or port not in PORTS:
            raise AssertionError(f"fleet status connected to {address!r}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse_ssh)
    monkeypatch.setattr(socket, "create_connection", only_ours)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("HF_TOKEN", "SGLANG_API_KEY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


# ------------------------------------------------------------------ the inventory


def profile(tmp_path: Path, port: int) -> str:
    """The shipped baseline profile, served on ``port`` (the recorded workers' ports)."""
    path = tmp_path / f"glm5-port{port}.yaml"
    path.write_text(f"extends: {REPO / 'profiles' / 'glm5-nvfp4-tp8.yaml'}\n"
                    f"server:\n  port: {port}\n")
    return str(path)


def inventory(tmp_path: Path, port: int, *, router: dict | None = None,
              b: dict | None = None, extra: str = "") -> Path:
    """gw (router, ssh 127.0.0.1) in front of gpu-a (:32001) and gpu-b (:32002), the
    two workers of the recordings, plus solo, behind no gateway."""
    results = tmp_path / "results"
    workers = [
        ("gpu-a", {"profile": profile(tmp_path, 32001), "private_address": "127.0.0.1",
                   "results_dir": str(results)}),
        ("gpu-b", {"profile": profile(tmp_path, 32002), "private_address": "127.0.0.1",
                   "results_dir": str(results), **(b or {})}),
    ]
    gw = [("gw", {"ssh_hostname": "127.0.0.1", "router_workers_group": "gpu",
                  "router_api_key": KEY, "router_port": port, "results_dir": str(results),
                  **(router or {})})]
    solo = [("solo", {"ssh_hostname": "192.0.2.10", "profile": "glm5-nvfp4-tp8",
                      "results_dir": str(results)})]
    path = tmp_path / "inv" / "fleet.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"gpu = {workers!r}\nrouter = {gw!r}\nother = {solo!r}\n{extra}")
    return path


def record(tmp_path: Path, host: str, timestamp: str, tok_s: float, *, scenario="batch",
           profile_name="glm5-port32001", passed=True) -> Path:
    """A bench record written by the serve deploy's own writer."""
    rec = ResultRecord(kind="bench", profile=profile_name, host=host, timestamp=timestamp,
                       scenario=scenario, sglang_version="0.5.23",
                       figures={"output_throughput": tok_s, "max_concurrency": 64},
                       gate={"passed": passed, "misses": [], "checked": []})
    return write_record(tmp_path / "results", rec)


def status(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["fleet", "status", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert KEY not in out + err
    return rc, out, err


def row(out: str, host: str) -> str:
    return next(ln for ln in out.splitlines() if ln.split()[:1] == [host])


def as_json(capsys, *argv: str) -> tuple[int, dict]:
    rc, out, _ = status(capsys, *argv, "--json")
    return rc, json.loads(out)


# ------------------------------------------------------------------ the views


def test_both_ready_with_the_key_sent_as_bearer(gateway, tmp_path, capsys,
                                                monkeypatch) -> None:
    inv = inventory(tmp_path, gateway.port)
    # a proxy in the environment is not used (the key would go to it)
    proxy = next(p for p in PORTS if p != gateway.port)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    record(tmp_path, "gpu-a", "2026-11-30T10:00:00Z", 812.5)
    record(tmp_path, "gpu-a", "2026-12-01T02:16:41Z", 978.0)
    rc, out, err = status(capsys, str(inv))
    assert rc == 0, out + err
    a, b = row(out, "gpu-a"), row(out, "gpu-b")
    assert "glm5-port32001" in a and "0.5.23" in a and " ready " in a and "healthy" in a
    assert "978.0" in a and "2026-12-01T02:16:41Z batch c64" in a and "812.5" not in out
    assert " ready " in b and b.rstrip().endswith("-")  # no record: no last run
    assert "router of gpu" in row(out, "gw") and " answers " in row(out, "gw")
    assert "not behind a gateway" in row(out, "solo")
    assert f"gateway gw (group gpu) at http://127.0.0.1:{gateway.port}: 2 listed, 2 ready" \
        in out
    [request] = gateway.seen
    assert request == {"path": "/workers", "auth": f"Bearer {KEY}"}


def test_draining_then_removed_worker(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port, b={"router_drain": True})
    gateway.set("workers-draining.json")
    rc, doc = as_json(capsys, str(inv))
    assert rc == 0 and doc["ok"] is True
    hosts = {h["host"]: h for h in doc["hosts"]}
    [view] = hosts["gpu-b"]["gateway"]
    assert view == {"router": "gw", "view": "draining", "worker_url": "http://127.0.0.1:32002",
                    "status": "draining", "is_healthy": False, "router_drain": True,
                    "note": None}
    assert hosts["gpu-a"]["gateway"][0]["view"] == "ready"
    assert hosts["solo"]["gateway"][0]["view"] == "not_behind_gateway"
    assert doc["gateways"][0] | {"url": None} == {
        "router": "gw", "group": "gpu", "url": None, "overridden": False, "answered": True,
        "error": None, "listed": 2, "ready": 1, "unknown_workers": []}

    gateway.set("workers-removed.json")
    rc, out, _ = status(capsys, str(inv))
    assert rc == 0
    assert "not listed" in row(out, "gpu-b") and row(out, "gpu-b").split()[-1] == "-"
    assert "gpu-b: not listed: router_drain: left out of the manifest" in out


def test_worker_the_inventory_serves_but_the_gateway_lacks_says_why(gateway, tmp_path,
                                                                    capsys) -> None:
    gateway.set("workers-removed.json")  # gpu-b has no router_drain here
    rc, out, _ = status(capsys, str(inventory(tmp_path, gateway.port)))
    assert rc == 0
    assert "gpu-b: not listed: the gateway has not registered it" in out
    gateway.set("workers-draining.json")
    rc, out, _ = status(capsys, str(inventory(tmp_path, gateway.port)))
    assert "gpu-b: draining: the inventory serves it (router_drain unset)" in out


def test_gateway_workers_outside_the_group_are_named(gateway, tmp_path, capsys) -> None:
    # gpu-b leaves the group: the gateway still lists 127.0.0.1:32002
    inv = inventory(tmp_path, gateway.port)
    text = inv.read_text().replace("gpu = [", "gpu = [x for x in [").replace(
        "]\nrouter", "] if x[0] != 'gpu-b']\nrouter", 1)
    inv.write_text(text)
    rc, out, _ = status(capsys, str(inv))
    assert rc == 0
    assert "gateway gw lists http://127.0.0.1:32002, which is no host of group gpu" in out


def test_unhealthy_and_pending_states() -> None:
    # no recorded smg answer has these states (SOURCES.md): the view logic alone
    target = st.GatewayTarget("gw", "gpu", "http://x", (("a", "http://10.0.0.1:30000", False),
                                                        ("b", "http://10.0.0.2:30000", False),
                                                        ("c", "http://10.0.0.3:30000", False)),
                              ("a", "b", "c", "d"))
    workers = (GatewayWorker("http://10.0.0.1:30000", "ready", False),
               GatewayWorker("http://10.0.0.2:30000", "failed", False),
               GatewayWorker("http://10.0.0.3:30000", "pending", False))
    answer = st.GatewayAnswer(target, workers)
    assert [st.views_of(h, [answer])[0].view for h in "abcd"] == [
        "unhealthy", "unhealthy", "pending", "node_rank"]
    assert "smg status failed" in st.views_of("b", [answer])[0].note
    assert st.views_of("e", [answer])[0].view == "not_behind_gateway"


# ------------------------------------------------------------------ records


def test_last_run_is_the_newest_bench_record_and_names_another_profile(gateway, tmp_path,
                                                                        capsys) -> None:
    inv = inventory(tmp_path, gateway.port)
    record(tmp_path, "gpu-a", "2026-12-01T08:00:00Z", 70.1, profile_name="old-profile",
           passed=False)
    record(tmp_path, "gpu-a", "2026-11-01T08:00:00Z", 99.9)
    rc, doc = as_json(capsys, str(inv))
    assert rc == 0
    last = next(h for h in doc["hosts"] if h["host"] == "gpu-a")["last_run"]
    assert (last["output_tok_s"], last["profile"], last["gate"]) == (70.1, "old-profile",
                                                                     "fail")
    rc, out, _ = status(capsys, str(inv))
    assert "70.1" in row(out, "gpu-a")
    assert "batch c64 (profile old-profile) gate FAIL" in row(out, "gpu-a")


def test_record_with_control_characters_is_escaped(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port)
    record(tmp_path, "gpu-a", "2026-12-01T08:00:00Z", 50.0, scenario="b\x1b[2Jx")
    rc, out, _ = status(capsys, str(inv))
    assert rc == 0 and "\x1b" not in out and "b\\x1b[2Jx" in row(out, "gpu-a")


def test_unreadable_record_fails_that_host_only(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port)
    bad = tmp_path / "results" / "gpu-b" / "broken.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": "gpuserve.result/2", "kind": "bench"}\n')
    rc, out, _ = status(capsys, str(inv))
    assert rc == 1
    assert f"gpu-b: FAIL (records): {bad}:1: figures: must be an object" in out
    assert " ready " in row(out, "gpu-a")


# ------------------------------------------------------------------ gateway failures


def test_gateway_answering_garbage_names_the_url_and_field(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port)
    gateway.set("readiness-ready.json")  # a real smg answer, but not GET /workers
    rc, out, _ = status(capsys, str(inv))
    url = f"http://127.0.0.1:{gateway.port}/workers"
    assert rc == 1
    assert (f"gateway gw (group gpu): no usable answer: GET {url}: workers: not smg's "
            "GET /workers answer (no workers list)") in out
    assert "no answer" in row(out, "gpu-a") and "no answer" in row(out, "gpu-b")
    gateway.set(raw=b"<html>\x1b[31m not json")
    rc, out, _ = status(capsys, str(inv))
    assert rc == 1 and f"GET {url}:1: invalid JSON: Expecting value" in out and "\x1b" not in out


def test_wrong_key_is_a_refusal_that_never_prints_either_key(gateway, tmp_path,
                                                            capsys) -> None:
    other = "another-key-0123456789abcdef"
    inv = inventory(tmp_path, gateway.port, router={"router_api_key": other})
    rc, out, _ = status(capsys, str(inv))
    assert rc == 1 and other not in out
    assert "HTTP 401: the gateway refused the key (host gw's router_api_key" in out


def test_silent_gateway_times_out_quickly(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port)
    # the answer would come after 10 s (and say both ready): rc 1 and the message show
    # the client gave up at 0.5 s; no wall-clock bound on the whole command, which also
    # plans every host (seconds on a loaded machine)
    gateway.set(delay=10)
    rc, out, _ = status(capsys, str(inv), "--timeout", "0.5")
    assert rc == 1
    assert f"GET http://127.0.0.1:{gateway.port}/workers: no answer within 0.5 s" in out
    assert "--gateway URL to use another" in out
    assert row(out, "gw").split()[3:7] == ["router", "of", "gpu", "no"]


def test_redirect_is_not_followed_with_the_key(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port)
    gateway.set(redirect=f"http://127.0.0.1:{gateway.port}/elsewhere")
    rc, out, _ = status(capsys, str(inv))
    assert rc == 1 and "HTTP 302: a redirect, not followed (the key would go with it)" in out
    assert [s["path"] for s in gateway.seen] == ["/workers"]


def test_no_gateway_listening_then_gateway_override(gateway, tmp_path, capsys) -> None:
    closed = next(p for p in PORTS if p != gateway.port)
    inv = inventory(tmp_path, closed)
    rc, out, _ = status(capsys, str(inv))
    assert rc == 1 and "connection refused" in out
    rc, out, _ = status(capsys, str(inv), "--gateway", f"http://127.0.0.1:{gateway.port}/")
    assert rc == 0 and " ready " in row(out, "gpu-a")
    assert f"at http://127.0.0.1:{gateway.port}: 2 listed" in out
    rc, out, _ = status(capsys, str(inv), "--gateway", f"http://127.0.0.1:{gateway.port}/x")
    assert rc == 1 and f"GET http://127.0.0.1:{gateway.port}/x/workers: HTTP 404" in out
    assert "--gateway URL to use" not in out  # the user's own URL: no hint about the data


# ------------------------------------------------------------------ bad input (exit 2)


def test_unknown_inventory(capsys) -> None:
    rc, out, err = status(capsys, "no/such/inventory.py")
    assert rc == 2 and out == ""
    assert "gpuserve: error: no/such/inventory.py: no such inventory file" in err


def test_inventory_without_router_host(tmp_path, capsys) -> None:
    """No gateway (the lab's monitor inventory): every host not behind one, said once;
    --gateway has nothing to replace."""
    inv = tmp_path / "plain.py"
    inv.write_text("gpu = [('gpu1', {'profile': 'glm5-nvfp4-tp8', 'results_dir': None})]\n")
    rc, out, err = status(capsys, str(inv))
    assert rc == 0 and err == ""
    assert row(out, "gpu1").split()[:2] == ["gpu1", "glm5-nvfp4-tp8"]
    assert "not behind a gateway" in row(out, "gpu1")
    assert "no gateway in the inventory (no host sets router_workers_group)" in out
    rc, out, err = status(capsys, str(inv), "--gateway", "http://127.0.0.1:31100")
    assert rc == 2 and f"{inv}: router_workers_group: no host of this inventory sets it" in err


def test_router_host_data_the_gateway_deploy_refuses(tmp_path, capsys) -> None:
    inv = inventory(tmp_path, 31100, router={"router_api_key": "short"})
    rc, _, err = status(capsys, str(inv))
    assert rc == 2 and f"{inv}: router_api_key:" in err


def test_loopback_only_gateway_needs_gateway_flag(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port, router={"ssh_hostname": "192.0.2.7",
                                                    "router_listen_address": "127.0.0.1"})
    rc, _, err = status(capsys, str(inv))
    assert rc == 2
    assert (f"{inv}: router_listen_address (host gw): the gateway listens on 127.0.0.1 only"
            in err) and "pass --gateway URL" in err
    # through a tunnel (here: the test gateway itself)
    rc, out, _ = status(capsys, str(inv), "--gateway", f"http://127.0.0.1:{gateway.port}")
    assert rc == 0 and " ready " in row(out, "gpu-a")


@pytest.mark.parametrize(("argv", "field"), [
    (["--gateway", "http://user:pw@127.0.0.1:31100"], "--gateway"),
    (["--gateway", "ftp://127.0.0.1"], "--gateway"),
    (["--gateway", "http://[::1"], "--gateway"),
    (["--gateway", "http://a b:31100"], "--gateway"),
    (["--gateway", "http://127.0.0.1:99999"], "--gateway"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),
    (["--data", "novalue"], "novalue"),
])
def test_bad_arguments(tmp_path, capsys, argv, field) -> None:
    rc, out, err = status(capsys, str(inventory(tmp_path, 31100)), *argv)
    assert rc == 2 and out == "" and f": {field}: " in err
    assert "pw" not in err


def test_bad_ssh_hostname_of_router(tmp_path, capsys) -> None:
    inv = inventory(tmp_path, 31100, router={"ssh_hostname": "gw.example/evil"})
    rc, _, err = status(capsys, str(inv))
    assert rc == 2 and f"{inv}: ssh_hostname (host gw): 'gw.example/evil' is not" in err


def test_serve_data_error_fails_that_host_only(gateway, tmp_path, capsys) -> None:
    inv = inventory(tmp_path, gateway.port, extra=(
        "other = [('solo', {'profile': 'glm5-nvfp4-tp8', 'health_timeout': -1})]\n"))
    rc, out, _ = status(capsys, str(inv))
    assert rc == 1
    assert f"solo: FAIL (deploy checks): {inv}: health_timeout: must be a finite" in out
    assert " ready " in row(out, "gpu-a")


def test_gateway_url_choice() -> None:
    assert st.gateway_url("gw", {"ssh_hostname": "10.0.0.5"}, "0.0.0.0", 30080, "i") == \
        "http://10.0.0.5:30080"
    assert st.gateway_url("gw.lan", {}, "::", 30080, "i") == "http://gw.lan:30080"
    assert st.gateway_url("gw", {"ssh_hostname": "1.2.3.4"}, "10.0.0.9", 1, "i") == \
        "http://10.0.0.9:1"
    assert st.gateway_url("@local", {}, "127.0.0.1", 2, "i") == "http://127.0.0.1:2"
    assert st.gateway_url("gw", {"ssh_hostname": "fd00::1"}, "0.0.0.0", 3, "i") == \
        "http://[fd00::1]:3"
    with pytest.raises(InputError) as exc:
        st.gateway_url("@docker/abc", {}, "0.0.0.0", 3, "inv.py")
    assert exc.value.file == "inv.py" and "--gateway" in exc.value.message


def test_two_gateways_each_report_their_group_and_gateway_flag_is_refused(
        gateway, tmp_path, capsys) -> None:
    # a second router host for a group of its own (solo): both are asked
    inv = inventory(tmp_path, gateway.port, extra=(
        "other = [('solo', {'profile': 'glm5-nvfp4-tp8', 'private_address': '127.0.0.1',"
        f" 'results_dir': {str(tmp_path / 'results')!r}}})]\n"
        "router2 = [('gw2', {'ssh_hostname': '127.0.0.1', 'router_workers_group': 'other',"
        f" 'router_api_key': {KEY!r}, 'router_port': {gateway.port}}})]\n"))
    rc, out, _ = status(capsys, str(inv))
    assert rc == 0
    assert "router of other" in row(out, "gw2")
    # the recorded answer lists 32001/32002, not solo's 127.0.0.1:30000
    assert "not listed" in row(out, "solo")
    assert "gateway gw2 lists http://127.0.0.1:32001, which is no host of group other" in out
    assert [s["path"] for s in gateway.seen] == ["/workers", "/workers"]
    rc, _, err = status(capsys, str(inv), "--gateway", f"http://127.0.0.1:{gateway.port}")
    assert rc == 2 and "--gateway: the inventory has 2 router hosts (gw, gw2)" in err


def test_fleet_without_a_verb_is_usage(capsys) -> None:
    assert main(["fleet"]) == 2
    assert "status" in capsys.readouterr().out
