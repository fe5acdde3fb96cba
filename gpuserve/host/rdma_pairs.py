"""RDMA between the hosts of one inventory group: which pairs, their commands, figures.

Why: a loopback (gpuserve.host.rdma.loopback_script) proves a device moves bytes, not
that two hosts reach each other at the link's rate (a cable, a switch port, a PFC or
MTU setting, a wrong GID all show only between hosts). Each host is measured against the
next one of its group (a ring: n pairs, not n^2), each pair's ACTIVE ports matched by
position (rail k to rail k), with perftest's ib_write_bw and ib_write_lat: the server on
the first host of the pair, the client on the second. How the deploy runs the two sides
in order, and the sources: docs/disaggregation.md "Between hosts".
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from gpuserve.errors import InputError
from gpuserve.host.rdma import catalog, roce_v2_index

PAIRS_PATH = "/etc/gpuserve/rdma-pairs.json"
#: the server side's outputs on the server host, one per device and tool
SERVER_LOG = "/run/gpuserve-rdma-pair-{port}.log"
#: the server side's process ids (of ``timeout``, which passes a TERM on to perftest)
SERVER_PIDS = "/run/gpuserve-rdma-pair-{port}.pids"
#: seconds the server waits for its client beyond the measurement itself
SERVER_GRACE = 30


@dataclass(frozen=True)
class PairSettings:
    """Host data ``rdma_pairs_group`` (the group, None: off), ``rdma_pairs_seconds`` (of
    ib_write_bw per port) and ``rdma_pairs_port`` (perftest's TCP port; a pair's port k
    uses PORT + 2k for bandwidth and PORT + 2k + 1 for latency)."""

    group: str
    seconds: int
    port: int


def pair_settings(data: dict[str, Any], source: str) -> PairSettings | None:
    """The pair measurement's host data, validated (None where no group is named)."""
    group = data.get("rdma_pairs_group")
    if group is None or group == "":
        return None
    if not isinstance(group, str):
        raise InputError(source, "rdma_pairs_group", f"must be a group name, got {group!r:.60}")
    seconds, port = data.get("rdma_pairs_seconds"), data.get("rdma_pairs_port")
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 60:
        raise InputError(source, "rdma_pairs_seconds", f"must be seconds from 1 to 60, "
                         f"got {seconds!r:.60}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65000:
        raise InputError(source, "rdma_pairs_port", f"must be a TCP port from 1024 to "
                         f"65000, got {port!r:.60}")
    return PairSettings(group, seconds, port)


@dataclass(frozen=True)
class Pair:
    """One measured pair: ``server`` runs the perftest servers, ``client`` connects to
    ``address`` (the server's ``private_address``, else its inventory name)."""

    server: str
    client: str
    address: str


def ring(names: list[str]) -> list[tuple[str, str]]:
    """Each host to the next of the group, the last to the first: n pairs for n > 2, one
    for two hosts, none for fewer."""
    if len(names) < 2:
        return []
    if len(names) == 2:
        return [(names[0], names[1])]
    return [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]


def rounds(names: list[str]) -> list[list[tuple[str, str]]]:
    """:func:`ring`'s pairs in rounds where no host is in two pairs (each pair measured
    alone on its hosts' NICs): two rounds for an even ring, three for an odd one."""
    out: list[list[tuple[str, str]]] = []
    for pair in ring(names):
        for group in out:
            if not {h for p in group for h in p} & set(pair):
                group.append(pair)
                break
        else:
            out.append([pair])
    return out


def address_of(name: str, data: dict[str, Any], source: str) -> str:
    """Where a client reaches ``name``'s perftest server: its ``private_address`` (the
    network the hosts share), else how the controller reaches it (``ssh_hostname``, the
    inventory name)."""
    value = data.get("private_address")
    if value in (None, ""):
        return str(data.get("ssh_hostname") or name)
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        raise InputError(source, f"private_address (host {name})",
                         f"{value!r:.60} is not an IP address") from None


def active(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ACTIVE ports of a host.json ``rdma`` record, in its order."""
    return [d for d in (record or {}).get("devices") or [] if d.get("state") == "ACTIVE"]


def matched(server: dict | None, client: dict | None) -> list[tuple[dict, dict]]:
    """The two hosts' ACTIVE ports matched by position (rail k to rail k)."""
    return list(zip(active(server), active(client), strict=False))


def _perftest_args(device: dict) -> str:
    """``-d DEV -i PORT`` and, on RoCE, ``-x`` the port's RoCE v2 GID index."""
    gid = roce_v2_index(device) if device.get("link_layer") == "Ethernet" else None
    return f"-d {device['name']} -i {int(device['port'])}" + (
        f" -x {gid}" if gid is not None else "") + " -F"


_TOOLS = (("ib_write_bw", "bw", 0), ("ib_write_lat", "lat", 1))


def _extra(tool: str, seconds: int) -> str:
    return f"-D {seconds} --report_gbits" if tool == "ib_write_bw" else "-n 1000"


def server_script(devices: list[dict], seconds: int, port: int) -> str:
    """Shell, on the server host: every matched port's two perftest servers, detached
    and bounded by ``timeout`` (they outlive this command: the client connects in the
    next operation), then up to 10 s until each listens."""
    limit = _server_limit(len(devices), seconds)
    pids = SERVER_PIDS.format(port=port)
    steps, ports = [f"rm -f {pids}"], []
    for k, device in enumerate(devices):
        for tool, _, offset in _TOOLS:
            p = port + 2 * k + offset
            ports.append(p)
            steps.append(f"setsid timeout {limit} {tool} {_perftest_args(device)} "
                         f"{_extra(tool, seconds)} -p {p} >{SERVER_LOG.format(port=p)} "
                         f"2>&1 </dev/null & echo $! >>{pids}")
    wait = " && ".join(f"ss -Hltn 'sport = :{p}' | grep -q ." for p in ports)
    return ("; ".join(steps) + f"; for _i in $(seq 20); do {{ {wait}; }} && exit 0; "
            "sleep 0.5; done; echo 'perftest servers not listening after 10 s' >&2; exit 1")


def _server_limit(pairs: int, seconds: int) -> int:
    """The servers' bound: every port's measurements one after the other, and grace."""
    return pairs * (seconds + SERVER_GRACE) + SERVER_GRACE


def client_script(pair: Pair, devices: list[dict], seconds: int, port: int) -> str:
    """Shell, on the client host: each matched port's ib_write_bw then ib_write_lat
    against the server, one after the other, each bounded and after a section marker."""
    from gpuserve.parsers.sections import marker

    steps = []
    for k, device in enumerate(devices):
        for tool, section, offset in _TOOLS:
            steps.append(f"echo '{marker(f'{section}{k}')}'; timeout {seconds + SERVER_GRACE} "
                         f"{tool} {_perftest_args(device)} {_extra(tool, seconds)} "
                         f"-p {port + 2 * k + offset} {pair.address} 2>&1")
    return "; ".join(steps) + "; true"


def stop_script(count: int, port: int) -> str:
    """Shell, on the server host after the clients: end what still runs of this pair's
    servers (a client that never came; by the process ids the start wrote), print their
    tails, remove their logs."""
    logs = " ".join(SERVER_LOG.format(port=port + i) for i in range(2 * count))
    pids = SERVER_PIDS.format(port=port)
    return (f"[ -f {pids} ] && for _p in $(cat {pids}); do kill \"$_p\" 2>/dev/null; done; "
            f"tail -n 3 {logs} 2>/dev/null; rm -f {logs} {pids}; true")


def pair_results(pair: Pair, ports: list[tuple[dict, dict]], output: str,
                 ) -> list[dict[str, Any]]:
    """One entry per matched port: the pair, both devices, the figures (or the tool's
    own error text) and the link rate they are judged against."""
    from gpuserve.parsers.rdma import latency_fields, parse_perftest_bw, parse_perftest_lat
    from gpuserve.parsers.sections import split_sections

    sections = split_sections(output)
    results = []
    for k, (sdev, cdev) in enumerate(ports):
        entry: dict[str, Any] = {
            "server": pair.server, "client": pair.client,
            "server_device": f"{sdev['name']}/{sdev['port']}",
            "client_device": f"{cdev['name']}/{cdev['port']}",
            "link_gbps": _link(sdev, cdev)}
        try:
            bw = parse_perftest_bw(sections.get(f"bw{k}", []))
            lat = parse_perftest_lat(sections.get(f"lat{k}", []))
        except ValueError as exc:
            tail = [line for line in sections.get(f"bw{k}", []) + sections.get(f"lat{k}", [])
                    if line.strip()][-3:]
            entry["error"] = f"{exc}: {' | '.join(tail)}"
        else:
            entry.update(write_bw_gbps=round(bw.average_gbps, 3), write_bw_size=bw.size_bytes,
                         **latency_fields(lat))
        results.append(entry)
    return results


def _link(a: dict, b: dict) -> float | None:
    """The slower end's link rate in Gb/s (None where a port does not record one)."""
    rates = [d.get("rate_gbps") for d in (a, b)]
    return None if None in rates else min(rates)


def min_fraction() -> float:
    """A pair below this fraction of its link rate is named (data: rdma.yaml)."""
    return float(catalog()["pairs"]["min_fraction_of_link"])


def slow(results: list[dict[str, Any]]) -> list[str]:
    """The evidence of each pair far below its link rate, or whose tools failed."""
    floor = min_fraction()
    found = []
    for r in results:
        name = (f"{r['server']} {r['server_device']} -> {r['client']} "
                f"{r['client_device']}")
        if "error" in r:
            found.append(f"{name}: not measured: {r['error']}")
        elif r.get("link_gbps") and r["write_bw_gbps"] < floor * r["link_gbps"]:
            found.append(f"{name}: {r['write_bw_gbps']} Gb/s, below {floor:.0%} of the "
                         f"{r['link_gbps']:g} Gb/s link")
    return found

