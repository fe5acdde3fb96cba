"""Start records: what a host's GPUs had free at one start of the SGLang service.

Why: the planner works from a checkpoint's headers or a model record, and a real box can
load more than either implies (the field notes' TP8 start left 21.7 GiB after weights
where the headers imply 38). The serve deploy keeps SGLang's own memory figures of each
start (per rank: free before and after weights, KV pool, free after the pool, graph
capture) with the checkpoint's identity, the SGLang version and the launch, as one
``gpuserve.start/1`` file beside the host's result records; the next plan on that host
calibrates from the last one of the same checkpoint and version (docs/deploys.md,
"Measured starts").

Bounded and checked when read back: a file over :data:`MAX_BYTES`, more than
:data:`MAX_RANKS` ranks or a field of the wrong type is skipped with the file and field
named; it never reaches a plan.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.measure.record_files import safe_name, write_new_file
from gpuserve.memory.startup_log import StartupLog, diagnose

SCHEMA = "gpuserve.start/1"
#: a start record is a few KiB (64 ranks of 9 figures); anything larger is not one
MAX_BYTES = 256 * 1024
MAX_RANKS = 512
#: records read per host, newest first (older ones are history, not calibration)
MAX_READ = 200
RANK_FIGURES = ("free_before_weights_gib", "free_after_weights_gib", "weights_gib",
                "kv_pool_gib", "kv_tokens", "free_after_pool_gib", "graph_gib",
                "free_after_graphs_gib")
LAUNCH_KEYS = {"profile": str, "tp": int, "ep": int, "attn_dp": int,
               "moe_a2a_backend": str, "mem_fraction_static": float,
               "cuda_graph_max_bs": int, "speculative": str, "kv_cache_dtype": str}


@dataclass(frozen=True)
class Checkpoint:
    """Which weights a start loaded: the directory, and the scan's digest of its files
    (names and sizes; None where the scan was not read)."""

    path: str
    digest: str | None = None

    def same(self, other: Checkpoint) -> bool:
        """The same checkpoint: same directory, and same files where both were scanned."""
        if self.path != other.path:
            return False
        return self.digest is None or other.digest is None or self.digest == other.digest


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures in GiB as SGLang logged them (None: not logged)."""

    rank: str
    free_before_weights_gib: float | None = None
    free_after_weights_gib: float | None = None
    weights_gib: float | None = None
    kv_pool_gib: float | None = None
    kv_tokens: int | None = None
    free_after_pool_gib: float | None = None
    graph_gib: float | None = None
    free_after_graphs_gib: float | None = None


@dataclass(frozen=True)
class StartRecord:
    """One start of the service on one host, as recorded."""

    host: str
    timestamp: str
    server_start: str  # the journal's "Started" line stamp: which start this was
    sglang_version: str
    checkpoint: Checkpoint
    launch: dict
    outcome: str  # the startup-log diagnosis' outcome: ready, refused-no-kv, ...
    ranks: tuple[RankFigures, ...] = ()
    error: str | None = None
    # the host's smallest GPU (SGLang sizes every rank by it) and how many it has:
    # {name, memory_total_mib, compute_cap, count}; None where not known
    gpu: dict | None = None
    # where the start's time went, seconds per phase (gpuserve/measure/start_phases.py);
    # added to gpuserve.start/1 compatibly: a record without it reads as before
    phases: dict | None = None
    source: str | None = field(default=None, compare=False)  # the file; not stored

    def _min(self, name: str) -> float | None:
        values = [getattr(r, name) for r in self.ranks if getattr(r, name) is not None]
        return min(values) if values else None

    @property
    def free_before_weights_gib(self) -> float | None:
        """SGLang sizes every rank by the emptiest: the minimum over ranks."""
        return self._min("free_before_weights_gib")

    @property
    def free_after_weights_gib(self) -> float | None:
        return self._min("free_after_weights_gib")

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc.pop("source")
        return {"schema": SCHEMA, **doc, "ranks": [asdict(r) for r in self.ranks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class StartSpec:
    """What the serve deploy knows at prepare time about the start it will record."""

    results_dir: str
    sglang_version: str
    checkpoint: Checkpoint
    launch: dict
    gpu: dict | None = None
    #: the host data's secrets (the plan's), redacted from a recorded error line
    secrets: tuple[str, ...] = ()


def gpu_of(gpus: list[dict]) -> dict | None:
    """A start record's ``gpu`` from the host's GPU facts (NvidiaGpus dicts): the
    smallest card, as SGLang sizes every rank by it, and the count."""
    if not gpus:
        return None
    small = min(gpus, key=lambda g: float(g.get("memory_total_mib") or 0))
    return {"name": str(small.get("name") or ""), "count": len(gpus),
            "memory_total_mib": float(small.get("memory_total_mib") or 0),
            "compute_cap": str(small.get("compute_cap") or "")}


def checkpoint_digest(files: list[tuple[str, int]]) -> str:
    """The digest of a checkpoint's files, (name, size) pairs in any order."""
    text = json.dumps(sorted([str(n), int(s)] for n, s in files))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def from_log(log: StartupLog, spec: StartSpec, *, host: str, timestamp: str,
             server_start: str, error: str | None = None,
             phases: dict | None = None) -> StartRecord:
    """A record of the start ``log`` (the journal lines of that start, parsed) of what
    ``spec`` launched, with its start-up ``phases``. The effective ``mem_fraction_static``
    is SGLang's own where its server_args line says it (an auto fraction is resolved
    there)."""
    launch = {**spec.launch, **_logged_launch(log.server_args)}
    ranks = tuple(RankFigures(
        rank=name, free_before_weights_gib=r.load_begin_avail,
        free_after_weights_gib=r.load_end_avail, weights_gib=r.weights_usage,
        kv_pool_gib=r.kv_gib, kv_tokens=r.kv_tokens, free_after_pool_gib=r.pool_end_avail,
        graph_gib=r.graph_usage or None, free_after_graphs_gib=r.graph_end_avail)
        for name, r in sorted(log.ranks.items())[:MAX_RANKS])
    return StartRecord(host=host, timestamp=timestamp, server_start=server_start,
                       sglang_version=spec.sglang_version, checkpoint=spec.checkpoint,
                       launch=_launch(launch, "<launch>"), outcome=diagnose(log).outcome,
                       ranks=ranks, error=(error or None) and str(error)[:300],
                       gpu=_gpu(spec.gpu, "<gpu>"), phases=_phases(phases, "<phases>"))


def _logged_launch(args: dict) -> dict:
    """The launch keys SGLang's own server_args line resolved (an auto fraction, the ep
    size an all-to-all backend forces), in the record's names."""
    out: dict = {}
    for key, arg in _SERVER_ARGS.items():
        value = args.get(arg)
        if key == "mem_fraction_static" and isinstance(value, int | float):
            out[key] = float(value)
        elif key in ("tp", "ep", "cuda_graph_max_bs") and isinstance(value, int):
            out[key] = value
        elif key in ("moe_a2a_backend", "speculative") and isinstance(value, str):
            out[key] = None if value.lower() == "none" else value
    return out


def record_path(results_dir: str | Path, record: StartRecord) -> Path:
    stamp = record.timestamp.replace("-", "").replace(":", "")
    profile = str(record.launch.get("profile") or "unknown")
    return Path(results_dir) / safe_name(record.host) / f"{stamp}-start-{safe_name(profile)}.json"


def write_start(results_dir: str | Path, record: StartRecord) -> Path:
    """Write ``record`` as a new file under ``results_dir/<host>/`` (never overwrites)."""
    text = record.to_json() + "\n"
    return write_new_file(record_path(results_dir, record), text)


# ----------------------------------------------------------------------------- reading


def parse_start(doc: object, source: str) -> StartRecord:
    """Check one ``gpuserve.start/1`` document; an InputError names the file and field."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(source, "schema", f"not a {SCHEMA} document")

    def text(key: str, optional: bool = False) -> str | None:
        value = doc.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value or len(value) > 300:
            raise InputError(source, key, "must be a non-empty string (at most 300 chars)")
        return value

    cp = doc.get("checkpoint")
    if not isinstance(cp, dict) or not isinstance(cp.get("path"), str) or not (
            cp.get("digest") is None or isinstance(cp.get("digest"), str)):
        raise InputError(source, "checkpoint", "must be {path: str, digest: str|null}")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or not ranks or len(ranks) > MAX_RANKS:
        raise InputError(source, "ranks", f"must be a list of 1 to {MAX_RANKS} ranks")
    return StartRecord(
        host=text("host"), timestamp=text("timestamp"), server_start=text("server_start"),
        sglang_version=text("sglang_version"),
        checkpoint=Checkpoint(cp["path"], cp.get("digest")),
        launch=_launch(doc.get("launch"), source), outcome=text("outcome"),
        ranks=tuple(_rank(r, source, i) for i, r in enumerate(ranks)),
        error=text("error", optional=True), gpu=_gpu(doc.get("gpu"), source),
        phases=_phases(doc.get("phases"), source), source=source)


def _phases(value: object, source: str) -> dict | None:
    """A record's ``phases``: seconds per known phase, or None (older records)."""
    from gpuserve.measure.start_phases import PHASES

    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise InputError(source, "phases", "must be an object of seconds per phase")
    for key, v in value.items():
        if key not in PHASES:
            raise InputError(source, f"phases.{key}", f"not a phase; one of {', '.join(PHASES)}")
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e7:
            raise InputError(source, f"phases.{key}", "must be seconds, 0 or more")
    return {k: float(value[k]) for k in PHASES if k in value}


def _gpu(value: object, source: str) -> dict | None:
    if value is None:
        return None
    ok = (isinstance(value, dict) and isinstance(value.get("name"), str)
          and len(value["name"]) <= 200 and isinstance(value.get("compute_cap"), str)
          and len(value["compute_cap"]) <= 20
          and _in_range(int, value.get("count"))
          and isinstance(value.get("memory_total_mib"), int | float)
          and not isinstance(value.get("memory_total_mib"), bool)
          and 0 < value["memory_total_mib"] < 1 << 24)
    if not ok:
        raise InputError(source, "gpu", "must be {name, memory_total_mib, compute_cap, count}")
    return {"name": value["name"], "memory_total_mib": float(value["memory_total_mib"]),
            "compute_cap": value["compute_cap"], "count": value["count"]}


def _launch(value: object, source: str) -> dict:
    if not isinstance(value, dict):
        raise InputError(source, "launch", "must be an object")
    out: dict = {}
    for key, kind in LAUNCH_KEYS.items():
        v = value.get(key)
        if v is not None and not _in_range(kind, v):
            raise InputError(source, f"launch.{key}", f"must be a {kind.__name__} in range")
        out[key] = float(v) if kind is float and v is not None else v
    return out


def _in_range(kind: type, v: object) -> bool:
    """A launch value of ``kind`` within what a launch can hold (a fraction in (0, 1],
    a positive count, a short text)."""
    if isinstance(v, bool):
        return False
    if kind is float:
        return isinstance(v, int | float) and math.isfinite(v) and 0 < v <= 1
    if kind is int:
        return isinstance(v, int) and 0 < v < 1 << 20
    return isinstance(v, str) and len(v) <= 200


def _rank(value: object, source: str, index: int) -> RankFigures:
    where = f"ranks[{index}]"
    if not isinstance(value, dict) or not isinstance(value.get("rank"), str) \
            or len(value["rank"]) > 40:
        raise InputError(source, f"{where}.rank", "must be a string")
    figures: dict = {}
    for key in RANK_FIGURES:
        v = value.get(key)
        ok = v is None or (isinstance(v, int | float) and not isinstance(v, bool)
                           and math.isfinite(v) and -1e4 < v < 1e6)
        if not ok:
            raise InputError(source, f"{where}.{key}", "must be a finite number or null")
        figures[key] = (int(v) if key == "kv_tokens" else float(v)) if v is not None else None
    return RankFigures(rank=value["rank"], **figures)


def read_starts(results_dir: str | Path, host: str,
                skipped: list[str] | None = None) -> list[StartRecord]:
    """The host's start records under ``results_dir/<host>/``, newest first; a file that
    does not read is skipped (with its reason appended to ``skipped``)."""
    folder = Path(results_dir) / safe_name(host)
    try:
        paths = sorted((p for p in folder.glob("*-start-*.json")
                        if not p.name.startswith(".")), reverse=True)[:MAX_READ]
    except OSError:
        return []
    found = []
    for path in paths:
        try:
            doc = safeload.loads_json(safeload.read_text(path, MAX_BYTES), str(path))
            found.append(parse_start(doc, str(path)))
        except (InputError, OSError) as e:
            if skipped is not None:
                skipped.append(f"{path}: {e}")
    return sorted(found, key=lambda r: r.timestamp, reverse=True)


def last_measured(records: list[StartRecord], checkpoint: Checkpoint,
                  sglang_version: str, gpu: dict | None = None,
                  launch: dict | None = None) -> StartRecord | None:
    """The start that measured the weights of ``checkpoint`` under ``sglang_version``
    (free memory before and after weights logged) closest to ``launch`` (``launch_of``
    the new profile: fewest of the settings that move the weights differ, so the
    planner's delta bridges the least), the newest of those; else None. With ``gpu``
    (``gpu_of`` the host's GPUs now), only a start on the same cards counts: a host whose
    GPUs changed has not measured this launch yet."""
    found = [r for r in records
             if r.sglang_version == sglang_version and r.checkpoint.same(checkpoint)
             and r.free_before_weights_gib is not None
             and r.free_after_weights_gib is not None
             and (gpu is None or same_cards(r.gpu, gpu))]
    if not found:
        return None
    newest = sorted(found, key=lambda r: r.timestamp, reverse=True)
    return min(newest, key=lambda r: _launch_distance(r.launch, launch))


#: the launch settings that change what the weights leave free on a GPU
_WEIGHT_LAYOUT = ("tp", "ep", "attn_dp", "moe_a2a_backend", "speculative")


def _launch_distance(recorded: dict, launch: dict | None) -> int:
    """How many of the weight layout's settings differ (0 without a launch to match)."""
    if not launch:
        return 0
    return sum(recorded.get(k) != launch.get(k) for k in _WEIGHT_LAYOUT)


def same_cards(recorded: dict | None, now: dict) -> bool:
    """Whether a start recorded on ``recorded`` GPUs measured the host's cards ``now``
    (name, memory.total and count; a record without its GPU is taken as the same)."""
    if recorded is None:
        return True
    return (recorded.get("name") == now.get("name")
            and recorded.get("count") == now.get("count")
            and abs(float(recorded.get("memory_total_mib") or 0)
                    - float(now.get("memory_total_mib") or 0)) < 1.0)


# ------------------------------------------------------------------ use in a plan


_SERVER_ARGS = {"tp": "tp_size", "ep": "ep_size", "moe_a2a_backend": "moe_a2a_backend",
                "mem_fraction_static": "mem_fraction_static",
                "cuda_graph_max_bs": "cuda_graph_max_bs", "speculative": "speculative_algorithm",
                "kv_cache_dtype": "kv_cache_dtype"}


def to_measured(record: StartRecord):
    """``record`` as the calibration's measured start (gpuserve.memory.measured)."""
    from gpuserve.memory.measured import MeasuredStart
    from gpuserve.memory.measured import RankFigures as Figures

    launch = {arg: record.launch.get(key) for key, arg in _SERVER_ARGS.items()
              if record.launch.get(key) is not None}
    attn_dp = record.launch.get("attn_dp") or 1
    if attn_dp > 1:
        launch.update(enable_dp_attention="True", dp_size=attn_dp)

    def largest(name: str) -> float | None:
        values = [getattr(r, name) for r in record.ranks if getattr(r, name) is not None]
        return max(values) if values else None

    tokens = [r.kv_tokens for r in record.ranks if r.kv_tokens is not None]
    return MeasuredStart(
        source=record.source or f"start record of {record.host} at {record.timestamp}",
        free_before_weights_gib=record.free_before_weights_gib,
        free_after_weights_gib=record.free_after_weights_gib, kv_gib=largest("kv_pool_gib"),
        kv_tokens=min(tokens) if tokens else None, graph_gib=largest("graph_gib"),
        ranks=[Figures(r.rank, r.free_before_weights_gib, r.free_after_weights_gib,
                       r.kv_pool_gib, r.kv_tokens, r.graph_gib) for r in record.ranks],
        sglang_version=record.sglang_version, checkpoint=record.checkpoint.path,
        launch=launch, ready=record.outcome == "ready", host=record.host,
        gpu=(record.gpu or {}).get("name"), recorded_at=record.timestamp)


def launch_of(profile) -> dict:
    """The launch a start record keeps of ``profile`` (the planner's names)."""
    from gpuserve.memory.preflight import launch_settings

    settings = launch_settings(profile)
    layout, knobs = settings.layout, settings.knobs
    return {"profile": profile.name, "tp": layout.tp, "ep": layout.ep,
            "attn_dp": layout.attn_dp,
            "moe_a2a_backend": None if layout.moe_a2a_backend == "none"
            else layout.moe_a2a_backend,
            "mem_fraction_static": knobs.get("mem_fraction_static"),
            "cuda_graph_max_bs": knobs.get("cuda_graph_max_bs"),
            "speculative": layout.speculative, "kv_cache_dtype": knobs.get("kv_cache_dtype")}
