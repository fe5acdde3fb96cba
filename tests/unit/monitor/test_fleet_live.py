"""``gpuserve fleet status`` with the monitor's Prometheus: the live columns from its
instant queries (a real HTTP server on loopback answering as Prometheus's API does),
the monitor group's address by default, and a broken answer named, never fatal."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from gpuserve.cli import main
from gpuserve.monitor.query import live_by_host, parse_vector

REPO = Path(__file__).resolve().parents[3]
KEY = "k" * 24
ANSWERS = {
    "gpuserve:gen_tokens_per_second:rate1m": [("gpu-a", "1234.5"), ("gpu-b", "NaN")],
    "gpuserve:running_reqs": [("gpu-a", "12"), ("gpu-b", "0")],
    "gpuserve:queue_reqs": [("gpu-a", "3"), ("gpu-b", "0")],
    "gpuserve:kv_usage:max": [("gpu-a", "0.42")],
    "gpuserve:ttft_seconds:p50_5m": [("gpu-a", "0.120")],
    "gpuserve:ttft_seconds:p99_5m": [("gpu-a", "0.950")],
    # PD figures: none of these hosts is a PD server
    "gpuserve:pd_queue_reqs": [],
    "gpuserve:kv_transfer_ms:p99_5m": [],
    "gpuserve:pd_bootstrap_failed:increase5m": [],
    "gpuserve:pd_transfer_failed:increase5m": [],
}


class _Prometheus(BaseHTTPRequestHandler):
    broken = False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = urlsplit(self.path)
        rule = parse_qs(parts.query).get("query", [""])[0]
        if parts.path != "/api/v1/query" or rule not in ANSWERS:
            self.send_error(400)
            return
        result = [{"metric": {"__name__": rule, "host": h, "profile": "p"},
                   "value": [1733360000.0, v]} for h, v in ANSWERS[rule]]
        body = b"{not json" if self.broken else json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    _Prometheus.broken = False


def _inventory(tmp_path: Path) -> Path:
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: {REPO / 'profiles' / 'glm5-nvfp4-tp8.yaml'}\n")
    workers = [(name, {"profile": str(profile), "private_address": f"127.0.0.{n}",
                       "listen_address": f"127.0.0.{n}",
                       "results_dir": str(tmp_path / "results")})
               for n, name in ((2, "gpu-a"), (3, "gpu-b"))]
    # the gateway is not running: its error is reported beside the live figures
    gw = [("gw", {"ssh_hostname": "127.0.0.1", "router_workers_group": "gpu",
                  "router_api_key": KEY, "router_port": 9})]
    path = tmp_path / "fleet.py"
    path.write_text(f"gpu = {workers!r}\nrouter = {gw!r}\n"
                    "monitor = [('mon', {'ssh_hostname': '192.0.2.7'})]\n")
    return path


def test_live_columns_come_from_the_monitors_rules(prometheus, tmp_path, capsys) -> None:
    url = f"http://127.0.0.1:{prometheus.server_address[1]}"
    main(["fleet", "status", str(_inventory(tmp_path)), "--prometheus", url,
          "--timeout", "2"])
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("gpu-a"))
    assert "1,234" in row or "1234" in row or "1 234" in row
    assert "12/3" in row and "42%" in row and "120/950 ms" in row
    row_b = next(ln for ln in out.splitlines() if ln.startswith("gpu-b"))
    assert "0/0" in row_b  # no traffic: NaN tok/s is no value, not a number
    assert f"live (from {url})" in out
    main(["fleet", "status", str(_inventory(tmp_path)), "--prometheus", url, "--json",
          "--timeout", "2"])
    doc = json.loads(capsys.readouterr().out)
    live = next(h for h in doc["hosts"] if h["host"] == "gpu-a")["live"]
    assert live["tok_s"] == 1234.5 and live["ttft_p99_s"] == 0.95
    assert doc["prometheus"] == {"url": url, "error": None}


def test_broken_answer_is_named_and_the_rest_still_shown(prometheus, tmp_path,
                                                        capsys) -> None:
    _Prometheus.broken = True
    url = f"http://127.0.0.1:{prometheus.server_address[1]}"
    main(["fleet", "status", str(_inventory(tmp_path)), "--prometheus", url,
          "--timeout", "2"])
    out = capsys.readouterr().out
    assert "live: no figures: GET " in out and "Traceback" not in out
    assert next(ln for ln in out.splitlines() if ln.startswith("gpu-a"))


def test_the_monitor_groups_address_is_the_default() -> None:
    from gpuserve.commands.fleet import prometheus_url
    from gpuserve.fleet.multinode import Member

    groups = {"monitor": [Member("mon", {"ssh_hostname": "192.0.2.7"})]}
    assert prometheus_url([], groups, "inv.py", None) == "http://192.0.2.7:9090"
    assert prometheus_url([], {}, "inv.py", None) is None


def test_vector_answers_are_checked() -> None:
    from gpuserve.errors import InputError

    with pytest.raises(InputError):
        parse_vector('{"status": "error", "error": "bad query"}', "GET x")
    with pytest.raises(InputError):
        parse_vector('{"status": "success", "data": {"resultType": "matrix", "result": []}}',
                     "GET x")
    two = parse_vector(json.dumps({"status": "success", "data": {
        "resultType": "vector", "result": [
            {"metric": {"host": "a"}, "value": [0, "1"]},
            {"metric": {"host": "a"}, "value": [0, "2"]},
            {"metric": {}, "value": [0, "5"]}]}}), "GET x")
    assert two == {"a": [1.0, 2.0]}
    figures = live_by_host({"tok_s": two, "kv_usage": {"a": [0.3, 0.9]}})["a"]
    assert figures.get("tok_s") == 3.0 and figures.get("kv_usage") == 0.9
