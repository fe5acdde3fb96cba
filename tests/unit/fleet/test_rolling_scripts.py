"""The host scripts of a rolling switch, run for real against local HTTP servers.

- ``smg_probe.py --url U --until gone|ready``: the router host's wait for one worker to
  leave the gateway or be ready in it, fed smg 1.13.0's own ``GET /workers`` answers
  (tests/fixtures/smg/, recorded: SOURCES.md) in the order smg gave them when a worker
  left its discovery file: ready, draining, removed.
- ``sglang_idle.py``: the worker's wait for its engine to have nothing in flight, from
  ``GET /v1/loads`` (the shape is COMPOSED: field names as smg's poller reads SGLang's
  load report; see lab/sglang_standin server.py) or else ``GET /metrics`` (the lab
  stand-in's Prometheus text, SGLang's metric names).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuserve.paths import SCRIPTS_DIR

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "smg"
KEY = "rolling-test-key-0123456789"
GONE = "http://127.0.0.1:32002"
STAYS = "http://127.0.0.1:32001"


class Replay:
    """A server answering GET paths from ``routes`` (path -> callable giving (status,
    body)); records the Authorization headers it saw."""

    def __init__(self, routes: dict[str, Callable[[], tuple[int, bytes]]]):
        self.routes, self.auth = routes, []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                replay.auth.append(self.headers.get("Authorization"))
                route = replay.routes.get(self.path.split("?")[0])
                status, body = route() if route else (404, b'{"detail":"Not Found"}')
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sequence(*bodies: bytes) -> Callable[[], tuple[int, bytes]]:
    """Answer the bodies in order, then the last one for ever."""
    left = list(bodies)

    def answer() -> tuple[int, bytes]:
        return 200, (left.pop(0) if len(left) > 1 else left[0])

    return answer


def run(script: str, *args: str, timeout: float = 60) -> dict:
    r = subprocess.run([sys.executable, str(SCRIPTS_DIR / script), *args],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    return path


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def probe(port: int, key_file: Path, url: str, until: str, timeout: float = 20) -> dict:
    return run("smg_probe.py", "--port", str(port), "--key-file", str(key_file),
               "--live-timeout", "5", "--ready-timeout", str(timeout), "--url", url,
               "--until", until)


def test_smg_probe_waits_through_draining_until_the_worker_is_gone(key_file: Path) -> None:
    workers = sequence(fixture("workers-ready.json"), fixture("workers-draining.json"),
                       fixture("workers-removed.json"))
    server = Replay({"/liveness": lambda: (200, b"OK"), "/workers": workers})
    try:
        result = probe(server.port, key_file, GONE, "gone")
    finally:
        server.close()
    assert result["live"] and result["reached"] and result["error"] is None
    assert [w["url"] for w in result["workers"]] == [STAYS]
    assert f"Bearer {KEY}" in server.auth  # the key from the file, sent as smg wants it
    assert KEY not in json.dumps(result)


def test_smg_probe_ready_is_ready_and_healthy_not_draining(key_file: Path) -> None:
    server = Replay({"/liveness": lambda: (200, b"OK"),
                     "/workers": sequence(fixture("workers-draining.json"),
                                          fixture("workers-ready.json"))})
    try:
        back = probe(server.port, key_file, GONE, "ready")
        stays = probe(server.port, key_file, STAYS, "ready")
    finally:
        server.close()
    assert back["reached"] and stays["reached"]
    # a draining worker (status draining, is_healthy false) is not "ready"
    server = Replay({"/liveness": lambda: (200, b"OK"),
                     "/workers": sequence(fixture("workers-draining.json"))})
    try:
        still = probe(server.port, key_file, GONE, "ready", timeout=2)
        gone = probe(server.port, key_file, GONE, "gone", timeout=2)
    finally:
        server.close()
    assert still["reached"] is False and gone["reached"] is False


def test_smg_probe_reports_a_refused_key(key_file: Path) -> None:
    server = Replay({"/liveness": lambda: (200, b"OK"),
                     "/workers": lambda: (401, b'{"error":"Unauthorized"}')})
    try:
        result = probe(server.port, key_file, GONE, "gone", timeout=1)
    finally:
        server.close()
    assert result["reached"] is False and "HTTP 401" in result["error"]


def loads(*counts: int) -> Callable[[], tuple[int, bytes]]:
    return sequence(*(json.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": n,
                                             "num_waiting_reqs": 0}]}).encode()
                      for n in counts))


def idle(port: int, tmp_path: Path, timeout: float = 20) -> dict:
    config = tmp_path / "sglang-secrets.yaml"
    config.write_text(f'api-key: "{KEY}"\n')
    return run("sglang_idle.py", "--port", str(port), "--config", str(config),
               "--timeout", str(timeout), "--interval", "0.05")


def test_idle_waits_until_nothing_runs(tmp_path: Path) -> None:
    server = Replay({"/v1/loads": loads(3, 2, 1, 0)})
    try:
        result = idle(server.port, tmp_path)
    finally:
        server.close()
    assert result == {**result, "idle": True, "in_flight": 0, "source": "/v1/loads",
                      "error": None}
    assert server.auth.count(f"Bearer {KEY}") == 4  # /v1/loads is an admin route: the key


def metrics(running: int) -> bytes:
    """COMPOSED Prometheus text with SGLang's gauge names and labels
    (srt/observability/metrics_collector.py, as the lab stand-in renders them)."""
    labels = ('engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",'
              'tp_rank="0"')
    return (f"# HELP sglang:num_running_reqs The number of running requests.\n"
            f"# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{labels}}} {float(running)}\n"
            f"# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{{{labels}}} 0.0\n").encode()


def test_idle_falls_back_to_metrics(tmp_path: Path) -> None:
    server = Replay({"/metrics": sequence(metrics(2), metrics(0))})
    try:
        result = idle(server.port, tmp_path)
    finally:
        server.close()
    assert result["idle"] and result["source"] == "/metrics" and result["in_flight"] == 0


def test_idle_without_any_load_report_says_so(tmp_path: Path) -> None:
    server = Replay({})
    try:
        result = idle(server.port, tmp_path)
    finally:
        server.close()
    assert result["idle"] is False and result["source"] is None
    assert "neither GET /v1/loads nor GET /metrics" in result["error"]


def test_idle_gives_up_after_its_timeout(tmp_path: Path) -> None:
    server = Replay({"/v1/loads": loads(1)})
    try:
        result = idle(server.port, tmp_path, timeout=0.5)
    finally:
        server.close()
    assert result["idle"] is False and result["in_flight"] == 1
    assert "1 request(s) still in flight" in result["error"]


@pytest.mark.parametrize("body", [
    b'{"loads": [{"num_running_reqs": -1}]}', b'{"loads": [{"num_running_reqs": true}]}',
    b'{"loads": {}}', b"[]", b"not json"])
def test_idle_never_reads_a_malformed_load_report_as_idle(tmp_path: Path, body: bytes) -> None:
    server = Replay({"/v1/loads": lambda: (200, body)})
    try:
        result = idle(server.port, tmp_path)
    finally:
        server.close()
    assert result["idle"] is False
