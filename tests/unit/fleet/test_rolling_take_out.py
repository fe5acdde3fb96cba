"""The take-out step of a rolling switch when the gateway does not answer: a gateway
that is not running (never deployed, or stopped) routes nothing, so the worker switches
without a drain; one whose unit runs but does not answer stops the switch before any
change. The router host here answers as smg_probe.py and ``systemctl is-active`` do."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_rolling_serial import rollout

import gpuserve.roles.router.rolling as rolling
from gpuserve.roles.router.rolling import Switching

DOWN = json.dumps({"live": False, "error": "GET /liveness: [Errno 111] Connection refused"})


class RouterHost:
    """The router host's two answers: the probe's JSON line and the unit's state."""

    name = "gw"

    def __init__(self, unit_state: str, reachable: bool = True):
        self.unit_state, self.reachable, self.commands = unit_state, reachable, []

    def get_fact(self, fact, **kwargs) -> str:
        assert fact is rolling.GatewayView
        return DOWN

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        if not self.reachable:  # what pyinfra returns when the command could not run
            return False, SimpleNamespace(stdout_lines=[], stderr_lines=["Connection lost"])
        return True, SimpleNamespace(stdout_lines=[self.unit_state], stderr_lines=[])


@pytest.fixture
def reports(monkeypatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(rolling, "_fail", lambda host_, message, footer=(): seen.append(
        message) or False)
    return seen


@pytest.mark.parametrize("unit_state", ["inactive", "failed", "unknown"])
def test_a_stopped_gateway_routes_nothing_so_the_worker_switches_undrained(
        monkeypatch, reports, unit_state) -> None:
    router = RouterHost(unit_state)
    monkeypatch.setattr(rolling, "connected_router", lambda r: router)
    switching = Switching(restarts=True, rollout=rollout("a"))
    worker = SimpleNamespace(name="a")
    assert rolling.take_out_now(worker, switching.rollout, switching, "/bin", 30000, "/c") is True
    assert reports == []
    assert switching.gateway_stopped and not switching.out
    assert any("systemctl is-active gpuserve-router.service" in c for c in router.commands)
    # nothing was taken out, so nothing is put back (and no manifest is written)
    assert rolling._put_back(worker, switching.rollout, switching) is True
    assert len(router.commands) == 1


@pytest.mark.parametrize("router", [
    RouterHost("active"),
    RouterHost("activating"),  # systemd is restarting it: it will route again soon
    RouterHost("inactive", reachable=False),  # its state could not be asked
], ids=["active", "activating", "unreachable"])
def test_a_gateway_that_may_be_running_and_does_not_answer_stops_the_switch(
        monkeypatch, reports, router) -> None:
    monkeypatch.setattr(rolling, "connected_router", lambda r: router)
    switching = Switching(restarts=True, rollout=rollout("a"))
    worker = SimpleNamespace(name="a")
    assert rolling.take_out_now(worker, switching.rollout, switching, "/bin", 30000, "/c") is False
    assert len(reports) == 1 and "does not answer GET /liveness" in reports[0]
    assert "nothing changed" in reports[0]
    assert not switching.gateway_stopped and not switching.out


def test_a_router_host_without_the_probe_reads_as_a_gateway_that_does_not_answer(
        tmp_path) -> None:
    """Workers served before the gateway deploy reached the router host: the view says
    no gateway answers (so the take-out asks systemd, as for a stopped gateway) instead
    of failing on python3's 'can't open file'."""
    import subprocess

    command = rolling.GatewayView().command(str(tmp_path / "absent" / "smg_probe.py"),
                                            30080, "http://10.77.0.1:30000", "ready", 0)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    view = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and view["live"] is False
    assert "smg_probe.py is not installed" in view["error"]
