"""RDMA between the hosts of one group (gpuserve/host/rdma_pairs.py, roles/rdma/pairs.py):
which pairs, the commands, the parse of real perftest outputs, the gate, and the order of
the operations on two hosts (server started before the client, stopped after)."""

from __future__ import annotations

from pathlib import Path

import pyinfra
import pytest
from pyinfra import host
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy, deploy
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_inventory, ctx_state
from pyinfra.operations import server

from gpuserve.errors import InputError
from gpuserve.host import rdma_pairs
from gpuserve.parsers.rdma import parse_rate, parse_sysfs_rdma
from gpuserve.parsers.sections import marker
from gpuserve.plans.host import plan_host
from gpuserve.roles import rdma
from gpuserve.roles.rdma import pairs as pairs_role

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rdma"


def _port(name: str, gid_index: int = 3, rate: float | None = 200.0) -> dict:
    return {"name": name, "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
            "rate_gbps": rate,
            "gids": [{"index": 0, "gid": "fe80::1", "type": "IB/RoCE v1"},
                     {"index": gid_index, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001",
                      "type": "RoCE v2"}]}


def test_ring_pairs_each_host_with_the_next_in_rounds_without_a_shared_host():
    assert rdma_pairs.ring(["a"]) == []
    assert rdma_pairs.ring(["a", "b"]) == [("a", "b")]
    assert rdma_pairs.ring(["a", "b", "c", "d"]) == [("a", "b"), ("b", "c"), ("c", "d"),
                                                     ("d", "a")]
    for names, count in ((["a", "b", "c", "d"], 2), (["a", "b", "c"], 3)):
        rounds = rdma_pairs.rounds(names)
        assert len(rounds) == count
        assert sorted(p for r in rounds for p in r) == sorted(rdma_pairs.ring(names))
        for r in rounds:
            hosts = [h for p in r for h in p]
            assert len(hosts) == len(set(hosts))


def test_host_data_validated_before_any_host():
    assert plan_host({}, "inv.py").rdma_pairs is None
    got = plan_host({"rdma_pairs_group": "gpu"}, "inv.py").rdma_pairs
    assert got == rdma_pairs.PairSettings("gpu", 5, 18515)
    for key, bad in (("rdma_pairs_seconds", 0), ("rdma_pairs_port", 80),
                     ("rdma_pairs_group", 3)):
        with pytest.raises(InputError, match=f"inv.py.*{key}"):
            plan_host({"rdma_pairs_group": "gpu", key: bad}, "inv.py")


def test_ports_matched_by_position_and_scripts_bounded():
    server = {"devices": [_port("mlx5_0"), {**_port("mlx5_1"), "state": "DOWN"},
                          _port("mlx5_2")]}
    client = {"devices": [_port("mlx5_0", gid_index=1), _port("mlx5_1")]}
    ports = rdma_pairs.matched(server, client)
    assert [(s["name"], c["name"]) for s, c in ports] == [("mlx5_0", "mlx5_0"),
                                                         ("mlx5_2", "mlx5_1")]
    start = rdma_pairs.server_script([s for s, _ in ports], 5, 18515)
    # two servers a port, each detached and bounded, on four consecutive ports
    assert start.count("setsid timeout ") == 4
    assert "-d mlx5_2 -i 1 -x 3 -F -D 5 --report_gbits -p 18517" in start
    assert "-d mlx5_2 -i 1 -x 3 -F -n 1000 -p 18518" in start
    pair = rdma_pairs.Pair("a", "b", "10.0.0.1")
    client_sh = rdma_pairs.client_script(pair, [c for _, c in ports], 5, 18515)
    assert "timeout 35 ib_write_bw -d mlx5_0 -i 1 -x 1 -F -D 5 --report_gbits -p 18515 " \
           "10.0.0.1" in client_sh
    assert client_sh.index(marker("bw1")) < client_sh.index("-p 18517 10.0.0.1")
    stop = rdma_pairs.stop_script(2, 18515)
    assert "kill" in stop and "/run/gpuserve-rdma-pair-18518.log" in stop


def test_results_from_real_two_host_outputs_and_the_gate():
    bw = (FIXTURES / "ib_write_bw_spark_rocep.txt").read_text()
    lat = (FIXTURES / "ib_write_lat_spark_rocep.txt").read_text()
    pair = rdma_pairs.Pair("spark2", "spark", "192.168.177.12")
    ports = [(_port("rocep1s0f1", rate=200.0), _port("rocep1s0f1", rate=200.0))]
    out = "\n".join([marker("bw0"), bw, marker("lat0"), lat])
    [result] = rdma_pairs.pair_results(pair, ports, out)
    assert result["write_bw_gbps"] == 111.71 and result["write_lat_us"] == 1.47
    assert result["server_device"] == "rocep1s0f1/1" and result["link_gbps"] == 200.0
    assert rdma_pairs.slow([result]) == []  # 111.71 of 200 is above half the link
    [fast_link] = rdma_pairs.pair_results(
        pair, [(_port("x", rate=400.0), _port("y", rate=400.0))], out)
    [evidence] = rdma_pairs.slow([fast_link])
    assert "spark2 x/1 -> spark y/1: 111.71 Gb/s, below 50% of the 400 Gb/s" in evidence
    [unknown] = rdma_pairs.pair_results(pair, [(_port("x", rate=None), _port("y"))], out)
    assert rdma_pairs.slow([unknown]) == []  # no recorded rate: no verdict
    [failed] = rdma_pairs.pair_results(pair, ports, marker("bw0") + "\nCouldn't connect "
                                       "to 192.168.177.12:18515\n")
    assert "Couldn't connect" in failed["error"]
    assert "not measured" in rdma_pairs.slow([failed])[0]


def test_sysfs_rate_read():
    assert parse_rate("100 Gb/sec (4X EDR)") == 100.0
    assert parse_rate("") is None
    [port] = parse_sysfs_rdma(["/sys/class/infiniband/mlx5_0/ports/1/state:4: ACTIVE",
                               "/sys/class/infiniband/mlx5_0/ports/1/rate:400 Gb/sec (4X NDR)"])
    assert port.rate_gbps == 400.0 and port.as_dict()["rate_gbps"] == 400.0


BW = (FIXTURES / "ib_write_bw_spark_rocep.txt").read_text().splitlines()
LAT = (FIXTURES / "ib_write_lat_spark_rocep.txt").read_text().splitlines()


def _two_hosts(monkeypatch, data: dict, extra_on_b: bool = False,
               ) -> tuple[State, list[tuple[str, str]]]:
    """Prepare measure_pairs on two @fake hosts of group ``gpu`` and execute it; every
    command of both hosts lands in one list, in the order they ran. ``extra_on_b``: the
    client host adds one operation more before it (another path through the deploy)."""
    # the client script's output, as the host prints it: a marker before each tool
    responses = {marker("bw0"): {"stdout": [marker("bw0"), *BW, marker("lat0"), *LAT]}}
    fake = {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0}
    names = ["@fake/a", "@fake/b"]
    inventory = Inventory(([(n, {**data, **fake}) for n in names], {}),
                          gpu=(names, {}))
    for name in names:
        monkeypatch.setitem(rdma._CHOSEN, name, {"devices": [_port("mlx5_0")]})
    state = State(inventory=inventory, config=Config())
    connect_all(state)
    log: list[tuple[str, str]] = []
    for h in inventory:
        original = h.connector.run_shell_command

        def recorded(command, *args, _name=h.name, _run=original, **kwargs):
            log.append((_name, f"{command} {kwargs.get('_stdin') or ''}"))
            return _run(command, *args, **kwargs)

        monkeypatch.setattr(h.connector, "run_shell_command", recorded)

    @deploy("pairs")
    def measure() -> None:
        if extra_on_b and host.name == "@fake/b":
            server.shell(name="only on b", commands=["echo b-only"])
        pairs_role.measure_pairs(rdma_pairs.PairSettings("gpu", 5, 18515))

    if pyinfra.is_cli:  # the stages pyinfra_cli/cli.py sets around the deploy files
        state.set_stage(StateStage.Prepare)
    with ctx_inventory.use(inventory):
        for h in inventory:
            if pyinfra.is_cli:  # the CLI calls the deploy code in each host's context
                with ctx_state.use(state), ctx_host.use(h):
                    measure()
            else:
                add_deploy(state, measure, host=h)
    if pyinfra.is_cli:
        state.set_stage(StateStage.Execute)
    run_ops(state)
    return state, log


def _steps(log: list[tuple[str, str]]) -> list[tuple[str, str]]:
    steps = [(name, "start" if "setsid timeout" in cmd else "client" if "ib_write_bw" in cmd
              else "write" if rdma_pairs.PAIRS_PATH in cmd else "stop" if "kill" in cmd
              else "other") for name, cmd in log]
    return [s for s in steps if s[1] != "other"]


def test_cli_order_lines_up_the_steps_when_the_hosts_differ_before(monkeypatch):
    # pyinfra's CLI orders by the call stack's lines (pyinfra.api.operation
    # solve_operation_consistency): one host's extra operation does not shift the steps
    monkeypatch.setattr(pyinfra, "is_cli", True)
    state, log = _two_hosts(monkeypatch, {}, extra_on_b=True)
    # each step is one operation of both hosts, so pyinfra waits for it on both
    steps = [h for h in state.get_op_order()
             if any("RDMA pairs" in n for n in state.get_op_meta(h).names)]
    assert len(steps) == 3
    assert all(h in state.ops[host_] for h in steps for host_ in state.inventory)
    assert _steps(log) == [("@fake/a", "start"), ("@fake/b", "client"),
                           ("@fake/b", "write"), ("@fake/a", "stop")]
    assert any("b-only" in cmd for name, cmd in log if name == "@fake/b")


def test_two_hosts_server_starts_before_the_client_and_stops_after(monkeypatch):
    _, log = _two_hosts(monkeypatch, {"private_address": "10.0.0.1"})
    steps = [(name, "start" if "setsid timeout" in cmd else "client" if "ib_write_bw" in cmd
              else "write" if rdma_pairs.PAIRS_PATH in cmd else "stop" if "kill" in cmd
              else "other") for name, cmd in log]
    steps = [s for s in steps if s[1] != "other"]
    assert steps == [("@fake/a", "start"), ("@fake/b", "client"), ("@fake/b", "write"),
                     ("@fake/a", "stop")]
    client = next(cmd for name, cmd in log if "ib_write_bw" in cmd and name == "@fake/b")
    assert "-p 18515 10.0.0.1" in client  # the server's private_address
    written = next(cmd for _, cmd in log if rdma_pairs.PAIRS_PATH in cmd)
    assert '"write_bw_gbps": 111.71' in written and '"client": "@fake/b"' in written


def test_serial_run_and_missing_group_refused(monkeypatch):
    from gpuserve.roles.base import run_context as rc

    names = ["@fake/a", "@fake/b"]
    inventory = Inventory((names, {}), gpu=(names, {}))
    monkeypatch.setattr(pairs_role, "run_context", lambda: rc.RunContext())
    monkeypatch.setattr(pairs_role, "cli_params", lambda: {})
    with ctx_inventory.use(inventory), ctx_host.use(inventory.get_host("@fake/a")):
        with pytest.raises(InputError, match="no inventory group 'nope'"):
            pairs_role.plan_pairs(rdma_pairs.PairSettings("nope", 5, 18515))
        [[pair]] = pairs_role.plan_pairs(rdma_pairs.PairSettings("gpu", 5, 18515))
        assert pair == rdma_pairs.Pair("@fake/a", "@fake/b", "@fake/a")
        # pyinfra's command line as the CLI parsed it: --serial, then --no-wait
        monkeypatch.setattr(pairs_role, "run_context", lambda: rc.RunContext(serial=True))
        with pytest.raises(InputError, match="without --serial or --no-wait"):
            pairs_role.plan_pairs(rdma_pairs.PairSettings("gpu", 5, 18515))
        monkeypatch.setattr(pairs_role, "run_context", lambda: rc.RunContext())
        monkeypatch.setattr(pairs_role, "cli_params", lambda: {"no_wait": True})
        with pytest.raises(InputError, match="without --serial or --no-wait"):
            pairs_role.plan_pairs(rdma_pairs.PairSettings("gpu", 5, 18515))


def test_doctor_names_a_slow_pair_from_the_facts_document():
    import copy
    import json

    from gpuserve.doctor.rules import diagnose
    from gpuserve.facts.document import document_from_sections
    from gpuserve.host.hostfacts import HostFacts
    from gpuserve.launch.profiles import load_profile

    out = "\n".join([marker("bw0"), *BW, marker("lat0"), *LAT])
    pair = rdma_pairs.Pair("spark2", "spark", "192.168.177.12")
    fast = rdma_pairs.pair_results(pair, [(_port("x", rate=400.0), _port("y", rate=400.0))],
                                   out)
    ok = rdma_pairs.pair_results(pair, [(_port("x"), _port("y"))], out)
    host_json = [json.dumps({"rdma": {"devices": [_port("y")], "gpu_numa_nodes": []}})]
    fixture = FIXTURES.parent / "hostfacts" / "h200-nvlink.json"

    def findings(results: list[dict]) -> dict[str, str]:
        rdma_block = document_from_sections({"host_json": host_json, "rdma_pairs": [
            json.dumps({"seconds": 5, "pairs": results})]})["rdma"]
        doc = copy.deepcopy(json.loads(fixture.read_text()))
        doc["rdma"] = rdma_block
        facts = HostFacts.from_dict(doc, "h200-nvlink.json")
        return {f.id: json.dumps(f.to_dict()) for f in
                diagnose(load_profile("qwen3-235b-a22b-fp8-h200-tp8"), facts)}

    assert "111.71 Gb/s, below 50% of the 400 Gb/s" in findings(fast)["rdma-pair-slow"]
    assert "rdma-pair-slow" not in findings(ok)


def test_server_address_from_private_address_else_how_the_controller_reaches_it():
    assert rdma_pairs.address_of("gpu1", {"private_address": "10.0.0.7"}, "inv.py") == \
        "10.0.0.7"
    assert rdma_pairs.address_of("gpu1", {"ssh_hostname": "gpu1.lan"}, "inv.py") == \
        "gpu1.lan"
    assert rdma_pairs.address_of("gpu1", {}, "inv.py") == "gpu1"
    with pytest.raises(InputError, match=r"inv.py.*private_address \(host gpu1\)"):
        rdma_pairs.address_of("gpu1", {"private_address": "ten.0.0.7"}, "inv.py")
