"""What ``gpuserve compare`` shows, without printing it: runs grouped, latest vs baseline,
history with the change from run to run. Pure functions of a list of records.

Why grouped: after twenty no-op reruns a user wants one line per (host, profile,
scenario, workload): where the profile stands and how much it wobbles. Why a baseline
per host and workload: a figure from other hardware or another load says nothing about
a profile switch, so without one there is no comparison (never a guess).

How: docs/benchmarks.md, "gpuserve.measure.compare: groups, baselines and order"
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.measure.results import ResultRecord

SMOKE = "smoke"
NO_SCENARIO = "-"
# the figures a change is reported for ("output_tok_s": tok/s whatever the kind)
CHANGE_FIGURES = ("output_tok_s", "median_ttft_ms", "median_itl_ms")


def scenario_of(record: ResultRecord) -> str:
    if record.scenario:
        return record.scenario
    return SMOKE if record.kind == "smoke" else NO_SCENARIO


def figure(record: ResultRecord, key: str) -> float | None:
    return record.output_tok_s if key == "output_tok_s" else record.figures.get(key)


def lengths(record: ResultRecord) -> tuple[int | None, int | None]:
    return record.figures.get("random_input_len"), record.figures.get("random_output_len")


def chronological(records: Iterable[ResultRecord]) -> list[ResultRecord]:
    """Oldest first; untimestamped records first, in read order (docs/benchmarks.md)."""
    indexed = list(enumerate(records))
    indexed.sort(key=lambda ir: (ir[1].timestamp is not None, ir[1].timestamp or "", ir[0]))
    return [r for _, r in indexed]


def default_baseline(records: list[ResultRecord]) -> str | None:
    """The profile of the oldest record: "what I had before" the switches that followed."""
    return chronological(records)[0].profile if records else None


@dataclass(frozen=True)
class Group:
    """Every run of one host, profile, scenario and workload, oldest first."""

    host: str | None
    profile: str | None
    scenario: str
    runs: tuple[ResultRecord, ...]

    @property
    def latest(self) -> ResultRecord:
        return self.runs[-1]

    @property
    def kind(self) -> str:
        return self.latest.kind

    @property
    def tok_s_range(self) -> tuple[float, float] | None:
        values = [r.output_tok_s for r in self.runs if r.output_tok_s is not None]
        return (min(values), max(values)) if values else None


def _none_last(value) -> tuple:
    return (value is None, value if value is not None else 0)


def group_runs(records: Iterable[ResultRecord]) -> list[Group]:
    """Groups in first-run order (callers sort them for display)."""
    groups: dict[tuple, list[ResultRecord]] = {}
    for r in chronological(records):
        groups.setdefault((r.host, r.profile, scenario_of(r), r.workload), []).append(r)
    return [Group(host, profile, scenario, tuple(runs))
            for (host, profile, scenario, _), runs in groups.items()]


def _display_order(group: Group, baseline: str | None) -> tuple:
    """bench before smoke; per host, per workload (by concurrency); the baseline profile
    first within a workload, so profiles stand side by side."""
    r = group.latest
    inp, out = lengths(r)
    return (r.kind != "bench", group.host or "", _none_last(r.concurrency), group.scenario,
            _none_last(inp), _none_last(out), group.profile != baseline, group.profile or "")


@dataclass(frozen=True)
class Change:
    """A run against a reference run: percent change per :data:`CHANGE_FIGURES`."""

    reference: ResultRecord
    pct: dict[str, float | None]


def percent(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return (value - base) / base * 100.0


def change(record: ResultRecord, reference: ResultRecord | None) -> Change | None:
    if reference is None:
        return None
    return Change(reference, {k: percent(figure(record, k), figure(reference, k))
                              for k in CHANGE_FIGURES})


def reference_run(records: list[ResultRecord], baseline: str,
                  record: ResultRecord) -> ResultRecord | None:
    """The latest good run of ``baseline`` on ``record``'s host with its workload."""
    pool = [r for r in chronological(records)
            if r.profile == baseline and r.host == record.host
            and r.workload == record.workload and r.is_good]
    return pool[-1] if pool else None


@dataclass(frozen=True)
class LatestRow:
    group: Group
    is_baseline: bool
    change: Change | None  # None for the baseline profile and when nothing compares


def latest_view(records: list[ResultRecord], baseline: str, *, smoke: bool = False,
                pool: list[ResultRecord] | None = None) -> list[LatestRow]:
    """One row per group, the latest run against the baseline's (looked up in ``pool``,
    default ``records``: a filtered view still compares with the unfiltered baseline).
    Smoke groups only with ``smoke`` or when there is no bench record (they measure one
    request, not a load)."""
    pool = records if pool is None else pool
    groups = group_runs(records)
    if not smoke and any(g.kind == "bench" for g in groups):
        groups = [g for g in groups if g.kind == "bench"]
    groups.sort(key=lambda g: _display_order(g, baseline))
    rows = []
    for g in groups:
        is_base = g.profile == baseline
        ref = None if is_base else reference_run(pool, baseline, g.latest)
        rows.append(LatestRow(g, is_base, change(g.latest, ref)))
    return rows


@dataclass(frozen=True)
class HistoryRow:
    record: ResultRecord
    group: Group
    change: Change | None  # against the previous run of the same group
    changed: tuple[str, ...]  # what differs from the previous run's setup


def _what_changed(record: ResultRecord, previous: ResultRecord) -> tuple[str, ...]:
    out = []
    if record.sglang_version != previous.sglang_version:
        out.append(f"sglang {previous.sglang_version or '?'}->{record.sglang_version or '?'}")
    for key, label in (("lock", "lock"), ("profile_hash", "profile file"),
                       ("launch_hash", "launch")):
        if getattr(record, key) != getattr(previous, key):
            out.append(label)
    return tuple(out)


def history_view(records: list[ResultRecord], *, smoke: bool = False) -> list[HistoryRow]:
    """Every run, oldest first within its group, with the change from the run before and
    what changed in its setup (SGLang version, lock, profile file, launch)."""
    groups = group_runs(records)
    if not smoke and any(g.kind == "bench" for g in groups):
        groups = [g for g in groups if g.kind == "bench"]
    groups.sort(key=lambda g: (g.host or "", g.profile or "", _display_order(g, None)))
    rows = []
    for g in groups:
        previous = None
        for r in g.runs:
            rows.append(HistoryRow(r, g, change(r, previous),
                                   _what_changed(r, previous) if previous else ()))
            previous = r
    return rows


def select(records: list[ResultRecord], *, profile: str | None = None,
           host: str | None = None, scenario: str | None = None) -> list[ResultRecord]:
    """The records matching every filter given; an unknown value is an InputError that
    lists the known ones (a typo must not look like "no runs")."""
    for option, value, attr in (("--profile", profile, lambda r: r.profile),
                                ("--host", host, lambda r: r.host),
                                ("--scenario", scenario, scenario_of)):
        if value is None:
            continue
        known = sorted({str(attr(r)) for r in records})
        records = [r for r in records if attr(r) == value]
        if not records:
            raise InputError(None, option, f"no record with {option[2:]} {value!r} "
                             f"(known: {', '.join(known)})")
    return records


def check_baseline(records: list[ResultRecord], baseline: str) -> None:
    if baseline not in {r.profile for r in records}:
        known = ", ".join(sorted({str(r.profile) for r in records}))
        raise InputError(None, "--baseline", f"no record of profile {baseline!r} "
                         f"(profiles read: {known})")


# ----------------------------------------------------------------------------- JSON


def gate_text(record: ResultRecord) -> str | None:
    if record.gate is None:
        return None
    return "pass" if record.gate.get("passed") else "fail"


def run_dict(r: ResultRecord) -> dict:
    """The per-run keys of compare's JSON (stable; see gpuserve.commands.compare)."""
    inp, out = lengths(r)
    return {
        "host": r.host, "profile": r.profile, "scenario": scenario_of(r), "kind": r.kind,
        "concurrency": r.concurrency, "input_len": inp, "output_len": out,
        "timestamp": r.timestamp, "source": r.source,
        "output_tok_s": r.output_tok_s,
        "median_ttft_ms": r.figures.get("median_ttft_ms"),
        "median_itl_ms": r.figures.get("median_itl_ms"),
        "p99_ttft_ms": r.figures.get("p99_ttft_ms"),
        "sglang_version": r.sglang_version, "lock": r.lock, "launch_hash": r.launch_hash,
        "profile_hash": r.profile_hash, "gate": gate_text(r),
        "gate_misses": None if r.gate is None else r.gate.get("misses", []),
        "note": r.note,
    }


def change_dict(c: Change | None) -> dict | None:
    if c is None:
        return None
    return {"profile": c.reference.profile, "timestamp": c.reference.timestamp,
            "source": c.reference.source, "output_tok_s": c.reference.output_tok_s,
            "change_pct": {k: None if v is None else round(v, 2) for k, v in c.pct.items()}}


def latest_json(rows: list[LatestRow], baseline: str) -> dict:
    out = []
    for row in rows:
        span = row.group.tok_s_range
        out.append({**run_dict(row.group.latest), "runs": len(row.group.runs),
                    "output_tok_s_min": span[0] if span else None,
                    "output_tok_s_max": span[1] if span else None,
                    "is_baseline": row.is_baseline, "vs_baseline": change_dict(row.change)})
    return {"view": "latest", "baseline": baseline, "rows": out}


def history_json(rows: list[HistoryRow]) -> dict:
    return {"view": "history", "rows": [
        {**run_dict(row.record), "vs_previous": change_dict(row.change),
         "changed": list(row.changed)} for row in rows]}


# ----------------------------------------------------------------------------- gates
# gpuserve.measure/1 records (the host deploy's measured GPU gates, roles/gpu_gates) side
# by side: one row per host (its latest measurement) or, with history, every measurement.
# The collectives a profile's launch depends on: busbw at the gate size, the
# small-message latency, and whether P2P was kept on, and why.


@dataclass(frozen=True)
class GateRow:
    host: str
    timestamp: str
    source: str | None
    topology: str | None
    nccl_version: str | None
    p2p: bool | None
    p2p_result: str | None  # ok | hung | slower | not_measured (gates.measured_section)
    env: dict | None
    busbw_gbs: float | None  # all-reduce at the gate size, on the chosen path
    size_bytes: int | None
    busbw_status: str | None
    busbw_reference: float | None  # the expectation or the host's baseline
    busbw_reference_kind: str | None  # "expectation" | "baseline" | "floor"
    latency_us: float | None  # small-message all-reduce (8 B - 1 KiB), the chosen path
    p2p_on_gbs: float | None
    p2p_off_gbs: float | None
    p2p_on_hung: bool
    p2p_off_hung: bool
    all_gather_gbs: float | None
    alltoall_gbs: float | None
    failed: tuple[str, ...]  # checks that failed, and hangs on the chosen path
    runs: int  # measurements of this host (latest view), 1 in history

    @property
    def passed(self) -> bool:
        return not self.failed


def _numbers(doc: dict, key: str) -> dict:
    choice = doc.get("choice") if isinstance(doc.get("choice"), dict) else {}
    numbers = choice.get("numbers") if isinstance(choice.get("numbers"), dict) else {}
    run = numbers.get(key)
    return run if isinstance(run, dict) else {}


def _figure(doc: dict, prefix: str, size: int | None = None) -> float | None:
    figures = doc.get("figures") or {}
    if size is not None and f"{prefix}@{size}" in figures:
        return float(figures[f"{prefix}@{size}"])
    keys = sorted(k for k in figures if k.startswith(prefix + "@"))
    return float(figures[keys[-1]]) if keys else None


def gate_row(doc: dict, runs: int = 1) -> GateRow:
    """One measure record as a row (the record is checked already: validate_measure_record)."""
    from gpuserve.measure.gates import measured_section

    m = measured_section(doc, doc.get("_source"))
    verdicts = [v for v in doc.get("verdicts") or [] if isinstance(v, dict)]
    busbw = next((v for v in verdicts if str(v.get("check", "")).startswith(
        "all_reduce_busbw@")), {})
    on, off = _numbers(doc, "p2p_on"), _numbers(doc, "p2p_off")
    chosen = on if m["p2p"] else off
    latency = _figure(doc, "all_reduce_latency")
    if latency is None and isinstance(chosen.get("latency_us"), int | float):
        latency = float(chosen["latency_us"])
    label = "p2p_on" if m["p2p"] else "p2p_off"
    failed = [str(v.get("check")) for v in verdicts if v.get("status") in ("fail", "missing")
              and not str(v.get("check", "")).endswith(":no_hang")]
    failed += [f"{r.get('tool')} hung ({label})" for r in doc.get("runs") or []
               if isinstance(r, dict) and r.get("hang")
               and str(r.get("label", "")).rpartition(":")[2] == label]
    choice = doc.get("choice") if isinstance(doc.get("choice"), dict) else None
    if choice is None:
        failed.append("no NCCL env chosen")
    elif choice.get("ready") is False:
        failed.append("no working collective path")

    def gbs(run: dict) -> float | None:
        value = run.get("busbw_gbs")
        return float(value) if isinstance(value, int | float) else None

    size = m["all_reduce_size_bytes"]
    ref = busbw.get("expected")
    return GateRow(
        host=str(doc["host"]), timestamp=str(doc["timestamp"]), source=doc.get("_source"),
        topology=m["topology_class"], nccl_version=doc.get("nccl_version")
        if isinstance(doc.get("nccl_version"), str) else None,
        p2p=m["p2p"], p2p_result=m["p2p_result"], env=m["env"],
        busbw_gbs=m["all_reduce_busbw_gbs"], size_bytes=size,
        busbw_status=m["all_reduce_status"],
        busbw_reference=float(ref) if isinstance(ref, int | float) else None,
        busbw_reference_kind=busbw.get("reference") if isinstance(
            busbw.get("reference"), str) else None,
        latency_us=latency, p2p_on_gbs=gbs(on), p2p_off_gbs=gbs(off),
        p2p_on_hung=bool(on.get("hang")), p2p_off_hung=bool(off.get("hang")),
        all_gather_gbs=_figure(doc, "all_gather_busbw", size),
        alltoall_gbs=_figure(doc, "alltoall_busbw", size),
        failed=tuple(dict.fromkeys(failed)), runs=runs)


def gate_view(measures: list[dict], *, history: bool = False,
              host: str | None = None) -> list[GateRow]:
    """Latest measurement per host (hosts in name order), or every one oldest first per
    host with ``history``; ``host`` keeps one host."""
    by_host: dict[str, list[dict]] = {}
    for doc in sorted(measures, key=lambda d: (str(d["host"]), str(d["timestamp"]))):
        if host is None or doc["host"] == host:
            by_host.setdefault(str(doc["host"]), []).append(doc)
    if history:
        return [gate_row(d) for docs in by_host.values() for d in docs]
    return [gate_row(docs[-1], runs=len(docs)) for docs in by_host.values()]


def gate_dict(row: GateRow) -> dict:
    """The per-row keys of compare's JSON ``gates`` list (stable)."""
    return {
        "host": row.host, "timestamp": row.timestamp, "source": row.source,
        "topology_class": row.topology, "nccl_version": row.nccl_version,
        "p2p": row.p2p, "p2p_result": row.p2p_result, "env": row.env,
        "all_reduce_busbw_gbs": row.busbw_gbs, "size_bytes": row.size_bytes,
        "busbw_status": row.busbw_status, "busbw_reference_gbs": row.busbw_reference,
        "busbw_reference": row.busbw_reference_kind,
        "all_reduce_latency_us": row.latency_us,
        "p2p_on_busbw_gbs": row.p2p_on_gbs, "p2p_off_busbw_gbs": row.p2p_off_gbs,
        "p2p_on_hung": row.p2p_on_hung, "p2p_off_hung": row.p2p_off_hung,
        "all_gather_busbw_gbs": row.all_gather_gbs, "alltoall_busbw_gbs": row.alltoall_gbs,
        "passed": row.passed, "failed": list(row.failed), "runs": row.runs,
    }
