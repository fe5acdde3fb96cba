"""Put a tune together from its file and one host snapshot: knobs resolved and checked,
the search's context (profiles, judging, calibration), before anything loads.

Shared by ``gpuserve tune`` (gpuserve/commands/tune.py) and the lab's bench script, so
both run the same preparation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuserve.launch.profiles import load_profile
from gpuserve.memory.checkpoint import CheckpointScan, parse_scan
from gpuserve.tune.candidates import Candidate
from gpuserve.tune.defaults import auto_values
from gpuserve.tune.judge import avail_after_weights, judge
from gpuserve.tune.predict import Comm
from gpuserve.tune.search import Context
from gpuserve.tune.snapshot import HostSnapshot, last_start
from gpuserve.tune.space import Knob, TuneSpec, candidate_profile, check_space, knob_values


@dataclass
class Prepared:
    spec: TuneSpec
    knobs: tuple[Knob, ...]
    snapshot: HostSnapshot
    scan: CheckpointScan | None
    ctx: Context


def resolve_knobs(spec: TuneSpec, raw: dict[str, Any], incumbent, scan: CheckpointScan | None,
                  snapshot: HostSnapshot) -> tuple[Knob, ...]:
    arch = scan.arch(incumbent.model.arch or None) if scan is not None else None
    knobs = []
    for name, values in raw.items():
        name = str(name)
        if values == "auto":
            values = auto_values(name, spec, incumbent, arch, snapshot.gpus,
                                 snapshot.sglang_version)
        knobs.append(knob_values(name, values, spec))
    return tuple(knobs)


def precheck(spec: TuneSpec, raw: dict[str, Any]) -> None:
    """Check every listed (not ``auto``) knob value against each SGLang version the
    incumbent targets, before the host is even read (bad input changes nothing)."""
    from gpuserve.errors import InputError
    from gpuserve.launch.dialect import target_version

    try:
        incumbent = load_profile(spec.incumbent)
    except InputError as e:
        raise spec.error("incumbent", f"the profile {spec.incumbent} is refused: {e}") from e
    knobs = tuple(knob_values(str(name), values, spec) for name, values in raw.items()
                  if values != "auto")
    for version in incumbent.sglang_versions or [target_version(incumbent)]:
        check_space(spec, knobs, version)


def comm_from(measures: list[dict], host: str, host_facts: dict | None) -> Comm:
    """The host's measured collectives: the latest ``gpuserve.measure/1`` record's small
    all-reduce latency and bus bandwidth, else host facts' measured busbw."""
    mine = sorted((m for m in measures if m.get("host") == host),
                  key=lambda m: str(m.get("timestamp") or ""))
    figures: dict[str, Any] = mine[-1].get("figures") or {} if mine else {}

    def first(prefix: str) -> float | None:
        for key, value in figures.items():
            if key.startswith(prefix) and isinstance(value, int | float):
                return float(value)
        return None

    busbw = first("all_reduce_busbw@")
    if busbw is None and isinstance(host_facts, dict):
        measured = host_facts.get("measured")
        if isinstance(measured, dict) and isinstance(measured.get("all_reduce_busbw_gbs"),
                                                     int | float):
            busbw = float(measured["all_reduce_busbw_gbs"])
    return Comm(first("all_reduce_latency@"), busbw, first("alltoall_latency@"))


def prepare(spec: TuneSpec, raw_knobs: dict[str, Any], snapshot: HostSnapshot, *,
            comm: Comm, log: Callable[[str], None], stamp: Callable[[], str],
            extra_key: str = "") -> Prepared:
    """Everything before the first load; bad input raises InputError here."""
    incumbent = load_profile(spec.incumbent)
    scan = parse_scan(snapshot.checkpoint, f"{snapshot.host}: checkpoint scan") \
        if snapshot.checkpoint else None
    knobs = resolve_knobs(spec, raw_knobs, incumbent, scan, snapshot)
    check_space(spec, knobs, snapshot.sglang_version)
    cache: dict[str, Any] = {}

    def profile_for(candidate: Candidate):
        if candidate.name not in cache:
            cache[candidate.name] = candidate_profile(spec, candidate.choice, candidate.name)
        return cache[candidate.name]

    def judged(profile, calibration: float | None):
        return judge(profile, scan, snapshot, calibration_gib=calibration, comm=comm,
                     peak_batch=max(spec.loads))

    def planner_after(profile) -> float | None:
        return avail_after_weights(profile, scan, snapshot) if scan is not None else None

    timing = last_start(snapshot.journal)
    ctx = Context(profile_for=profile_for, judge=judged, planner_after=planner_after,
                  config_key=snapshot.config_key() + extra_key, incumbent=incumbent,
                  comm=comm, load_estimate_s=timing.load_s if timing else None, log=log,
                  stamp=stamp)
    return Prepared(spec, knobs, snapshot, scan, ctx)
