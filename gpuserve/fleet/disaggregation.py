"""Where one host stands in a prefill-decode (PD) fleet, from the inventory groups.

Why: SGLang's PD disaggregation runs prefill servers (``--disaggregation-mode prefill``,
a bootstrap server on ``--disaggregation-bootstrap-port``) and decode servers
(``--disaggregation-mode decode``) behind smg in PD mode, the KV cache moving from one
to the other through a transfer engine (Mooncake or NIXL). Like a multi-node launch
(gpuserve/fleet/multinode.py), the role is the inventory's to say: host data
``sglang_prefill_group`` and ``sglang_decode_group`` name the two groups (group data of
the whole fleet, the gateway's too), a host plays the role of the group it is in, and
the profile's ``disaggregation:`` block (gpuserve/launch/disaggregation.py) says what
both share and what each role changes. Everything here is checked before any host
changes, by the serve deploy and ``gpuserve check`` alike, and names file and field.

How: docs/disaggregation.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.fleet.multinode import Member
from gpuserve.launch.disaggregation import ROLES, backends
from gpuserve.launch.profiles import Profile, load_profile, load_profile_with

#: Host data of a PD fleet (merged into the serve deploy's defaults).
PD_DEFAULTS = {
    # the inventory group whose hosts run the prefill role of a profile with a
    # disaggregation: block (group data of the fleet, the gateway's too)
    # accepts: str (an inventory group) or None
    "sglang_prefill_group": None,
    # the inventory group whose hosts run its decode role
    # accepts: str (an inventory group) or None
    "sglang_decode_group": None,
}

#: What a TCP transfer costs against RDMA, said in every fallback warning: Mooncake's
#: TCP transport moves the KV cache through host memory and the kernel's sockets, about
#: 1-3 GB/s a stream against 25-50 GB/s for one 200-400 Gb/s RDMA NIC (docs/disaggregation.md).
TCP_COST = ("the KV cache moves over TCP through host memory (about 1-3 GB/s against "
            "25-50 GB/s over one 200-400 Gb/s RDMA NIC): time to first token grows by "
            "the prompt's KV size over that")


@dataclass(frozen=True)
class PdPlacement:
    """This host's role and the fleet it is part of (members in inventory order)."""

    role: str
    prefill: tuple[Member, ...]
    decode: tuple[Member, ...]

    @property
    def ratio(self) -> str:
        return f"{len(self.prefill)} prefill : {len(self.decode)} decode"


@dataclass(frozen=True)
class PdLaunch:
    """The PD flags of one host's launch, and what the plan says about them."""

    args: tuple[str, ...]
    env: dict[str, str]
    backend: str  # as rendered (mooncake_tcp where no RDMA device is recorded)
    ib_devices: tuple[str, ...]
    warnings: tuple[str, ...]
    role: str = ""
    ratio: str = ""  # the fleet's hosts per role (PdPlacement.ratio)

    @property
    def summary(self) -> str:
        devices = ", IB " + ",".join(self.ib_devices) if self.ib_devices else ", no RDMA device"
        return f"PD {self.role} ({self.ratio}), {self.backend}{devices}"


def role_profile(profile: Profile, role: str) -> Profile:
    """``profile`` with its ``disaggregation.<role>`` fields merged on top (as a child
    file would be) and its mode set; every error names the line of the role's block."""
    spec = profile.disaggregation
    assert spec is not None
    prefix = f"disaggregation.{role}."
    origins = {k[len(prefix):]: v for k, v in profile.locations.items() if k.startswith(prefix)}
    merged = profile
    if role in spec.overrides:
        merged = load_profile_with(profile.source, spec.overrides[role], origins,
                                   profile.name)
        # a multi-node placement (fleet/multinode.py) set on the profile stays
        merged = dataclasses.replace(merged, parallel=dataclasses.replace(
            merged.parallel, node_rank=profile.parallel.node_rank,
            dist_init_addr=profile.parallel.dist_init_addr))
    mode = dataclasses.replace(merged.disaggregation or spec, mode=role)
    return dataclasses.replace(merged, disaggregation=mode)


def _groups(data: dict, source: str, members_of: Callable[[str], list[Member] | None]
            ) -> tuple[list[Member], list[Member]]:
    """The prefill and decode groups' hosts; both must exist and have hosts."""
    found = []
    for role in ROLES:
        key = f"sglang_{role}_group"
        group = data.get(key)
        if not group or not isinstance(group, str):
            raise InputError(source, key, f"required: the profile has a disaggregation: "
                             f"block; name the inventory group whose hosts run its {role} "
                             "role")
        hosts = members_of(group)
        if not hosts:
            raise InputError(source, key, f"no {role} host: inventory group {group!r:.60} "
                             f"{'is empty' if hosts is not None else 'does not exist'} (a "
                             f"PD fleet needs at least one prefill and one decode host)")
        found.append(hosts)
    prefill, decode = found
    both = {m.name for m in prefill} & {m.name for m in decode}
    if both:
        raise InputError(source, "sglang_decode_group", f"host {sorted(both)[0]} is in both "
                         "the prefill and the decode group: one server plays one role")
    return prefill, decode


def place_role(profile: Profile, data: dict, host_name: str, source: str,
               members_of: Callable[[str], list[Member] | None]
               ) -> tuple[Profile, PdPlacement | None]:
    """This host's role profile and placement, or (profile, None) outside a PD fleet."""
    if profile.disaggregation is None:
        for role in ROLES:
            group = data.get(f"sglang_{role}_group")
            hosts = members_of(group) if isinstance(group, str) and group else None
            if hosts and any(m.name == host_name for m in hosts):
                raise InputError(source, f"sglang_{role}_group", f"host {host_name} is in "
                                 f"the {role} group {group!r:.60}, but its profile "
                                 f"({profile.source}) has no disaggregation: block")
        return profile, None
    prefill, decode = _groups(data, source, members_of)
    role = next((r for r, hosts in zip(ROLES, (prefill, decode), strict=True)
                 if any(m.name == host_name for m in hosts)), None)
    if role is None:
        raise InputError(source, "sglang_prefill_group", f"host {host_name} is in neither "
                         f"the prefill group ({data['sglang_prefill_group']}) nor the decode "
                         f"group ({data['sglang_decode_group']}); its profile "
                         f"({profile.source}) is a PD profile")
    check_fleet(profile, data, host_name, [*prefill, *decode], source)
    mine = role_profile(profile, role)
    check_ports(mine, data, source)
    return mine, PdPlacement(role, tuple(prefill), tuple(decode))


def _member_profile(member: Member, source: str) -> Profile:
    ref = member.data.get("profile")
    if not ref or not isinstance(ref, str):
        raise InputError(source, f"profile (host {member.name})", "required on every host "
                         "of a PD fleet: both roles must serve the same model")
    return load_profile(ref)


def check_fleet(profile: Profile, data: dict, host_name: str, members: Sequence[Member],
                source: str) -> None:
    """Refuse a fleet whose roles cannot talk: another model or served name, another
    SGLang release (pinned or allowed), another transfer backend, a host outside PD."""
    spec = profile.disaggregation
    assert spec is not None
    mine = (profile.model.path, profile.model.served_name)
    pin = data.get("sglang_version") or None
    for member in members:
        if member.name == host_name:
            continue
        other = _member_profile(member, source)
        where = f"(host {member.name}, profile {other.source})"
        if other.disaggregation is None:
            raise InputError(source, f"profile {where}", "has no disaggregation: block: "
                             "every host of the prefill and decode groups serves a PD profile")
        if (other.model.path, other.model.served_name) != mine:
            raise InputError(source, f"profile {where}", f"serves {other.model.path} "
                             f"(served as {other.model.served_name}), host {host_name} serves "
                             f"{mine[0]} (served as {mine[1]}): a mismatched model between "
                             "roles cannot take the other's KV cache")
        if other.disaggregation.transfer_backend != spec.transfer_backend:
            raise InputError(source, f"profile {where}", f"transfer backend "
                             f"{other.disaggregation.transfer_backend}, host {host_name}'s is "
                             f"{spec.transfer_backend}: both roles need the same engine")
        other_pin = member.data.get("sglang_version") or None
        if other_pin != pin or set(other.sglang_versions) != set(profile.sglang_versions):
            raise InputError(source, f"sglang_version (host {member.name})", f"mismatched "
                             f"SGLang version between roles: {other_pin or 'unpinned'} "
                             f"{sorted(other.sglang_versions) or ''}, host {host_name} "
                             f"{pin or 'unpinned'} {sorted(profile.sglang_versions) or ''}; "
                             "pin one sglang_version in the fleet's group data")


def check_ports(profile: Profile, data: dict, source: str) -> None:
    """A prefill host's bootstrap port may not be a port something else on the host
    listens on: its server, a multi-node launch's dist-init port, a gateway, exporters."""
    spec = profile.disaggregation
    if spec is None or spec.mode != "prefill":
        return  # only the prefill side listens on it (SGLang's bootstrap server)
    port = spec.bootstrap_port
    taken = {"server.port": profile.server.port}
    if profile.parallel.nnodes > 1:
        taken["parallel.dist_init_port"] = profile.parallel.dist_init_port
    if data.get("router_workers_group"):  # this host is the gateway too
        taken["router_port"] = data.get("router_port", 30080)
        taken["router_prometheus_port"] = data.get("router_prometheus_port", 29000)
    for key, default in (("node_exporter_port", 9100), ("dcgm_exporter_port", 9400)):
        taken[key] = data.get(key, default)
    for what, used in taken.items():
        if used == port:
            raise profile.error("disaggregation.bootstrap_port", f"{port} is also {what} "
                                f"({'profile' if '.' in what else 'host data'}): a bootstrap "
                                "port clash; give the prefill's bootstrap server its own port")


def backend_problem(lock_packages: Sequence[str], backend: str, lock_name: str) -> str | None:
    """Why a lock cannot run ``backend`` (none of its packages pinned), or None."""
    entry = backends()[backend]
    have = {p.lower().replace("_", "-") for p in lock_packages}
    if any(p in have for p in entry.packages):
        return None
    return (f"transfer backend {backend} is missing from the lock {lock_name}: it pins none "
            f"of {', '.join(entry.packages)} (SGLang imports {entry.module} when it starts "
            "its KV manager: the server would die at start); generate a lock with one "
            "(tools/gen_lock.py) or choose another backend")


def rdma_devices(host_json_lines: list[str] | None, source: str) -> tuple[str, ...] | None:
    """The active RDMA devices the host deploy recorded in host.json (``rdma.devices``:
    name and state per port), or None when nothing was recorded. Never guessed."""
    if not host_json_lines:
        return None
    doc = safeload.loads_json("\n".join(host_json_lines), source)
    rdma = doc.get("rdma") if isinstance(doc, dict) else None
    if not isinstance(rdma, dict) or not isinstance(rdma.get("devices"), list):
        return None
    names = []
    for device in rdma["devices"]:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        if "ACTIVE" in str(device.get("state", "")).upper() and device["name"] not in names:
            names.append(device["name"])
    return tuple(names)


#: The flags this module renders: a profile's extra_args may not set them (the role and
#: the IB devices come from the inventory and the host's record).
OWN_FLAGS = ("--disaggregation-mode", "--disaggregation-transfer-backend",
             "--disaggregation-bootstrap-port", "--disaggregation-ib-device")


def pd_launch(profile: Profile, *, catalog, lock_name: str, lock_packages: Sequence[str],
              host_json_lines: list[str] | None, record_path: str, ratio: str = ""
              ) -> PdLaunch:
    """The role's SGLang flags, checked against the lock (its backend's package) and
    the version's flag catalog; a host without a recorded RDMA device gets none and
    the backend's TCP transport, with a warning naming its cost."""
    spec = profile.disaggregation
    assert spec is not None and spec.mode in ROLES
    problem = backend_problem(lock_packages, spec.transfer_backend, lock_name)
    if problem:
        raise profile.error("disaggregation.transfer_backend", problem)
    for index, arg in enumerate(profile.extra_args):
        if arg.split("=", 1)[0] in OWN_FLAGS:
            raise profile.error(f"extra_args[{index}]", f"{arg.split('=', 1)[0]} is set from "
                                "the inventory and the host's record (disaggregation: block, "
                                "sglang_prefill_group/sglang_decode_group)")
    devices = rdma_devices(host_json_lines, record_path)
    backend, warnings = spec.transfer_backend, []
    if not devices:
        fallback = backends()[backend].tcp_fallback
        option = catalog.option("--disaggregation-transfer-backend")
        if fallback and option is not None and fallback in (option.choices or ()):
            backend = fallback
        why = (f"no {record_path} (deploy/host.py records the RDMA devices)" if
               devices is None and not host_json_lines else
               f"no RDMA device recorded in {record_path}" if devices is None else
               f"no active RDMA port in {record_path}")
        warnings.append(f"PD {spec.mode}: {why}: TCP fallback ({backend}, no "
                        f"--disaggregation-ib-device); {TCP_COST}")
    args = ["--disaggregation-mode", spec.mode, "--disaggregation-transfer-backend", backend]
    if spec.mode == "prefill":  # the bootstrap server runs on the prefill side only
        args += ["--disaggregation-bootstrap-port", str(spec.bootstrap_port)]
    if devices and backend == "mooncake":  # NIXL picks its devices through UCX
        args += ["--disaggregation-ib-device", ",".join(devices)]
    origin = profile.where("disaggregation")
    catalog.validate(["--model-path", profile.model.path or "m", *args], source=origin.file,
                     field="disaggregation", line=origin.line)
    return PdLaunch(tuple(args), {}, backend, devices or (), tuple(warnings), spec.mode,
                    ratio)


def gateway_role(member: Member, members_of: Callable[[str], list[Member] | None],
                 source: str) -> tuple[str, int | None] | None:
    """A worker's (role, bootstrap port) for smg's PD mode, from its host data and
    profile as the serve deploy places it; None for a regular worker."""
    ref = member.data.get("profile")
    profile = load_profile(ref) if isinstance(ref, str) and ref else None
    if profile is None or profile.disaggregation is None:
        return None
    placed, where = place_role(profile, member.data, member.name, source, members_of)
    assert where is not None and placed.disaggregation is not None
    port = placed.disaggregation.bootstrap_port if where.role == "prefill" else None
    return where.role, port


def gateway_problems(roles: Sequence[tuple[str, bool]], group: str) -> tuple[list[str],
                                                                           list[str]]:
    """(errors, warnings) of a gateway's workers by (role or "regular", drained): smg's
    PD mode routes prefill and decode workers only, and needs one of each serving."""
    kinds = {role for role, _ in roles}
    if "regular" in kinds and kinds - {"regular"}:
        return [f"group {group} mixes PD workers (prefill, decode) with regular ones: smg "
                "in PD mode routes only prefill-decode pairs; serve them behind two "
                "gateways"], []
    if "regular" in kinds or not kinds:
        return [], []
    warnings = []
    for role in ROLES:
        serving = [d for r, d in roles if r == role and not d]
        if not serving:
            warnings.append(f"no {role} worker of group {group} is serving (drained or none): "
                            "every request through the gateway fails until one is back")
        elif len(serving) == 1:
            warnings.append(f"one {role} worker only: a rolling switch takes it out and the "
                            "gateway serves nothing while it restarts; give each role two "
                            "hosts to switch with 0 failed requests")
    return [], warnings
