"""What a real server start measured: the record of one start on a host, and the
measurements a model record carries from public deployments.

``MeasuredStart`` is the typed record of one SGLang start: the memory figures SGLang
printed per rank (free before and after weights, KV pool, CUDA graphs; parsed by
gpuserve.memory.startup_log), with the checkpoint, SGLang version and launch settings
the start ran. A host writes one after each serve start; ``gpuserve plan --calibrate``
reads a startup log into one. gpuserve.memory.calibration plans a new launch from it.

``RecordMeasurement`` is a measured start of a model on a GPU quoted in the model
record's ``measured`` list (with its source): without a host's own measurement, the
planner's verdict is checked against every one of them.

How: docs/planner.md, "Calibrated by the host".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuserve.errors import InputError
from gpuserve.memory.startup_log import StartupLog, parse_log

SCHEMA = "gpuserve.measured-start/1"

#: server_args keys -> the planner's override names (gpuserve.memory.preflight
#: launch_settings); the layout keys take SGLang's defaults when a server_args line is
#: there without them.
_LAUNCH_KEYS = {
    "tp_size": "tp", "ep_size": "ep", "moe_a2a_backend": "moe_a2a_backend",
    "speculative_algorithm": "speculative", "mem_fraction_static": "mem_fraction_static",
    "kv_cache_dtype": "kv_cache_dtype", "cuda_graph_max_bs": "cuda_graph_max_bs",
    "chunked_prefill_size": "chunked_prefill_size",
}
_SGLANG_LAYOUT = {"tp": 1, "ep": 1, "attn_dp": 1, "moe_a2a_backend": "none",
                    "speculative": None}


@dataclass
class RankFigures:
    """One rank's figures, GiB (None: the log did not print it)."""

    rank: str
    free_before_weights_gib: float | None = None
    free_after_weights_gib: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    graph_gib: float | None = None


@dataclass
class MeasuredStart:
    """One server start's memory figures (the smallest rank's: SGLang sizes every rank
    by the minimum) and what ran: ``launch`` holds the server_args keys the log printed
    (tp_size, ep_size, mem_fraction_static, moe_a2a_backend, ...)."""

    source: str
    free_before_weights_gib: float | None
    free_after_weights_gib: float | None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    graph_gib: float | None = None
    ranks: list[RankFigures] = field(default_factory=list)
    sglang_version: str | None = None
    checkpoint: str | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    host: str | None = None
    gpu: str | None = None  # nvidia-smi name of the host's GPUs, if known
    recorded_at: str | None = None  # when the host recorded it (ISO 8601), if known

    @classmethod
    def from_log(cls, text: str, source: str, *, sglang_version: str | None = None,
                 checkpoint: str | None = None, host: str | None = None,
                 gpu: str | None = None, recorded_at: str | None = None) -> MeasuredStart:
        """Read a startup log's text; ``checkpoint`` defaults to its server_args
        ``model_path``. A log without "Load weight end" figures is an InputError."""
        return cls.from_startup_log(parse_log(text, source), sglang_version=sglang_version,
                                    checkpoint=checkpoint, host=host, gpu=gpu,
                                    recorded_at=recorded_at)

    @classmethod
    def from_startup_log(cls, log: StartupLog, *, sglang_version: str | None = None,
                         checkpoint: str | None = None, host: str | None = None,
                         gpu: str | None = None, recorded_at: str | None = None
                         ) -> MeasuredStart:
        """The figures of a parsed startup log (gpuserve.memory.startup_log)."""
        if log.avail_after_weights is None:
            raise InputError(log.source, "log", "no 'Load weight end. ... avail mem=' line: "
                             "the start measured nothing to calibrate with")
        ranks = [RankFigures(r.rank, r.load_begin_avail, r.load_end_avail, r.kv_gib,
                             r.kv_tokens, r.graph_usage or None) for r in log.ranks.values()]
        args = dict(log.server_args)
        return cls(source=log.source, free_before_weights_gib=log.pre_load_free,
                   free_after_weights_gib=log.avail_after_weights, kv_gib=log.kv_gib,
                   kv_tokens=log.kv_tokens, graph_gib=log.graph_usage, ranks=ranks,
                   sglang_version=sglang_version,
                   checkpoint=checkpoint or _str(args.pop("model_path", None)),
                   launch=args, ready=log.ready, host=host, gpu=gpu, recorded_at=recorded_at)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any, source: str = "<measured start>") -> MeasuredStart:
        """The record ``to_dict`` wrote; bad fields are an InputError naming them."""
        if not isinstance(data, dict):
            raise InputError(source, None, "a measured start must be a mapping")
        if data.get("schema", SCHEMA) != SCHEMA:
            raise InputError(source, "schema", f"expected {SCHEMA}, got {data.get('schema')!r}")
        numbers = {k: _number(data.get(k), source, k) for k in (
            "free_before_weights_gib", "free_after_weights_gib", "kv_gib", "graph_gib")}
        if numbers["free_after_weights_gib"] is None:
            raise InputError(source, "free_after_weights_gib", "required: SGLang's 'Load "
                             "weight end. avail mem' figure")
        ranks = data.get("ranks") or []
        if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
            raise InputError(source, "ranks", "must be a list of mappings")
        launch = data.get("launch") or {}
        if not isinstance(launch, dict):
            raise InputError(source, "launch", "must be a mapping of server_args keys")
        try:
            rank_list = [RankFigures(**r) for r in ranks]
        except TypeError as e:
            raise InputError(source, "ranks", str(e)) from None
        kv_tokens = data.get("kv_tokens")
        if kv_tokens is not None and (isinstance(kv_tokens, bool)
                                      or not isinstance(kv_tokens, int)):
            raise InputError(source, "kv_tokens", f"must be an integer, got {kv_tokens!r}")
        return cls(source=str(data.get("source") or source), ranks=rank_list,
                   kv_tokens=kv_tokens, sglang_version=_str(data.get("sglang_version")),
                   checkpoint=_str(data.get("checkpoint")), launch=dict(launch),
                   ready=bool(data.get("ready")), host=_str(data.get("host")),
                   gpu=_str(data.get("gpu")), recorded_at=_str(data.get("recorded_at")),
                   **numbers)

    def overrides(self) -> dict[str, Any]:
        """The measured launch as planner overrides (gpuserve.memory.preflight
        launch_settings' names); empty when the log printed no server_args."""
        if not self.launch:
            return {}
        out: dict[str, Any] = dict(_SGLANG_LAYOUT)
        for key, name in _LAUNCH_KEYS.items():
            if self.launch.get(key) is not None:
                out[name] = self.launch[key]
        if str(self.launch.get("enable_dp_attention")) == "True":
            out["attn_dp"] = int(self.launch.get("dp_size") or 1)
        return out

    def mismatch(self, *, checkpoint: str | None, sglang_version: str | None) -> str | None:
        """Why this start cannot calibrate a launch of ``checkpoint`` under
        ``sglang_version`` (None: it can). Unknown on either side is not a mismatch."""
        if checkpoint and self.checkpoint and checkpoint.rstrip("/") != self.checkpoint.rstrip("/"):
            return f"measured checkpoint {self.checkpoint}, this launch {checkpoint}"
        if sglang_version and self.sglang_version and sglang_version != self.sglang_version:
            return f"measured under SGLang {self.sglang_version}, this launch {sglang_version}"
        return None

    def launch_text(self) -> str:
        """The measured launch in a few words, for explanation lines."""
        o = self.overrides()
        if not o:
            return "launch settings not in the log"
        words = [f"tp {o['tp']}", f"ep {o['ep']}"]
        if o.get("attn_dp", 1) > 1:
            words.append(f"attn-dp {o['attn_dp']}")
        if o.get("moe_a2a_backend") not in (None, "none"):
            words.append(f"a2a {o['moe_a2a_backend']}")
        if o.get("speculative"):
            words.append(str(o["speculative"]))
        if o.get("mem_fraction_static") is not None:
            words.append(f"mem_fraction_static {o['mem_fraction_static']}")
        return ", ".join(words)


@dataclass(frozen=True)
class RecordMeasurement:
    """A measured start quoted in a model record (``measured:`` list): the GPU (a
    gpus.yaml key), the layout it ran, the figures SGLang printed, and where it is from."""

    gpu: str
    tp: int
    ep: int
    free_after_weights_gib: float
    source: str
    free_before_weights_gib: float | None = None
    checkpoint: str = ""
    sglang: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_RECORD_KEYS = {"gpu", "tp", "ep", "free_after_weights_gib", "free_before_weights_gib",
                "source", "checkpoint", "sglang", "note"}


def parse_record_measurements(value: Any, file: str) -> tuple[RecordMeasurement, ...]:
    """A model record's ``measured`` list; a bad entry is an InputError naming it."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(file, "measured", "must be a list of measured starts")
    out = []
    for i, entry in enumerate(value):
        where = f"measured[{i}]"
        if not isinstance(entry, dict):
            raise InputError(file, where, "must be a mapping")
        unknown = sorted(set(entry) - _RECORD_KEYS)
        if unknown:
            raise InputError(file, f"{where}.{unknown[0]}", "unknown key; known: "
                             + ", ".join(sorted(_RECORD_KEYS)))
        for key in ("gpu", "source"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise InputError(file, f"{where}.{key}", "required text")
        for key in ("tp", "ep"):
            v = entry.get(key, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(file, f"{where}.{key}", f"must be a positive integer, got {v!r}")
        after = _number(entry.get("free_after_weights_gib"), file,
                        f"{where}.free_after_weights_gib")
        if after is None:
            raise InputError(file, f"{where}.free_after_weights_gib", "required: the 'Load "
                             "weight end. avail mem' figure")
        before = _number(entry.get("free_before_weights_gib"), file,
                         f"{where}.free_before_weights_gib")
        out.append(RecordMeasurement(
            gpu=entry["gpu"], tp=entry.get("tp", 1), ep=entry.get("ep", 1),
            free_after_weights_gib=after, free_before_weights_gib=before,
            source=entry["source"], checkpoint=str(entry.get("checkpoint") or ""),
            sglang=str(entry.get("sglang") or ""), note=str(entry.get("note") or "")))
    return tuple(out)


def _number(value: Any, source: str, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value \
            or value < 0 or value > 1e5:
        raise InputError(source, key, f"must be GiB (a number >= 0), got {value!r}")
    return float(value)


def _str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
