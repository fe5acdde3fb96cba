"""NCCL all-reduce across the hosts of one group: the launch, its environment, its gate.

Why: the measuring stage runs all_reduce_perf inside one host (NVLink or PCIe); a
multi-node engine's tensor or expert parallelism crosses the NICs, whose figure no
single-host run shows. nccl-tests needs MPI to run ranks on several hosts ("NCCL tests
rely on MPI to work on multiple processes, hence multiple nodes", its README): the
binary is built with ``MPI=1`` and started by Open MPI's ``mpirun`` on the first host of
the group, which starts the others' ranks over ssh. The environment comes from what
each host measured: ``NCCL_IB_HCA`` from the ACTIVE ports of its RDMA record, the
interface from host data ``nccl_socket_ifname``. The figure is judged like the
intra-host one (gpuserve.measure.gates.judge): every rank present, no wrong values,
busbw at the gate size against a floor of half the hosts' RDMA link rate, then against
the group's own baseline. docs/disaggregation.md "Between hosts" says what runs it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.measure.gates import Check, GateStatus, GateVerdict, busbw_at, judge
from gpuserve.parsers.nccl_tests import NcclTestsResult

#: the gate size: 4 GiB, as the NVLink classes' all-reduce check (expectations.yaml)
SIZE_BYTES = 4 * 1024 ** 3
#: the floor's fraction of the link rate (the pair measurement's, rdma.yaml)
FLOOR_SOURCE = ("half the hosts' summed ACTIVE RDMA link rate (sysfs ports/N/rate, in "
                "GB/s): nccl-tests' busbw is meant to approach the bottleneck link "
                "(nccl-tests doc/PERFORMANCE.md, 'Bus bandwidth'); the fraction is ours "
                "(gpuserve/data/host/rdma.yaml pairs.min_fraction_of_link)")


@dataclass(frozen=True)
class NodeHost:
    """One host of the group: its inventory name, where the others reach it, its GPUs
    and its recorded ACTIVE RDMA ports (``rdma.devices`` entries)."""

    name: str
    address: str
    gpus: int
    ports: tuple[dict, ...]


def nccl_env(host: NodeHost, socket_ifname: str | None) -> dict[str, str]:
    """NCCL's variables for the run from what the host recorded: ``NCCL_IB_HCA`` the
    ACTIVE devices (``=`` for exact names, NCCL's env docs), ``NCCL_SOCKET_IFNAME``
    the bootstrap interface where host data names it."""
    env: dict[str, str] = {}
    names = sorted({str(p["name"]) for p in host.ports if p.get("state") == "ACTIVE"})
    if names:
        env["NCCL_IB_HCA"] = "=" + ",".join(names)
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
    return env


def mpirun_command(hosts: list[NodeHost], env: dict[str, str], binary: str,
                   timeout_s: int, source: str) -> str:
    """Open MPI's launch of ``all_reduce_perf`` with one rank a GPU on every host (the
    first host runs it; ``timeout`` bounds it). Refuses a group of fewer than two hosts
    or hosts with different GPU counts (nccl-tests' ranks are uniform)."""
    if len(hosts) < 2:
        raise InputError(source, "rdma_pairs_group", "NCCL across nodes needs two hosts "
                         f"or more, the group has {len(hosts)}")
    counts = {h.gpus for h in hosts}
    if len(counts) != 1 or 0 in counts:
        raise InputError(source, "rdma_pairs_group", "NCCL across nodes needs the same "
                         "GPU count on every host, got " +
                         ", ".join(f"{h.name}: {h.gpus}" for h in hosts))
    per = counts.pop()
    slots = ",".join(f"{h.address}:{per}" for h in hosts)
    exports = " ".join(f"-x {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    mca = ""
    if env.get("NCCL_SOCKET_IFNAME"):
        ifname = shlex.quote(env["NCCL_SOCKET_IFNAME"])
        mca = f" --mca btl_tcp_if_include {ifname} --mca oob_tcp_if_include {ifname}"
    return (f"timeout {timeout_s} mpirun --allow-run-as-root -np {per * len(hosts)} "
            f"-H {slots} --bind-to none{mca} {exports} {shlex.quote(binary)} "
            f"-b 8 -e {SIZE_BYTES} -f 2 -g 1").replace("  ", " ")


def floor_gbs(hosts: list[NodeHost], fraction: float) -> float | None:
    """The busbw floor: ``fraction`` of the slowest host's summed ACTIVE link rate, in
    GB/s (None where a port records no rate)."""
    sums = []
    for h in hosts:
        rates = [p.get("rate_gbps") for p in h.ports if p.get("state") == "ACTIVE"]
        if not rates or None in rates:
            return None
        sums.append(sum(rates) / 8)
    return round(fraction * min(sums), 3)


def judge_across(result: NcclTestsResult, hosts: list[NodeHost], fraction: float,
                 baseline: float | None = None) -> list[GateVerdict]:
    """Every rank of every host present, no wrong values, busbw at :data:`SIZE_BYTES`
    above the floor and within 20 % of the group's baseline (the first run sets it)."""
    expected_ranks = sum(h.gpus for h in hosts)
    seen = {(r.host, r.device) for r in result.ranks}
    verdicts = [GateVerdict("ranks_present", GateStatus.PASS if len(seen) == expected_ranks
                            else GateStatus.FAIL,
                            f"{len(seen)} of {expected_ranks} GPUs on "
                            f"{len({r.host for r in result.ranks})} of {len(hosts)} hosts "
                            "took part", measured=len(seen), expected=expected_ranks)]
    if not result.ok:
        verdicts.append(GateVerdict("all_reduce_correct", GateStatus.FAIL,
                                    f"{result.wrong_total} wrong values, out of bounds "
                                    f"{result.out_of_bounds}"))
    bw = busbw_at(result, SIZE_BYTES)
    check = Check(metric="all_reduce_busbw", unit="GB/s", tolerance=0.2, source=FLOOR_SOURCE,
                  baseline=True, size_bytes=SIZE_BYTES, floor=floor_gbs(hosts, fraction))
    verdicts.append(judge(check, bw.value if bw else None, baseline))
    return verdicts
