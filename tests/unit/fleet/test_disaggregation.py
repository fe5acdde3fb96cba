"""Prefill-decode fleets: each host's role from the inventory groups, the role's profile
(the disaggregation block's fields merged over it), SGLang's PD flags checked by the
locked version's catalog, the transfer backend checked against the lock, the IB devices
from the host's record only, and every fleet that cannot work refused before any host
changes, naming the inventory file and field. Through plan_serve, as the deploy calls it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from systemd_words import server_argv

from gpuserve.errors import InputError
from gpuserve.fleet.disaggregation import backend_problem, rdma_devices
from gpuserve.fleet.multinode import Member
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.launch.profiles import load_profile
from gpuserve.plans.router import manifest_text, plan_router
from tests.serve_plans import plan_of

REPO = Path(__file__).resolve().parents[3]
PD = REPO / "tests/fixtures/profiles/pd-glm5.yaml"
INV = "inventory/pd.py"
SHIPPED = REPO / "gpuserve/data/locks/sglang-0.5.23-cu13-py311.json"
#: SOURCE: PyPI's mooncake-transfer-engine 0.3.11.post1 wheel for CPython 3.11
#: (`pip download --no-deps --only-binary=:all: --python-version 3.11 --platform
#: manylinux_2_35_x86_64 mooncake-transfer-engine==0.3.11.post1`, 2026-12-06): its file
#: name, sha256 and size. The url is the project's page (the test never downloads).
MOONCAKE = {"name": "mooncake-transfer-engine", "version": "0.3.11.post1",
            "filename": "mooncake_transfer_engine-0.3.11.post1-cp311-cp311-"
                        "manylinux_2_35_x86_64.whl",
            "url": "https://pypi.org/project/mooncake-transfer-engine/0.3.11.post1/",
            "sha256": "d838e6a245a54b38fbe5b117d46595d997f11281031c53da31245886628afa89",
            "size": 42657804}
#: An RDMA record as the host deploy writes it in host.json (rdma.devices: one entry per
#: port, state as ibv_devinfo prints it).
RDMA = {"rdma": {"devices": [
    {"name": "mlx5_0", "port": 1, "state": "PORT_ACTIVE (4)", "link_layer": "InfiniBand"},
    {"name": "mlx5_1", "port": 1, "state": "PORT_DOWN (1)", "link_layer": "InfiniBand"},
    {"name": "mlx5_2", "port": 1, "state": "PORT_ACTIVE (4)", "link_layer": "InfiniBand"}]}}


def runtime(home: str) -> HostRuntime:
    return HostRuntime(name="gpu", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


@pytest.fixture
def locks(tmp_path) -> Path:
    """The shipped 0.5.23 lock for Python 3.11 with Mooncake's wheel added."""
    lock = json.loads(SHIPPED.read_text())
    lock["packages"] = sorted([*lock["packages"], MOONCAKE], key=lambda p: p["name"])
    lock["download_bytes"] += MOONCAKE["size"]
    lock["glibc_min"], lock["platform"] = "2.35", "manylinux_2_35_x86_64"
    directory = tmp_path / "locks"
    directory.mkdir()
    (directory / SHIPPED.name).write_text(json.dumps(lock))
    return directory


def fleet(profile=PD, decode=("gpu-d",), **extra) -> dict[str, list[Member]]:
    data = {"profile": str(profile), "sglang_prefill_group": "prefill",
            "sglang_decode_group": "decode", "preflight": "off", **extra}
    return {"prefill": [Member("gpu-p", dict(data))],
            "decode": [Member(name, dict(data)) for name in decode]}


def plan(host: str, groups: dict, locks_dir: Path | None, record: dict | None = None, **data):
    me = next(m for members in groups.values() for m in members if m.name == host)
    host_data = {**me.data, **data}
    if locks_dir is not None:
        host_data["sglang_locks_dir"] = str(locks_dir)
    lines = json.dumps(record).splitlines() if record is not None else None
    return plan_of(host_data, INV, runtime, lambda: lines, host_name=host,
                   group_members=groups.get)


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def launched(p) -> list[str]:
    return server_argv(p.service.unit_text, p.service.env_text)


def test_each_host_gets_its_groups_role_and_the_roles_fields(locks) -> None:
    groups = fleet()
    prefill, decode = (launched(plan(h, groups, locks, RDMA)) for h in ("gpu-p", "gpu-d"))
    assert value(prefill, "--disaggregation-mode") == "prefill"
    assert value(decode, "--disaggregation-mode") == "decode"
    # the bootstrap server runs on the prefill side only
    assert value(prefill, "--disaggregation-bootstrap-port") == "8998"
    assert "--disaggregation-bootstrap-port" not in decode
    # the disaggregation block's per-role fields (tests/fixtures/profiles/pd-glm5.yaml)
    assert value(prefill, "--chunked-prefill-size") == "16384"
    assert value(decode, "--max-running-requests") == "256"
    assert value(decode, "--chunked-prefill-size") is None
    for args in (prefill, decode):
        assert value(args, "--disaggregation-transfer-backend") == "mooncake"
        # the recorded ports that are up, in the record's order; the down one left out
        assert value(args, "--disaggregation-ib-device") == "mlx5_0,mlx5_2"


def test_no_rdma_record_renders_no_device_and_warns_the_tcp_fallback(locks) -> None:
    p = plan("gpu-p", fleet(), locks, record=None)
    args = launched(p)
    assert "--disaggregation-ib-device" not in args
    assert value(args, "--disaggregation-transfer-backend") == "mooncake_tcp"
    warning = next(w for w in p.preflight.warnings if w.startswith("PD prefill"))
    assert "TCP fallback" in warning and "GB/s" in warning
    assert p.pd is not None and p.pd.ib_devices == ()


def test_a_record_without_an_active_port_is_said_so(locks) -> None:
    down = {"rdma": {"devices": [RDMA["rdma"]["devices"][1]]}}
    p = plan("gpu-d", fleet(), locks, record=down)
    assert "no active RDMA port" in " ".join(p.preflight.warnings)
    assert rdma_devices(json.dumps(down).splitlines(), "host.json") == ()
    assert rdma_devices(['{"p2p": "ok"}'], "host.json") is None


def test_a_backend_the_lock_lacks_is_refused_naming_the_profile_field() -> None:
    # the shipped locks pin no transfer engine
    with pytest.raises(InputError) as err:
        plan("gpu-p", fleet(), None, RDMA)
    assert err.value.field == "disaggregation.transfer_backend"
    assert err.value.file == str(PD)
    assert "missing from the lock" in err.value.message
    assert "mooncake-transfer-engine" in err.value.message
    assert backend_problem(["nixl-cu13"], "nixl", "x") is None


@pytest.mark.parametrize(("groups", "field", "words"), [
    (fleet(decode=()), "sglang_decode_group", "no decode host"),
    ({"prefill": fleet()["prefill"]}, "sglang_decode_group", "no decode host"),
    ({"decode": fleet()["decode"], "prefill": []}, "sglang_prefill_group", "no prefill host"),
    ({**fleet(), "decode": [*fleet()["decode"], fleet()["prefill"][0]]},
     "sglang_decode_group", "in both"),
])
def test_a_fleet_without_both_roles_is_refused(groups, field, words, locks) -> None:
    host = "gpu-p" if groups.get("prefill") else "gpu-d"
    me = Member(host, fleet()["prefill"][0].data)
    members = {k: v for k, v in groups.items()}
    with pytest.raises(InputError) as err:
        plan_of({**me.data, "sglang_locks_dir": str(locks)}, INV, runtime,
                host_name=host, group_members=members.get)
    assert (err.value.file, err.value.field) == (INV, field)
    assert words in err.value.message


def test_mismatched_model_or_version_between_roles_is_refused(tmp_path, locks) -> None:
    other = tmp_path / "pd-other.yaml"
    other.write_text(f"extends: {PD}\nmodel:\n  served_name: other\n")
    groups = fleet()
    groups["decode"] = [Member("gpu-d", {**groups["decode"][0].data, "profile": str(other)})]
    with pytest.raises(InputError, match="mismatched model between roles") as err:
        plan("gpu-p", groups, locks, RDMA)
    assert err.value.field == f"profile (host gpu-d, profile {other})"
    groups = fleet()
    groups["decode"] = [Member("gpu-d", {**groups["decode"][0].data,
                                         "sglang_version": "0.5.19"})]
    with pytest.raises(InputError, match="mismatched SGLang version") as err:
        plan("gpu-p", groups, locks, RDMA)
    assert err.value.field == "sglang_version (host gpu-d)"


@pytest.mark.parametrize(("text", "data", "words"), [
    ("  bootstrap_port: 30000\n", {}, "also server.port"),
    ("  bootstrap_port: 9100\n", {}, "also node_exporter_port"),
    ("  bootstrap_port: 30080\n", {"router_workers_group": "gpu"}, "also router_port"),
])
def test_a_bootstrap_port_clash_is_refused(tmp_path, locks, text, data, words) -> None:
    clash = tmp_path / "pd-clash.yaml"
    clash.write_text(f"extends: {PD}\ndisaggregation:\n{text}")
    with pytest.raises(InputError) as err:
        plan("gpu-p", fleet(clash), locks, RDMA, **data)
    assert (err.value.file, err.value.field) == (str(clash), "disaggregation.bootstrap_port")
    assert words in err.value.message and "bootstrap port clash" in err.value.message


def test_a_host_of_a_pd_group_without_a_pd_profile_is_refused(locks) -> None:
    groups = fleet("glm5-nvfp4-tp8")
    with pytest.raises(InputError, match="no disaggregation: block") as err:
        plan("gpu-d", groups, locks)
    assert err.value.field == "sglang_decode_group"


@pytest.mark.parametrize(("text", "field", "words"), [
    ("  transfer_backend: rdma\n", "disaggregation.transfer_backend", "not one of"),
    ("  bootstrap_port: 0\n", "disaggregation.bootstrap_port", "1..65535"),
    ("  prefill:\n    model:\n      path: /m\n", "disaggregation.prefill.model",
     "same for both roles"),
    ("  decode: 3\n", "disaggregation.decode", "must be a mapping"),
    ("  mode: prefill\n", "disaggregation.mode", "unknown key"),
])
def test_bad_blocks_are_refused_at_load(tmp_path, text, field, words) -> None:
    bad = tmp_path / "pd-bad.yaml"
    bad.write_text(f"extends: {PD}\ndisaggregation:\n{text}")
    with pytest.raises(InputError) as err:
        load_profile(bad)
    assert (err.value.file, err.value.field) == (str(bad), field)
    assert words in err.value.message


def test_a_roles_bad_field_names_the_line_of_its_block(tmp_path, locks) -> None:
    bad = tmp_path / "pd-role.yaml"
    bad.write_text(f"extends: {PD}\ndisaggregation:\n  decode:\n    memory:\n"
                   "      cuda_graph_max_bs: 0\n")
    with pytest.raises(InputError) as err:
        plan("gpu-d", fleet(bad), locks, RDMA)
    assert (err.value.file, err.value.field, err.value.line) == (
        str(bad), "memory.cuda_graph_max_bs", 5)


def test_the_role_flags_may_not_come_from_extra_args(tmp_path, locks) -> None:
    bad = tmp_path / "pd-extra.yaml"
    bad.write_text(f"extends: {PD}\nextra_args: [--disaggregation-ib-device, mlx5_9]\n")
    with pytest.raises(InputError, match="set from the inventory") as err:
        plan("gpu-p", fleet(bad), locks, RDMA)
    assert err.value.field == "extra_args[0]"


# ------------------------------------------------------------------ the gateway (smg PD mode)

KEY = "router-key-0123456789abcdef"


def gateway(decode=("gpu-d",), drained=(), regular=()):
    """A gateway over group gpu: the PD fleet's hosts (group data naming the two groups)
    and ``regular`` hosts serving a plain profile."""
    pd = {"profile": str(PD), "sglang_prefill_group": "prefill",
          "sglang_decode_group": "decode", "sglang_api_key": KEY}
    hosts = {name: {**pd, "private_address": f"10.0.0.{20 + i}",
                    "router_drain": name in drained}
             for i, name in enumerate(("gpu-p", *decode))}
    hosts.update({name: {"profile": "glm5-nvfp4-tp8", "sglang_api_key": KEY,
                         "private_address": f"10.0.1.{i}"} for i, name in enumerate(regular)})
    members = {n: Member(n, d) for n, d in hosts.items()}
    groups = {"gpu": list(members.values()), "prefill": [members["gpu-p"]],
              "decode": [members[n] for n in decode]}
    data = {"router_workers_group": "gpu", "router_api_key": KEY}
    return plan_router(data, INV, host_name="gw", group_members=groups.get)


def test_the_gateway_runs_smg_in_pd_mode_with_every_role_and_bootstrap_port() -> None:
    p = gateway(decode=("gpu-d", "gpu-e"))
    assert "--pd-disaggregation" in p.args
    assert json.loads(manifest_text(p.workers))["workers"] == [
        {"url": "http://10.0.0.20:30000", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://10.0.0.21:30000", "worker_type": "decode"},
        {"url": "http://10.0.0.22:30000", "worker_type": "decode"}]
    # one prefill host: a rolling switch would leave the role empty
    assert any("one prefill worker only" in w for w in p.warnings)
    assert not any("decode worker" in w for w in p.warnings)


def test_a_role_with_no_serving_worker_is_warned() -> None:
    p = gateway(drained=("gpu-d",))
    assert any(w.startswith("no decode worker of group gpu is serving") for w in p.warnings)


def test_a_gateway_mixing_pd_and_regular_workers_is_refused() -> None:
    with pytest.raises(InputError, match="mixes PD workers") as err:
        gateway(regular=("gpu-r",))
    assert (err.value.file, err.value.field) == (INV, "router_workers_group")


def test_a_regular_gateway_is_unchanged() -> None:
    data = {"router_workers_group": "gpu", "router_api_key": KEY}
    groups = {"gpu": [Member("gpu-r", {"profile": "glm5-nvfp4-tp8", "sglang_api_key": KEY,
                                       "private_address": "10.0.1.1"})]}
    p = plan_router(data, INV, host_name="gw", group_members=groups.get)
    assert "--pd-disaggregation" not in p.args
    assert json.loads(manifest_text(p.workers))["workers"] == [{"url": "http://10.0.1.1:30000"}]


# ------------------------------------------------------------------ gpuserve check

def inventory(tmp_path: Path, locks_dir: Path | None, decode: bool = True) -> Path:
    data = {"profile": str(PD), "sglang_prefill_group": "prefill",
            "sglang_decode_group": "decode", "preflight": "off",
            **({"sglang_locks_dir": str(locks_dir)} if locks_dir else {})}
    text = f"prefill = [('gpu-p', {data!r})]\n"
    if decode:
        text += f"decode = [('gpu-d', {data!r})]\n"
    path = tmp_path / "pd_inventory.py"
    path.write_text(text)
    return path


def check(capsys, inv: Path) -> tuple[int, str]:
    from gpuserve.cli import main

    rc = main(["check", str(inv), "--deploy", "serve"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_check_passes_a_whole_fleet_and_says_each_role(tmp_path, capsys, locks) -> None:
    rc, out = check(capsys, inventory(tmp_path, locks))
    assert rc == 0, out
    assert "PD prefill (1 prefill : 1 decode), mooncake" in out
    assert "PD decode (1 prefill : 1 decode), mooncake" in out
    assert "no decode host" not in out and "no host was connected to" in out


def test_check_refuses_a_fleet_without_decode_host_before_connecting(tmp_path, capsys,
                                                                      locks) -> None:
    rc, out = check(capsys, inventory(tmp_path, locks, decode=False))
    assert rc == 1
    assert "FAIL" in out and "sglang_decode_group" in out and "no decode host" in out


def test_check_refuses_a_backend_the_lock_lacks(tmp_path, capsys) -> None:
    rc, out = check(capsys, inventory(tmp_path, None))
    assert rc == 1
    assert "disaggregation.transfer_backend" in out and "missing from the lock" in out


def test_fleet_status_shows_each_hosts_role(tmp_path, capsys, locks) -> None:
    from gpuserve.cli import main

    inv = inventory(tmp_path, locks)
    main(["fleet", "status", str(inv), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert {h["host"]: h["role"] for h in doc["hosts"]} == {"gpu-p": "prefill",
                                                             "gpu-d": "decode"}
    main(["fleet", "status", str(inv)])
    rows = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines()
            if ln.startswith("gpu-")}
    assert rows["gpu-p"][-1] == "prefill" and rows["gpu-d"][-1] == "decode"


def test_fleet_status_says_a_pd_hosts_transfer_figures_under_the_table() -> None:
    from gpuserve.commands.fleet import format_status
    from gpuserve.fleet.status import HostStatus
    from gpuserve.monitor.query import LiveFigures

    rows = [HostStatus("gpu-p", role="prefill", live=LiveFigures({
                "pd_queue": 3.0, "kv_transfer_p99_ms": 12.4, "pd_bootstrap_failed": 0.0,
                "pd_transfer_failed": 0.0})),
            HostStatus("gpu-d", role="decode", live=LiveFigures({"pd_queue": 7.0})),
            HostStatus("gpu-x", live=LiveFigures({"pd_queue": 1.0})),  # not a PD host
            HostStatus("gpu-q", role="decode", live=LiveFigures({"tok_s": 5.0}))]
    out = format_status(rows, [])
    assert ("gpu-p: prefill: 3 request(s) in its PD queues, KV transfer p99 12 ms, "
            "failures in 5 min: 0 bootstrap, 0 transfer") in out
    assert ("gpu-d: decode: 7 request(s) in its PD queues, KV transfer p99 - ms, "
            "failures in 5 min: - bootstrap, - transfer") in out
    assert "gpu-x: " not in out and "gpu-q: decode:" not in out


# ------------------------------------------------------------------ a rolling switch per role

def pd_inventory(decode: tuple[str, ...]):
    """A PD fleet behind a gateway on its prefill host (inventory/lab_pd.py's shape)."""
    from pyinfra.api import Inventory

    pd = {"profile": str(PD), "sglang_prefill_group": "prefill",
          "sglang_decode_group": "decode", "sglang_api_key": KEY}
    hosts = [("gpu-p", {**pd, "private_address": "10.77.0.1", "router_workers_group": "gpu",
                        "router_api_key": KEY})]
    hosts += [(name, {**pd, "private_address": f"10.77.0.{i + 2}"})
              for i, name in enumerate(decode)]
    names = [h for h, _ in hosts]
    return Inventory((names, {}), gpu=(names, {}), prefill=(["gpu-p"], {}),
                     decode=(list(decode), {}), **{f"_{h}": ([h], d) for h, d in hosts})


def rollout_of(inventory, name: str):
    from pyinfra.api import Config, State
    from pyinfra.context import ctx_inventory, ctx_state

    from gpuserve.roles.router.rolling import plan_rollout

    with ctx_state.use(State(inventory, Config())), ctx_inventory.use(inventory):
        return plan_rollout(name, INV)


def test_a_rolling_switch_counts_each_role_on_its_own() -> None:
    inv = pd_inventory(("gpu-d", "gpu-e"))
    first = rollout_of(inv, "gpu-d")
    # the other decode host takes its requests; the prefill host is not a peer of it
    assert first is not None
    assert first.desired == ("http://10.77.0.2:30000", "http://10.77.0.3:30000")
    # the manifest without it keeps the prefill and the other decode host
    assert json.loads(first.manifest_without)["workers"] == [
        {"url": "http://10.77.0.1:30000", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://10.77.0.3:30000", "worker_type": "decode"}]
    # the only prefill host has no peer: taking it out would fail every request
    assert rollout_of(inv, "gpu-p") is None
    assert rollout_of(pd_inventory(("gpu-d",)), "gpu-d") is None


def test_a_decode_host_is_judged_against_the_later_decode_hosts_only() -> None:
    # the prefill comes after it in the inventory: its metrics are not a decode's
    inv = pd_inventory(("gpu-d", "gpu-e"))
    inv.hosts = {n: inv.get_host(n) for n in ("gpu-d", "gpu-p", "gpu-e")}
    assert rollout_of(inv, "gpu-d").later == ("http://10.77.0.3:30000",)
    assert rollout_of(inv, "gpu-e").later == ()


def test_restarting_a_roles_only_host_is_warned_before_any_change(caplog) -> None:
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert rollout_of(pd_inventory(("gpu-d", "gpu-e")), "gpu-p") is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert ("gpu-p: rolling switch: the only prefill server behind the gateway on gpu-p "
            "restarts without a drain: every request through the gateway fails") in said
    caplog.clear()
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert rollout_of(pd_inventory(("gpu-d", "gpu-e")), "gpu-d") is not None
    assert "restarts without a drain" not in " ".join(r.getMessage() for r in caplog.records)
