"""Running the SGLang stand-in on loopback for a unit test: its environment, a free
port, and a server that is healthy before the test talks to it (bounded waits)."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def standin_env(site: Path, **extra: str) -> dict[str, str]:
    """This environment without the stand-in's knobs or API keys, the unpacked wheel on
    PYTHONPATH, offline, a fast simulated load; then ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPUSERVE_LAB_STANDIN_") and k not in ("OPENAI_API_KEY",
                                                                     "API_KEY")}
    env.update({"PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1",
                "GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "0.1",
                "GPUSERVE_LAB_STANDIN_WARMUP_SECONDS": "0.05"})
    env.update(extra)
    return env


def launch_argv(model_dir: Path, served_name: str, port: int, flags: tuple[str, ...]
                ) -> list[str]:
    """The stand-in's ``python -m sglang.launch_server`` command on loopback."""
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
            "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
            *flags]


@contextmanager
def healthy_server(model_dir: Path, served_name: str, flags: tuple[str, ...],
                   env: dict[str, str], log: Path | None = None,
                   port: int | None = None) -> Iterator[int]:
    """``python -m sglang.launch_server`` on ``port`` (default: a free loopback port),
    once /health answers 200 (at most 120 s: a start is about a second here, but a
    Python start beside a busy CI run has taken over 20 s); its output to ``log`` (or
    nowhere). Stopped on exit."""
    port = port or free_port()
    argv = launch_argv(model_dir, served_name, port, flags)
    with (log.open("w") if log else open(os.devnull, "w")) as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        for _ in range(1200):
            if time.monotonic() > deadline or proc.poll() is not None:
                break
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("stand-in server did not become healthy")
        assert proc.poll() is None, log.read_text() if log else "stand-in server exited"
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def scheduled_steps(port: int) -> tuple[float, float]:
    """(sum, count) of the server's inter-token latency histogram (--enable-metrics):
    the decode steps the stand-in scheduled (its pacing), not what a client on a busy
    machine saw."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    found = {m[1]: float(m[2]) for m in re.finditer(
        r"^sglang:inter_token_latency_seconds_(sum|count)\{[^}]*\} (\S+)$", text, re.M)}
    return found["sum"], found["count"]


def steps_between(before: tuple[float, float], after: tuple[float, float]
                   ) -> tuple[float, float]:
    """(mean step in seconds, steps) scheduled between two readings."""
    steps = after[1] - before[1]
    return (after[0] - before[0]) / max(steps, 1), steps
