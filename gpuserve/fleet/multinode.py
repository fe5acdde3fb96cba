"""Where one host stands in a multi-node SGLang launch, from the inventory group.

Why: a model too large for one box runs as one SGLang engine across N hosts: every host
runs the same launch with ``--nnodes N --node-rank R --dist-init-addr HEAD:PORT``, only
node 0 serves HTTP (fleet.md section 9, from SGLang's multi_node docs and the 0.5.23
wheel). Writing the rank and the head's address into a profile by hand is how a
two-host launch ends up with two rank-0 nodes waiting on each other for ever. Here the
profile says how many nodes (``parallel.nnodes``) and the dist-init port; the rank is
the host's position in its inventory group (host data ``sglang_nodes_group``) and the
address is the first host's ``private_address``. Every check runs before any host
changes, and names the inventory file and field.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpuserve.errors import InputError

#: One Linux interface name: at most IFNAMSIZ - 1 = 15 bytes, no '/', whitespace or ':'
#: (net/core/dev.c dev_valid_name). NCCL_SOCKET_IFNAME also knows '^' (exclude) and
#: prefix matching, Gloo does not: one exact name means the same to both.
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


@dataclass(frozen=True)
class Member:
    """One host of the group, as the inventory lists it: its name and host data."""

    name: str
    data: dict


@dataclass(frozen=True)
class NodePlacement:
    """This host's part in the launch."""

    nnodes: int
    rank: int
    dist_init_addr: str  # HEAD_ADDRESS:PORT (IPv6 in brackets)
    head: str  # inventory name of node 0, the only one serving HTTP
    env: dict[str, str]  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME when set

    @property
    def is_head(self) -> bool:
        return self.rank == 0


def _address(member: Member, source: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    value = member.data.get("private_address")
    where = f"private_address (host {member.name})"
    if value is None or value == "":
        raise InputError(source, where, "required on every host of a multi-node group: the "
                         "address the nodes reach each other on (node 0's is the "
                         "dist-init address)")
    if not isinstance(value, str):
        raise InputError(source, where, f"must be an IP address string, got {value!r:.60}")
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise InputError(source, where, f"{value!r:.60} is not an IP address") from None
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        raise InputError(source, where, f"{address} cannot be reached from another host")
    return address


def place_node(*, nnodes: int, dist_init_port: int, profile_source: str,
               group: str | None, members: Sequence[Member] | None, host_name: str,
               source: str) -> NodePlacement | None:
    """This host's placement, or None for a single-node profile (``nnodes`` 1).

    ``group`` is host data ``sglang_nodes_group``; ``members`` the hosts of that group
    in inventory order (None when the inventory has no such group). The profile's own
    fields (the port not being server.port) are checked when it loads."""
    if nnodes <= 1:
        return None
    if not group or not isinstance(group, str):
        raise InputError(source, "sglang_nodes_group", f"required: the profile "
                         f"({profile_source}) runs on {nnodes} nodes; name the inventory "
                         "group whose hosts run it, in node-rank order")
    if members is None:
        raise InputError(source, "sglang_nodes_group", f"no inventory group {group!r:.60}")
    if len(members) != nnodes:
        raise InputError(source, "sglang_nodes_group", f"group {group!r:.60} has "
                         f"{len(members)} host(s), the profile ({profile_source}) runs on "
                         f"parallel.nnodes={nnodes}")
    names = [m.name for m in members]
    if host_name not in names:
        raise InputError(source, "sglang_nodes_group",
                         f"host {host_name} is not in group {group!r:.60}")
    seen: dict[str, str] = {}
    addresses = []
    for member in members:
        address = _address(member, source)
        if str(address) in seen:
            raise InputError(source, f"private_address (host {member.name})",
                             f"{address} is also host {seen[str(address)]}'s: every node "
                             "needs its own address")
        seen[str(address)] = member.name
        addresses.append(address)
    head = addresses[0]
    host_part = f"[{head}]" if head.version == 6 else str(head)
    me = next(m for m in members if m.name == host_name)
    env: dict[str, str] = {}
    ifname = me.data.get("nccl_socket_ifname")
    if ifname not in (None, ""):
        if not isinstance(ifname, str) or not _IFNAME.match(ifname):
            raise InputError(source, f"nccl_socket_ifname (host {host_name})",
                             f"{ifname!r:.60} is not one network interface name (e.g. eth1 "
                             "or ens5f0)")
        # NCCL's and Gloo's bootstrap sockets on the network the nodes share
        # (fleet.md section 9: the docs pin both when a node has several NICs)
        env = {"NCCL_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname}
    return NodePlacement(nnodes=nnodes, rank=names.index(host_name),
                         dist_init_addr=f"{host_part}:{dist_init_port}", head=names[0],
                         env=env)
