"""The host scripts' HTTP client (sglang_probe.http_request), which replaced urllib to
save half a second of every probe and smoke on the lab host: run against a real local
HTTP server (http.server, loopback only) answering with Content-Length, chunked
encoding, an error status and no answer at all, and the smoke script end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuserve.paths import SCRIPTS_DIR

sys.path.insert(0, str(SCRIPTS_DIR))
import sglang_probe  # noqa: E402


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status, body, chunked=False):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 7):
                part = body[i:i + 7]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/chunked":
            self._send(200, json.dumps({"text": "x" * 40}).encode(), chunked=True)
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, b"late")
        elif self.path == "/slower":  # over the 5 s a waiting probe's later requests get
            time.sleep(6)
            self._send(200, b"")
        else:
            self._send(503, b'{"error": "loading"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Handler.seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                             "body": json.loads(body)})
        self._send(200, json.dumps({"choices": [{"text": " Paris"}],
                                    "usage": {"completion_tokens": 64}}).encode())


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()


def test_status_and_body_with_content_length_and_chunked(server) -> None:
    assert sglang_probe.http_request("127.0.0.1", server, "/health", 5) == (200, b"")
    status, body = sglang_probe.http_request("127.0.0.1", server, "/chunked", 5)
    assert status == 200 and json.loads(body) == {"text": "x" * 40}
    assert sglang_probe.http_status(server, "/other", 5) == (503, None)


def test_timeout_bounds_the_whole_exchange(server) -> None:
    t0 = time.monotonic()
    status, error = sglang_probe.http_status(server, "/slow", 0.5)
    assert status is None and "timed out" in error.lower()
    assert time.monotonic() - t0 < 2


def test_nothing_listening_is_an_error_not_a_traceback() -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    status, error = sglang_probe.http_status(port, "/health", 2)
    assert status is None and error.startswith("ConnectionRefusedError")


def test_smoke_script_posts_the_completion_with_the_key(server, tmp_path) -> None:
    config = tmp_path / "sglang-secrets.yaml"
    config.write_text('api-key: "sk-smoke-0123456789abcdef"\n')
    out = subprocess.run(
        [sys.executable, str(SCRIPTS_DIR / "sglang_smoke.py"), "--port", str(server),
         "--model", "glm-5", "--max-tokens", "8", "--config", str(config)],
        capture_output=True, text=True, timeout=30, check=True)
    doc = json.loads(out.stdout)
    assert doc["status"] == 200 and doc["body"]["choices"][0]["text"] == " Paris"
    seen = Handler.seen[-1]
    assert seen["path"] == "/v1/completions"
    assert seen["auth"] == "Bearer sk-smoke-0123456789abcdef"
    assert seen["body"]["max_tokens"] == 8 and seen["body"]["ignore_eos"] is True


def _fake_systemctl(tmp_path, active: str, invocation: str = "") -> dict:
    """PATH with a ``systemctl`` that answers ``show`` the way systemd does (the probe's
    only other command on a healthy server)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "systemctl"
    tool.write_text(f"#!/bin/sh\nprintf 'ActiveState={active}\\nSubState=running\\n"
                    f"NRestarts=0\\nInvocationID={invocation}\\n'\n")
    tool.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def _probe(server, env, *extra) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(SCRIPTS_DIR / "sglang_probe.py"), "--unit", "x.service",
         "--port", str(server), *extra], capture_output=True, text=True, timeout=30,
        env=env, check=True)
    return out.stdout.splitlines()


def test_a_healthy_probe_makes_the_smoke_completion_too(server, tmp_path) -> None:
    """The gate's probe and the smoke in one command and one Python start."""
    config = tmp_path / "sglang-secrets.yaml"
    config.write_text('api-key: "sk-smoke-0123456789abcdef"\n')
    lines = _probe(server, _fake_systemctl(tmp_path, "active"), "--smoke-model", "glm-5",
                   "--smoke-max-tokens", "16", "--smoke-config", str(config))
    assert len(lines) == 2
    assert json.loads(lines[0])["health"] == 200
    smoke = json.loads(lines[1])
    assert smoke["status"] == 200 and smoke["body"]["usage"]["completion_tokens"] == 64
    seen = Handler.seen[-1]
    assert seen["auth"] == "Bearer sk-smoke-0123456789abcdef"
    assert seen["body"]["max_tokens"] == 16 and seen["body"]["model"] == "glm-5"


START = "4f6e0c2b9d5a4e7f8a1b3c5d7e9f0a12"  # systemd's InvocationID: 32 hex digits


def test_a_smoke_line_names_the_unit_start_it_measured(server, tmp_path) -> None:
    lines = _probe(server, _fake_systemctl(tmp_path, "active", START), "--smoke-model",
                   "glm-5", "--smoke-unless-start", "0" * 32)
    assert json.loads(lines[1])["start"] == START
    assert json.loads(lines[1])["status"] == 200


def test_the_start_already_smoked_gets_no_second_completion(server, tmp_path) -> None:
    """The controller's newest smoke record measured this start: the probe's /health
    (a one-token generation on SGLang) is the proof, and no completion is sent."""
    before = len(Handler.seen)
    lines = _probe(server, _fake_systemctl(tmp_path, "active", START), "--smoke-model",
                   "glm-5", "--smoke-unless-start", START)
    assert json.loads(lines[0])["health"] == 200
    assert json.loads(lines[1]) == {"same_start": START}
    assert len(Handler.seen) == before


@pytest.mark.parametrize("active, path", [("active", "/other"), ("failed", "/health")])
def test_an_unhealthy_probe_makes_no_completion(server, tmp_path, active, path) -> None:
    """No completion against a server that is not healthy (503) or a unit that is not
    active: the probe prints its one line and the smoke check decides on its own."""
    before = len(Handler.seen)
    lines = _probe(server, _fake_systemctl(tmp_path, active), "--path", path,
                   "--smoke-model", "glm-5")
    assert len(lines) == 1 and json.loads(lines[0])["unit"]["ActiveState"] == active
    assert len(Handler.seen) == before


def test_a_smoke_that_raises_is_a_smoke_error_not_a_failed_probe(server, tmp_path) -> None:
    """Review: an exception in the completion (here a key line that is not valid JSON)
    must reach the smoke check as its error; the probe itself still answers, exit 0."""
    config = tmp_path / "sglang-secrets.yaml"
    config.write_text('api-key: "unterminated\n')
    lines = _probe(server, _fake_systemctl(tmp_path, "active"), "--smoke-model", "glm-5",
                   "--smoke-config", str(config))
    assert json.loads(lines[0])["health"] == 200
    smoke = json.loads(lines[1])
    assert smoke["status"] is None and smoke["error"].startswith("JSONDecodeError")


def test_a_waiting_probe_tells_a_restart_it_saw(server, tmp_path) -> None:
    """The gate's first probe waits on the host; when systemd restarts the server during
    that wait, the probe ends it and says how many restarts there were when it began,
    so the gate's baseline is taken before the restart and the start attempt is failed,
    never silently accepted as the new normal."""
    from gpuserve.measure.health import Verdict, decide, parse_probe

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "calls"
    tool = bin_dir / "systemctl"
    # the first `show` says 0 restarts, every later one 1 (systemd restarted the server)
    tool.write_text(f"#!/bin/sh\nif [ -e {count} ]; then n=1; else n=0; touch {count}; fi\n"
                    "printf 'ActiveState=activating\\nSubState=start\\n"
                    "NRestarts=%s\\nInvocationID=\\n' \"$n\"\n")
    tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    lines = _probe(server, env, "--path", "/other", "--wait", "20")
    probe = parse_probe(lines[0])
    assert (probe.restarts_before, probe.n_restarts) == (0, 1)
    assert decide(probe, 1.0, 60.0, probe.restarts_before).verdict is Verdict.FAILED


def test_a_waiting_probe_gives_its_first_request_the_whole_http_timeout(server, tmp_path):
    """The gate's first probe now waits on the host; its first request still gets the
    full --http-timeout (a loaded server's /health runs a generation and may be slow),
    only later requests in the wait are cut to 5 s."""
    lines = _probe(server, _fake_systemctl(tmp_path, "active"), "--path", "/slower",
                   "--wait", "1", "--http-timeout", "10")
    assert json.loads(lines[0])["health"] == 200
