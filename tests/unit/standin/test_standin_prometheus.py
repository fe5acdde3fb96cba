"""Debian's real Prometheus with the monitor plan's own files, scraping the SGLang
stand-in on loopback: the target is up with the inventory's labels, ``sglang:`` series
arrive, the server-down alert fires within its ``for:`` window once the server stops
and resolves after it is back, and ``fleet status``'s live query reads the rules.

The GPU exporter here is the lab's dcgm-exporter stand-in (lab/dcgm_standin: DCGM's
names and labels, composed values). What this does not prove: a monitor host installed
by deploy/monitor.py (no lab test runs that deploy), NVIDIA's real exporter, the node
exporter (not started here). Loopback only; every
wait is bounded in count and time.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_server import free_port, healthy_server, standin_env

from gpuserve.launch.profiles import load_profile
from gpuserve.monitor.plan import PROM_DIR, plan_monitor
from gpuserve.monitor.targets import HostEntry
from lab import dcgm_standin

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not "
                                "installed (python -m lab deps installs it, as root)")
BOX = Path(__file__).resolve().parents[3] / "lab" / "nvidia_repo" / "boxes" / "h200-nvlink"
FOR_S = 3
INTERVAL_S = 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models") / "qwen"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                               "vocab_size": 151936}))
    return d


def _get(url: str, timeout: float = 5) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return json.loads(response.read())


def _wait(what: str, check, timeout: float = 40, step: float = 0.5):
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / step) + 1):
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def _files(root: Path, sglang_port: int, dcgm_port: int) -> Path:
    """The monitor plan of a one-host inventory, written under ``root``."""
    profile = load_profile("glm5-nvfp4-tp8")
    profile = dataclasses.replace(profile, server=dataclasses.replace(
        profile.server, port=sglang_port))
    entry = HostEntry("lab-gpu", {"profile": "glm5-nvfp4-tp8", "sglang_api_key": "k" * 20,
                                  "monitor_scrape_address": "127.0.0.1",
                                  "dcgm_exporter_port": dcgm_port, "node_exporter": False,
                                  "sglang_version": "0.5.23"}, "gpu")
    plan = plan_monitor([entry], {"monitor_scrape_interval": INTERVAL_S,
                                  "monitor_alertmanager": False,
                                  "monitor_alert_for": {"SGLangServerDown": FOR_S}},
                        "inventory/lab.py", lambda ref: profile)
    for path, text in plan.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace(f"{PROM_DIR}/", f"{root}{PROM_DIR}/"))
    return root / PROM_DIR.lstrip("/") / "prometheus.yml"


@pytest.fixture
def prometheus(tmp_path) -> Iterator[tuple[str, Path]]:
    """(its base URL, the config) once it answers; stopped at the end."""
    port = free_port()
    yield_holder: dict = {}

    def start(sglang_port: int, dcgm_port: int) -> str:
        config = _files(tmp_path / "etc", sglang_port, dcgm_port)
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        yield_holder["proc"] = proc
        url = f"http://127.0.0.1:{port}"
        _wait("prometheus ready", lambda: _ready(url, proc), timeout=30)
        return url

    yield start, tmp_path
    proc = yield_holder.get("proc")
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _ready(url: str, proc) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"prometheus exited with {proc.returncode}")
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _query(url: str, expr: str) -> list[dict]:
    return _get(f"{url}/api/v1/query?query={urllib.parse.quote(expr)}")["data"]["result"]


def _alert(url: str, name: str) -> str | None:
    alerts = _get(f"{url}/api/v1/alerts")["data"]["alerts"]
    return next((a["state"] for a in alerts if a["labels"].get("alertname") == name), None)


@pytest.fixture
def dcgm() -> Iterator[int]:
    """The lab's dcgm-exporter stand-in (8x H200 box) on a loopback port."""
    server = dcgm_standin.server(BOX, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_prometheus_scrapes_the_standin_and_the_down_alert_fires_and_resolves(
        site23, model_dir, prometheus, dcgm) -> None:
    start, tmp_path = prometheus
    env = standin_env(site23)
    with healthy_server(model_dir, "glm-5", ("--enable-metrics",), env) as port:
        url = start(port, dcgm)

        def up_target():
            targets = _get(f"{url}/api/v1/targets")["data"]["activeTargets"]
            return next((t for t in targets if t["labels"]["job"] == "sglang"
                         and t["health"] == "up"), None)

        target = _wait("the sglang target up", up_target)
        labels = target["labels"]
        assert {k: labels[k] for k in ("host", "group", "profile", "sglang_version", "gpu")} \
            == {"host": "lab-gpu", "group": "gpu", "profile": "glm5-nvfp4-tp8",
                "sglang_version": "0.5.23", "gpu": "unknown"}
        assert labels["model"]
        series = _wait("sglang: series", lambda: _query(
            url, 'count by (host) ({__name__=~"sglang:.+", host="lab-gpu"})'))
        assert float(series[0]["value"][1]) >= 10
        _wait("recording rules", lambda: _query(url, "gpuserve:running_reqs"))
        # the GPU exporter's target: DCGM's own gpu label (0-7) survives beside ours
        gpus = _wait("DCGM series", lambda: _query(
            url, 'count by (host, job, profile) (DCGM_FI_DEV_GPU_TEMP{host="lab-gpu"})'))
        assert gpus[0]["metric"] == {"host": "lab-gpu", "job": "dcgm",
                                     "profile": "glm5-nvfp4-tp8"}
        assert float(gpus[0]["value"][1]) == 8
        assert len(_query(url, 'DCGM_FI_DEV_GPU_TEMP{gpu="7",host="lab-gpu"}')) == 1
        # fleet status's live query, against this Prometheus
        from gpuserve.commands.fleet import fetch_live

        live, error = fetch_live(url, 5.0)
        assert error is None and live["lab-gpu"].get("running") == 0.0
        assert _alert(url, "SGLangServerDown") is None
    stopped = time.monotonic()
    _wait("SGLangServerDown firing", lambda: _alert(url, "SGLangServerDown") == "firing",
          timeout=30, step=0.25)
    took = time.monotonic() - stopped
    # within its for: window plus a scrape and two evaluations (and the stand-in's stop)
    assert took + 0.5 >= FOR_S and took <= FOR_S + 4 * INTERVAL_S + 3, took
    with healthy_server(model_dir, "glm-5", ("--enable-metrics",), env, port=port):
        _wait("SGLangServerDown resolved", lambda: _alert(url, "SGLangServerDown") is None,
              timeout=30, step=0.25)
