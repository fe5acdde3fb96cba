"""RDMA between the hosts of one group: perftest server on one host, client on the next.

The pairs, ports and commands are gpuserve.host.rdma_pairs's; here they run. Every host
of the group adds the same three operations a round (start the servers, run the
clients, stop the servers), each doing its part or nothing: pyinfra runs one operation
on every host and waits for all of them before the next, so a round's servers listen
before its clients connect and are ended after they finish. ``--serial`` (host after
host) or ``--no-wait`` would run a server's start and stop before its client, so both
are refused before any host changes. Each step is bounded (``timeout``, a 10 s listen
wait). Why this and not a second channel: docs/disaggregation.md "Between hosts".
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FunctionCommand, operation

from gpuserve.errors import InputError
from gpuserve.facts.compat import cli_params
from gpuserve.host import rdma as rdma_host
from gpuserve.host import rdma_pairs
from gpuserve.roles import rdma
from gpuserve.roles.base import planned
from gpuserve.roles.base.inventory import group_members, inventory_source
from gpuserve.roles.base.run_context import run_context


def _ports(pair: rdma_pairs.Pair) -> list[tuple[dict, dict]]:
    """The pair's matched ACTIVE ports from both hosts' records (known once every host
    of the run has prepared, so read at execute time)."""
    return rdma_pairs.matched(rdma.record_of(pair.server), rdma.record_of(pair.client))


def _start(pair: rdma_pairs.Pair, seconds: int, port: int):
    def run(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        devices = [s for s, _ in _ports(pair)]
        if not devices:
            host.log(f"RDMA pair {pair.server} -> {pair.client}: no matched ACTIVE ports")
            return True
        ok, output = host.run_shell_command(rdma_pairs.server_script(devices, seconds, port))
        if not ok:
            host.log("RDMA pair servers: " + " | ".join(output.stderr_lines[-3:]))
        return ok

    return run


def _client(pair: rdma_pairs.Pair, seconds: int, port: int):
    def run(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        ports = _ports(pair)
        if not ports:
            return True
        script = rdma_pairs.client_script(pair, [c for _, c in ports], seconds, port)
        _, output = host.run_shell_command(script)
        results = rdma_pairs.pair_results(
            pair, ports, "\n".join(output.stdout_lines + output.stderr_lines))
        for r in results:
            host.log(f"RDMA pair {r['server']} {r['server_device']} -> {r['client']} "
                     f"{r['client_device']}: {rdma_host.figures(r)}")
        for evidence in rdma_pairs.slow(results):
            host.log(f"RDMA pair below its link: {evidence}")
        return rdma.write_record(host, rdma_pairs.PAIRS_PATH,
                                 {"seconds": seconds, "pairs": results})

    return run


def _stop(pair: rdma_pairs.Pair, port: int):
    def run(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        count = len(_ports(pair))
        if count:
            host.run_shell_command(rdma_pairs.stop_script(count, port))
        return True

    return run


@operation(is_idempotent=False)
def pair_step(step: str, pairs: list[rdma_pairs.Pair], seconds: int, port: int):
    """One step of a round on this host: its pair's servers, client or stop, or none."""
    if step == "client":
        mine = [p for p in pairs if p.client == host.name]
    else:
        mine = [p for p in pairs if p.server == host.name]
    if not mine:
        host.noop(f"no RDMA pair {step} on this host this round")
        return
    pair = mine[0]
    body = (_start(pair, seconds, port) if step == "start" else
            _client(pair, seconds, port) if step == "client" else _stop(pair, port))
    yield FunctionCommand(body, (), {})


def plan_pairs(settings: rdma_pairs.PairSettings) -> list[list[rdma_pairs.Pair]]:
    """The group's rounds of pairs with each server's address; refuses what cannot
    run (no such group, ``--serial``) before any host changes."""
    source = inventory_source()
    members = group_members(settings.group)
    if not members:
        raise InputError(source, "rdma_pairs_group", f"no inventory group "
                         f"{settings.group!r} with hosts")
    if run_context().serial or cli_params().get("no_wait"):
        raise InputError(source, "rdma_pairs_group", "the pair measurement runs a "
                         "server and a client on two hosts at once: run the host deploy "
                         "without --serial or --no-wait (each operation on every host "
                         "before the next)")
    data = {m.name: m.data for m in members}
    return [[rdma_pairs.Pair(s, c, rdma_pairs.address_of(s, data[s], source))
             for s, c in group] for group in rdma_pairs.rounds([m.name for m in members])]


def measure_pairs(settings: rdma_pairs.PairSettings | None) -> None:
    """ib_write_bw/ib_write_lat between each host of ``settings.group`` and the next,
    a round at a time (three operations each, on every host of the group)."""
    if settings is None:
        return
    rounds = plan_pairs(settings)
    if not any(host.name in (p.server, p.client) for r in rounds for p in r):
        return
    planned.action(f"ib_write_bw/ib_write_lat between the hosts of {settings.group}, "
                   f"{settings.seconds} s a port (writes {rdma_pairs.PAIRS_PATH} on "
                   "each client)", changes=False)
    for pairs in host.loop(rounds):
        port = settings.port
        for step in host.loop(("start", "client", "stop")):
            pair_step(name=f"RDMA pairs: {step}", step=step, pairs=pairs,
                      seconds=settings.seconds, port=port)

