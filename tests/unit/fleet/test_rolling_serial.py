"""A fleet switch behind one gateway runs host by host (``pyinfra --serial``) or not at
all: roles/router/rolling.register_restart refuses, before any change, a run in which
a second worker of the same gateway would restart while pyinfra runs each operation on
every host together."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state

from gpuserve.launch.lock_choice import PreflightError
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.router.rolling import Rollout, Switching, register_restart


def rollout(worker: str, router: str = "gw") -> Rollout:
    return Rollout(router=router, worker=worker, url=f"http://{worker}:30000",
                   desired=("http://a:30000", "http://b:30000"), members=("a", "b"),
                   manifest_with="{}", manifest_without="{}", manifest_group="smg",
                   probe="/opt/gpuserve-router/bin/smg_probe.py", port=30080,
                   max_unavailable=1, drain_timeout=120, idle_timeout=600, drain_grace=30,
                   ready_timeout=60)


@pytest.fixture
def fresh_state():
    state = State(Inventory(([], {})), Config())
    with ctx_state.use(state):
        yield state


def test_second_restart_without_serial_is_refused(fresh_state) -> None:
    assert not run_context(fresh_state).serial  # no CLI: no --serial
    first, second = Switching(), Switching()
    register_restart(rollout("a"), first)
    assert first.restarts
    with pytest.raises(PreflightError, match=r"a, b would all restart at once .* --serial"):
        register_restart(rollout("b"), second)


def test_serial_run_and_other_gateways_are_allowed(fresh_state) -> None:
    run_context(fresh_state).serial = True  # as pyinfra's CLI parsed --serial
    register_restart(rollout("a"), Switching())
    register_restart(rollout("b"), Switching())
    with ctx_state.use(State(Inventory(([], {})), Config())):
        register_restart(rollout("a", router="gw1"), Switching())
        register_restart(rollout("b", router="gw2"), Switching())  # one per gateway: fine


def fleet_inventory(**extra: dict) -> Inventory:
    """Two workers behind a gateway on the first, as inventory/lab_fleet.py has them."""
    worker = {"profile": "glm5-nvfp4-tp8"}
    first = {**worker, "private_address": "10.77.0.1", "listen_address": "10.77.0.1",
             "router_workers_group": "gpu", "router_api_key": "k" * 20}
    second = {**worker, "private_address": "10.77.0.2", "listen_address": "10.77.0.2"}
    hosts = [("lab-gpu", {**first, **extra.get("lab-gpu", {})}),
             ("lab-gpu-2", {**second, **extra.get("lab-gpu-2", {})})]
    return Inventory(([h for h, _ in hosts], {}), gpu=([h for h, _ in hosts], {}),
                     **{f"_{h}": ([h], data) for h, data in hosts})


def plan_in(inventory: Inventory, name: str):
    from pyinfra.context import ctx_inventory

    from gpuserve.roles.router.rolling import plan_rollout

    state = State(inventory, Config())
    with ctx_state.use(state), ctx_inventory.use(inventory):
        return plan_rollout(name, "inventory/lab_fleet.py")


def test_plan_rollout_from_the_inventory() -> None:
    inv = fleet_inventory()
    second = plan_in(inv, "lab-gpu-2")
    assert second is not None and second.router == "lab-gpu"
    assert second.url == "http://10.77.0.2:30000"
    assert second.desired == ("http://10.77.0.1:30000", "http://10.77.0.2:30000")
    assert second.members == ("lab-gpu", "lab-gpu-2")
    assert '"http://10.77.0.2:30000"' not in second.manifest_without
    assert '"http://10.77.0.2:30000"' in second.manifest_with
    assert second.max_unavailable == 1 and second.port == 30080
    assert plan_in(inv, "lab-gpu").url == "http://10.77.0.1:30000"


def test_no_rollout_for_a_drained_worker_or_the_only_one() -> None:
    assert plan_in(fleet_inventory(**{"lab-gpu-2": {"router_drain": True}}),
                   "lab-gpu-2") is None
    # the first host is then the only served worker: a restart is an outage either way
    assert plan_in(fleet_inventory(**{"lab-gpu-2": {"router_drain": True}}),
                   "lab-gpu") is None


def test_a_serial_rollout_goes_in_inventory_order() -> None:
    """pyinfra's --serial runs `inventory.get_active_hosts()`, a list of a set."""
    from pyinfra.context import ctx_inventory

    names = [f"gpu-{i:02d}" for i in range(12)]
    inventory = Inventory((names, {}))
    state = State(inventory, Config())
    state.active_hosts = set(inventory.get_host(n) for n in reversed(names))
    run_context(state).serial = True
    with ctx_state.use(state), ctx_inventory.use(inventory):
        register_restart(rollout("gpu-05"), Switching())
    assert [h.name for h in inventory.get_active_hosts()] == names
    state.fail_hosts({inventory.get_host("gpu-03")})  # pyinfra's own in-place removal
    assert [h.name for h in inventory.get_active_hosts()] == [n for n in names
                                                               if n != "gpu-03"]


def test_a_lone_worker_with_another_key_is_not_refused_by_the_serve_deploy() -> None:
    """The lab host is its own gateway's only worker; a serve deploy that gives it an
    sglang_api_key other than router_api_key must not fail on the gateway's data (the
    router deploy refuses that; a restart of the only worker does not roll)."""
    from pyinfra.context import ctx_inventory

    from gpuserve.roles.router.rolling import gateway_of, plan_rollout

    data = {"profile": "glm5-nvfp4-tp8", "router_workers_group": "gpu",
            "router_api_key": "k" * 20, "sglang_api_key": "other-key-0123456789"}
    inventory = Inventory((["lab-gpu"], {}), gpu=(["lab-gpu"], {}),
                          _lab=(["lab-gpu"], data))
    with ctx_state.use(State(inventory, Config())), ctx_inventory.use(inventory):
        assert gateway_of("lab-gpu", "inventory/lab.py") is None
        assert plan_rollout("lab-gpu", "inventory/lab.py") is None


def test_two_workers_with_another_key_are_refused_when_one_restarts() -> None:
    from gpuserve.errors import InputError

    inv = fleet_inventory(**{"lab-gpu-2": {"sglang_api_key": "other-key-0123456789"}})
    with pytest.raises(InputError, match=r"sglang_api_key \(host lab-gpu-2\)"):
        plan_in(inv, "lab-gpu")


def test_the_run_context_takes_the_command_line_pyinfra_parsed() -> None:
    """--serial, --dry, --diff and the inventory file come from pyinfra's CLI's own click
    parameters (no sys.argv sniffing), one context per run."""
    import click

    from gpuserve.roles.base.run_context import RunContext

    params = {"inventory": "inventory/lab.py", "serial": True, "dry": True, "diff": False}
    first, second = State(Inventory(([], {})), Config()), State(Inventory(([], {})), Config())
    with click.Context(click.Command("pyinfra"), obj=None) as context:
        context.params.update(params)
        with ctx_state.use(first):
            made = run_context()
    assert made == RunContext(inventory_file="inventory/lab.py", serial=True, dry=True)
    assert run_context(first) is made
    assert run_context(second) == RunContext()  # another run, no CLI: nothing shared
