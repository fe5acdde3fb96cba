"""Parse a real SGLang startup log and explain how its memory budget came out.

The lines come from SGLang's own format strings (0.5.23 wheel):
``model_executor/model_runner.py`` ("Load weight begin/end"), ``mem_cache/memory_pool.py``
("KV Cache is allocated"), ``mem_cache/kv_cache_configurator.py`` ("Memory pool end",
the "Loaded weights leave no GPU memory" ValueError), ``model_executor/pool_configurator.py``
("Not enough memory"), ``distributed/bootstrap.py`` ("memory capacity is unbalanced"),
``model_executor/model_runner_components/cuda_graph_setup.py`` ("Capture ... CUDA graph
begin/end") and ``managers/scheduler.py`` ("max_total_num_tokens=..."). Older builds (early
2025) print "Load weight end" without ``mem usage``, "KV Cache is allocated. K size" without
``#tokens`` and "Capture cuda graph end. Time elapsed: ... mem usage=... avail mem=...";
those parse too. "GB" in these lines is GiB (``get_available_gpu_memory`` divides by 1 << 30).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR
from gpuserve.terminal import signed_term

GIB = 1 << 30
_NUM = r"(-?\d+(?:\.\d+)?)"
_PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<ranks>(?: [A-Z]+\d+)*)\]\s?")
# What a log collector puts before SGLang's own line, stripped so that the rank prefix
# above is read as in the raw log (a wrapped line read raw merged every rank into one):
#  * journalctl(1) output modes (https://www.freedesktop.org/software/systemd/man/latest/
#    journalctl.html, --output): short "Mon DD HH:MM:SS", short-precise (with
#    microseconds), short-iso / short-iso-precise (ISO 8601 with the zone), short-full
#    ("Day YYYY-MM-DD HH:MM:SS TZ"), then "host identifier[pid]: ";
#  * docker logs --timestamps (https://docs.docker.com/reference/cli/docker/container/logs/):
#    an RFC3339Nano timestamp and one space.
_ISO_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"
_JOURNAL = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
    rf"|{_ISO_TS}"
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [A-Za-z+\-\d]+)"
    r" [^\s\[]\S* [^\s\[:]+(?:\[\d+\])?: "
)
_DOCKER = re.compile(rf"^{_ISO_TS} ")

_PATTERNS: dict[str, re.Pattern[str]] = {
    "init_dist_end": re.compile(rf"Init torch distributed ends\. mem usage={_NUM} GB"),
    "load_begin": re.compile(rf"Load weight begin\. avail mem={_NUM} GB"),
    "load_end": re.compile(
        rf"Load weight end\.(?P<body>.*?)avail mem={_NUM} GB(?:, mem usage={_NUM} GB)?"
    ),
    "kv": re.compile(
        r"(?P<label>[\w-]+ )?KV Cache (?:is allocated|VA upper bound)\."
        r"(?: dtype: (?P<dtype>[\w.]+),)?(?: #tokens: (?P<tokens>\d+),)?"
        rf"(?: K size: {_NUM} GB, V size: {_NUM} GB| KV size: {_NUM} GB)"
    ),
    "pool_end": re.compile(rf"Memory pool end\. avail mem={_NUM} GB"),
    "graph_begin": re.compile(
        rf"Capture (?P<what>.*?)(?:CUDA|cuda) graph begin\..*?avail mem={_NUM} GB"
    ),
    # The figures are read by name (_GRAPH_USAGE, _GRAPH_AVAIL): builds differ in their
    # order and some print mem usage alone ("... graph end. elapsed=14.74 s, mem usage=1.53 GB.").
    "graph_end": re.compile(r"Capture (?P<what>.*?)(?:CUDA|cuda) graph end\."),
    "capturing": re.compile(rf"Capturing batches \(bs=(\d+) avail_mem={_NUM} GB\)"),
    "scheduler": re.compile(
        r"max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<cps>-?\d+).*?"
        r"max_running_requests=(?P<mrr>\d+).*?context_len=(?P<ctx>\d+)"
        rf"(?:, available_gpu_mem={_NUM} GB)?"
    ),
    "err_no_kv": re.compile(
        r"Loaded weights leave no GPU memory for the KV cache under "
        rf"--mem-fraction-static={_NUM}\.?(?: Raise --mem-fraction-static above {_NUM} "
        rf"\(minimum viable = 1 - available/pre = {_NUM}\))?"
    ),
    "err_not_enough": re.compile(
        r"Not enough memory\. Please try to increase --mem-fraction-static\."
        rf"(?: Current value: mem_fraction_static={_NUM})?"
    ),
    "err_unbalanced": re.compile(
        r"The memory capacity is unbalanced\. Some GPUs may be occupied by other processes\."
        rf"(?: pre_model_load_memory={_NUM}, local_gpu_memory={_NUM})?"
    ),
    "err_oom": re.compile(
        r"(?:CUDA out of memory|OutOfMemoryError)[.:]?(?:.*?Tried to allocate "
        rf"{_NUM} (?P<unit>[GM]iB))?(?:.*?of which {_NUM} (?P<unit2>[GM]iB) is free)?"
    ),
    "err_capture": re.compile(r"Capture (?:prefill )?(?:cuda|CUDA) graph failed"),
    "ready": re.compile(r"The server is fired up and ready to roll!"),
    # Any other exception that ends a traceback ("Scheduler hit an exception: ..."), e.g.
    # "RuntimeError: Assertion error (...): Unsupported architecture": checked last.
    "err_exception": re.compile(
        r"^(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (?P<msg>\S.*)$"
    ),
}
_GRAPH_USAGE = re.compile(rf"mem usage={_NUM} GB")
_GRAPH_AVAIL = re.compile(rf"avail mem={_NUM} GB")
# Two spellings: ``server_args=ServerArgs(mem_fraction_static=0.78, ...)`` (older
# releases) and ``server_args={'mem_fraction_static': 0.78, ...}`` (0.5.x:
# entrypoints/engine.py logs ``_server_args_for_logging(server_args)``, a dict).
_SERVER_ARGS = re.compile(r"server_args=(?:ServerArgs\((?P<body>.*)\)|(?P<dict>\{.*\}))")
_ARG_KEYS = {
    "mem_fraction_static": float,
    "tp_size": int,
    "ep_size": int,
    "dp_size": int,
    "attn_dp_size": int,
    "pp_size": int,
    "chunked_prefill_size": int,
    "cuda_graph_max_bs": int,
    "max_running_requests": int,
    "kv_cache_dtype": str,
    "moe_a2a_backend": str,
    "enable_dp_attention": str,
    "model_path": str,
    "speculative_algorithm": str,
}


@dataclass
class RankLog:
    """Figures one rank printed, in GiB."""

    rank: str
    load_begin_avail: float | None = None
    load_end_avail: float | None = None
    weights_usage: float | None = None
    kv_tokens: int | None = None
    kv_dtype: str | None = None
    kv_gib: float | None = None
    draft_kv_gib: float | None = None
    pool_end_avail: float | None = None
    graph_usage: float = 0.0
    graph_end_avail: float | None = None
    last_capture_avail: float | None = None


@dataclass
class StartupLog:
    source: str
    ranks: dict[str, RankLog] = field(default_factory=dict)
    server_args: dict[str, object] = field(default_factory=dict)
    load_type: str | None = None
    quant: str | None = None
    scheduler: dict[str, float] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    ready: bool = False
    # crash texts matched to the doctor rule that explains them (log_signatures.yaml)
    signals: list[dict] = field(default_factory=list)

    def _min(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.ranks.values() if getattr(r, attr) is not None]
        return min(values) if values else None

    def _max(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.ranks.values() if getattr(r, attr) is not None]
        return max(values) if values else None

    @property
    def pre_load_free(self) -> float | None:
        return self._min("load_begin_avail")

    @property
    def avail_after_weights(self) -> float | None:
        return self._min("load_end_avail")

    @property
    def weights_usage(self) -> float | None:
        return self._max("weights_usage")

    @property
    def kv_tokens(self) -> int | None:
        tokens = self._min("kv_tokens")
        return int(tokens) if tokens is not None else self.scheduler.get("max_total_num_tokens")

    @property
    def kv_gib(self) -> float | None:
        return self._max("kv_gib")

    @property
    def graph_usage(self) -> float | None:
        return self._max("graph_usage") or None

    def error(self, kind: str) -> dict | None:
        return next((e for e in self.errors if e["kind"] == kind), None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            pre_load_free=self.pre_load_free,
            avail_after_weights=self.avail_after_weights,
            weights_usage=self.weights_usage,
            kv_tokens=self.kv_tokens,
            kv_gib=self.kv_gib,
            graph_usage=self.graph_usage,
        )
        return d


def _f(value: str | None) -> float | None:
    return float(value) if value is not None else None


def _parse_server_args(body: str, dict_form: bool = False) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, kind in _ARG_KEYS.items():
        sep = rf"'{key}':\s*" if dict_form else rf"\b{key}="
        m = re.search(rf"{sep}('(?P<s>[^']*)'|(?P<v>[^,)}}\s]+))", body)
        if not m:
            continue
        raw = m.group("s") if m.group("s") is not None else m.group("v")
        if raw == "None":
            continue
        try:
            out[key] = kind(raw)
        except ValueError:
            continue
    return out


def _rank(log: StartupLog, rank: str) -> RankLog:
    return log.ranks.setdefault(rank, RankLog(rank))


def parse_log(text: str, source: str = "<log>") -> StartupLog:
    """Collect every memory figure, per rank, and every memory error of a startup log."""
    log = StartupLog(source=source)
    seen_lines = 0
    bodies: list[tuple[int, str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        line = _unwrapped(line)
        m = _PREFIX.match(line)
        rank = (m.group("ranks").strip() or "rank0") if m else "rank0"
        body = line[m.end() :] if m else line
        bodies.append((lineno, rank, body))
        sa = _SERVER_ARGS.search(body)
        if sa:
            if sa.group("dict") is not None:
                log.server_args.update(_parse_server_args(sa.group("dict"), dict_form=True))
            else:
                log.server_args.update(_parse_server_args(sa.group("body")))
            seen_lines += 1
            continue
        for kind, pat in _PATTERNS.items():
            hit = pat.search(body)
            if not hit:
                continue
            seen_lines += 1
            if not _take_figure(log, kind, hit, rank, body):
                _take_error(log, kind, hit, rank, body, lineno)
            break
    log.signals = match_signatures(bodies)
    if not seen_lines and not log.signals:
        raise InputError(source, "log", "no SGLang startup lines found (is this a server log?)", 1)
    log.ranks = _ranks_with_figures(log.ranks)
    return log


def _unwrapped(line: str) -> str:
    """The line as SGLang printed it, without a journald or ``docker logs -t`` prefix."""
    wrapper = _JOURNAL.match(line) or _DOCKER.match(line)
    return line[wrapper.end() :] if wrapper else line


def _take_figure(log: StartupLog, kind: str, hit: re.Match, rank: str, body: str) -> bool:
    """A progress line's figures into ``log`` (its rank's, or the scheduler's); False
    when ``kind`` is an error's."""
    g = hit.groups()
    if kind == "load_begin":
        _rank(log, rank).load_begin_avail = float(g[0])
    elif kind == "load_end":
        rl = _rank(log, rank)
        rl.load_end_avail = float(g[1])
        rl.weights_usage = _f(g[2])
        t = re.search(r"type=(\w+)", hit.group("body"))
        q = re.search(r"(quant=[^,]+(?:, fmt=[^,]+)?)", hit.group("body"))
        log.load_type = t.group(1) if t else log.load_type
        log.quant = q.group(1) if q else log.quant
    elif kind == "kv":
        rl = _rank(log, rank)
        size = (float(g[3]) + float(g[4])) if g[3] is not None else float(g[5])
        if rl.kv_gib is None:
            rl.kv_gib = size
            rl.kv_dtype = hit.group("dtype")
            rl.kv_tokens = int(hit.group("tokens")) if hit.group("tokens") else None
        else:
            rl.draft_kv_gib = (rl.draft_kv_gib or 0.0) + size
    elif kind == "pool_end":
        if _rank(log, rank).pool_end_avail is None:
            _rank(log, rank).pool_end_avail = float(g[0])
    elif kind == "graph_end":
        tail = body[hit.end() :]
        usage, avail = _GRAPH_USAGE.search(tail), _GRAPH_AVAIL.search(tail)
        if usage:
            _rank(log, rank).graph_usage += float(usage.group(1))
        if avail:
            _rank(log, rank).graph_end_avail = float(avail.group(1))
    elif kind == "init_dist_end":
        pass  # a progress line (memory NCCL took), not an error
    elif kind in ("graph_begin", "capturing"):
        _rank(log, rank).last_capture_avail = float(g[-1])
    elif kind == "scheduler":
        log.scheduler = {
            "max_total_num_tokens": int(hit.group("tokens")),
            "chunked_prefill_size": int(hit.group("cps")),
            "max_running_requests": int(hit.group("mrr")),
            "context_len": int(hit.group("ctx")),
        }
        if g[-1] is not None:
            log.scheduler["available_gpu_mem"] = float(g[-1])
    elif kind == "ready":
        log.ready = True
    else:
        return False
    return True


def _take_error(log: StartupLog, kind: str, hit: re.Match, rank: str, body: str,
                lineno: int) -> None:
    """A memory error line into ``log.errors`` with its figures (once per text)."""
    g = hit.groups()
    err: dict = {"kind": kind, "line": lineno, "rank": rank, "text": body.strip()}
    if kind == "err_no_kv":
        err.update(mfs=_f(g[0]), suggested=_f(g[1]), min_viable=_f(g[2]))
    elif kind == "err_not_enough":
        err.update(mfs=_f(g[0]))
    elif kind == "err_unbalanced":
        err.update(pre=_f(g[0]), local=_f(g[1]))
    elif kind == "err_oom":
        tried, free = _f(g[0]), _f(g[2])
        if tried is not None and hit.group("unit") == "MiB":
            tried /= 1024
        if free is not None and hit.group("unit2") == "MiB":
            free /= 1024
        err.update(tried_gib=tried, free_gib=free)
    if not any(e["kind"] == kind and e["text"] == err["text"] for e in log.errors):
        log.errors.append(err)


def _ranks_with_figures(ranks: dict[str, RankLog]) -> dict[str, RankLog]:
    """The ranks that reported a memory figure (a rank seen only in other lines is none)."""
    return {
        k: v
        for k, v in ranks.items()
        if any(
            getattr(v, a) is not None
            for a in (
                "load_begin_avail",
                "load_end_avail",
                "kv_gib",
                "pool_end_avail",
                "graph_end_avail",
            )
        )
    }


def read_log(path: str | Path) -> StartupLog:
    p = Path(path)
    try:  # bounded: a log is read whole, so a runaway one is refused from its size
        data = safeload.read_bytes(p, safeload.LOG_MAX_BYTES)
    except InputError as exc:
        raise InputError(p, "log", exc.message) from exc
    return parse_log(data.decode("utf-8", errors="replace"), str(p))


# ------------------------------------------------------------------ crash signatures

SIGNATURES_PATH = DATA_DIR / "rules" / "log_signatures.yaml"
DOCTOR_RULES_PATH = DATA_DIR / "rules" / "doctor.yaml"
_EVIDENCE_CHARS = 300


@dataclass(frozen=True)
class Signature:
    """A crash text and the doctor rule that explains it (log_signatures.yaml)."""

    rule: str
    line: re.Pattern[str]
    says: str
    source: str
    with_: re.Pattern[str] | None = None


@cache
def load_signatures(path: Path = SIGNATURES_PATH) -> tuple[Signature, ...]:
    """The signatures, their expressions compiled; a bad one names its entry."""
    data = safeload.load_yaml_file(path) or {}
    out = []
    for index, raw in enumerate(data.get("signatures") or []):
        where = f"signatures[{index}]"
        if not isinstance(raw, dict):
            raise InputError(path, where, "must be a mapping")
        for key in ("rule", "line", "says", "source"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise InputError(path, f"{where}.{key}", "required string")
        try:
            line = re.compile(raw["line"])
            with_ = re.compile(raw["with"]) if raw.get("with") else None
        except re.error as exc:
            raise InputError(path, where, f"bad regular expression: {exc}") from None
        out.append(Signature(raw["rule"], line, raw["says"], raw["source"], with_))
    return tuple(out)


def match_signatures(bodies: list[tuple[int, str, str]]) -> list[dict]:
    """Each rule's first matching line (line number, rank, text, what it means): the
    first signature whose ``line`` matches a line, and whose ``with`` occurs anywhere in
    the log, wins that line."""
    text = "\n".join(body for _, _, body in bodies)
    live = [s for s in load_signatures() if s.with_ is None or s.with_.search(text)]
    found: dict[str, dict] = {}
    for lineno, rank, body in bodies:
        sig = next((s for s in live if s.line.search(body)), None)
        if sig is None or sig.rule in found:
            continue
        found[sig.rule] = {"rule": sig.rule, "line": lineno, "rank": rank,
                           "text": body.strip()[:_EVIDENCE_CHARS], "says": sig.says,
                           "signature_source": sig.source}
    return list(found.values())


@cache
def _rule_texts(path: Path = DOCTOR_RULES_PATH) -> dict[str, dict]:
    """id -> the doctor rule's severity, title, fix and source (the doctor's own data:
    the log names the rule the doctor would have fired)."""
    data = safeload.load_yaml_file(path) or {}
    return {r["id"]: r for r in data.get("rules") or [] if isinstance(r, dict) and "id" in r}


def rule_findings(log: StartupLog) -> list[dict]:
    """The doctor findings a log's crash texts stand for, in the order they appeared."""
    texts = _rule_texts()
    out = []
    for sig in log.signals:
        rule = texts.get(sig["rule"])
        if rule is None:
            raise InputError(SIGNATURES_PATH, sig["rule"], "no such rule in doctor.yaml")
        out.append({
            "id": sig["rule"], "severity": rule["severity"], "title": rule["title"],
            "evidence": f"line {sig['line']} ({sig['rank']}): {sig['text']} -- {sig['says']}",
            "fix": rule["fix"], "source": rule["source"]})
    return out


# ------------------------------------------------------------------------- diagnosis


@dataclass
class Diagnosis:
    outcome: str  # "ready", "started", "refused-no-kv", "not-enough-memory", "unbalanced",
    # "failed"/"crashed" (another exception before/after ready), ...
    pre_load_free_gib: float | None
    avail_after_weights_gib: float | None
    weights_gib: float | None
    mem_fraction_static: float | None
    slack_gib: float | None
    rest_gib: float | None
    min_viable_mfs: float | None
    suggested_mfs: float | None
    kv_tokens: int | None
    kv_gib: float | None
    kv_bytes_per_token: float | None
    graph_gib: float | None
    lines: list[str]
    fixes: list[str]
    # doctor rules the log's crash texts stand for (id, severity, title, evidence, fix,
    # source), the same findings ``gpuserve doctor`` prints
    rules: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Figures:
    """The figures a diagnosis reasons with (GiB unless named otherwise; None = not logged
    and not derivable), gathered once so each outcome's explanation reads them by name."""

    pre: float | None
    after: float | None
    weights: float | None
    mfs: float | None
    slack: float | None = None
    rest: float | None = None
    min_viable: float | None = None
    suggested: float | None = None
    tokens: int | None = None
    kv: float | None = None
    cell: float | None = None
    graph: float | None = None
    kv_dtype: str = "auto"


def diagnose(
    log: StartupLog,
    *,
    mem_fraction_static: float | None = None,
    pre_load_free_gib: float | None = None,
) -> Diagnosis:
    """Explain the outcome with SGLang's own arithmetic (_profile_available_bytes)."""
    f, lines = _gather_figures(log, mem_fraction_static, pre_load_free_gib)
    outcome, outcome_lines, fixes = _explain_outcome(log, f)
    rules = rule_findings(log)
    outcome_lines += [f"explained by doctor rule {r['id']}: {r['title']}" for r in rules]
    fixes = [f"{r['id']}: {r['fix']}" for r in rules] + fixes
    return Diagnosis(
        outcome,
        f.pre,
        f.after,
        f.weights,
        f.mfs,
        f.slack,
        f.rest,
        f.min_viable,
        f.suggested,
        f.tokens,
        f.kv,
        f.cell,
        f.graph,
        lines + outcome_lines,
        fixes,
        rules,
    )


def _resolve_mfs(log: StartupLog, given: float | None) -> float | None:
    """mem_fraction_static: the caller's value, else the logged server_args, else the value
    quoted by a refusal message (a log excerpt may lack the server_args line)."""
    no_kv = log.error("err_no_kv")
    mfs = given
    if mfs is None:
        mfs = log.server_args.get("mem_fraction_static")  # type: ignore[assignment]
    if mfs is None and no_kv:
        mfs = no_kv.get("mfs")
    if mfs is None and log.error("err_not_enough"):
        mfs = log.error("err_not_enough").get("mfs")
    return mfs


def _free_before_weights(
    log: StartupLog, pre_load_free_gib: float | None, after: float | None
) -> tuple[float | None, float | None, list[str]]:
    """(pre, weights, lines): free memory before weights and what the weights took.

    When the log does not show "Load weight begin", pre is recovered from the refusal's
    minimum viable fraction or from the load's mem usage, and a line says which.
    """
    no_kv = log.error("err_no_kv")
    pre = pre_load_free_gib if pre_load_free_gib is not None else log.pre_load_free
    lines: list[str] = []
    if pre is None and after is not None and no_kv and no_kv.get("min_viable") is not None:
        pre = after / (1 - no_kv["min_viable"])
        lines.append(
            f"free before weights not logged; from the error's minimum viable fraction "
            f"{no_kv['min_viable']}: pre = {after:.2f} / (1 - {no_kv['min_viable']}) = "
            f"{pre:.2f} GiB"
        )
    weights = log.weights_usage
    if pre is None and after is not None and weights is not None:
        # model_runner.py logs mem usage = free before load - free after load.
        pre = after + weights
        lines.append(
            f"free before weights not logged; pre = avail after + mem usage = "
            f"{after:.2f} + {weights:.2f} = {pre:.2f} GiB"
        )
    if weights is None and pre is not None and after is not None:
        weights = pre - after
    return pre, weights, lines


def _gather_figures(
    log: StartupLog, mem_fraction_static: float | None, pre_load_free_gib: float | None
) -> tuple[_Figures, list[str]]:
    """Every figure the outcome is explained with, and the lines that derive the budget:
    rest = after - pre x (1 - mfs), as _profile_available_bytes computes it."""
    mfs = _resolve_mfs(log, mem_fraction_static)
    after = log.avail_after_weights
    pre, weights, lines = _free_before_weights(log, pre_load_free_gib, after)
    f = _Figures(pre=pre, after=after, weights=weights, mfs=mfs)
    if pre is not None:
        lines.append(f"free GPU memory before weights (min over ranks): {pre:.2f} GiB")
    if after is not None:
        lines.append(
            f"free after weights (min over ranks): {after:.2f} GiB"
            + (f" (weights and load buffers use {weights:.2f} GiB)" if weights else "")
        )
    if pre is not None and after is not None:
        f.min_viable = 1 - after / pre
        f.suggested = math.ceil(f.min_viable * 1000) / 1000
    if pre is not None and after is not None and mfs is not None:
        f.slack = pre * (1 - mfs)
        f.rest = after - f.slack
        lines.append(
            f"mem_fraction_static {mfs}: SGLang keeps pre x (1 - mfs) = {pre:.2f} x "
            f"{1 - mfs:.3f} = {f.slack:.2f} GiB outside the static pool for graphs and "
            f"activations"
        )
        lines.append(f"rest for the KV cache = {after:.2f} - {f.slack:.2f} = {f.rest:.2f} GiB")
    f.tokens, f.kv = log.kv_tokens, log.kv_gib
    f.kv_dtype = str(
        log.server_args.get("kv_cache_dtype")
        or next((r.kv_dtype for r in log.ranks.values() if r.kv_dtype), "auto")
    )
    f.cell = f.kv * GIB / f.tokens if (f.kv and f.tokens) else None
    f.graph = log.graph_usage
    return f, lines


def _explain_outcome(log: StartupLog, f: _Figures) -> tuple[str, list[str], list[str]]:
    """(outcome, lines, fixes), checking SGLang's failures in the order it meets them: the
    rank-balance check at init, the KV budget, the pool sizing, then a CUDA OOM (mostly
    graph capture); a log without any of them started, or stops early."""
    rest = f.rest
    if log.error("err_unbalanced"):
        return _explain_unbalanced(log.error("err_unbalanced"))
    if log.error("err_no_kv") or (
        rest is not None and rest <= 0 and not log.ready and f.tokens is None
    ):
        return _explain_no_kv(f)
    if log.error("err_not_enough"):
        lines = ["SGLang refused: the KV pool would hold no token (Not enough memory)"]
        return "not-enough-memory", lines, _refusal_fixes_for(f)
    if log.error("err_oom"):
        return _explain_oom(log, f)
    capture = log.error("err_capture")
    if capture and not _NOT_OOM.search(capture["text"]):
        return _explain_oom(log, f)
    if capture or log.error("err_exception"):
        # a capture that failed for another reason (a kernel without a build for the GPU)
        return _explain_exception(log, capture or log.error("err_exception"))
    if log.ready or f.tokens:
        return _explain_started(log, f)
    return _explain_incomplete(f)


# A capture failure whose text names another cause than memory (the text after "failed:").
_NOT_OOM = re.compile(r"graph failed: (?!.*(?:out of memory|OutOfMemoryError))\S")


def _explain_exception(log: StartupLog, e: dict) -> tuple[str, list[str], list[str]]:
    """An exception that is not about memory: it failed before it was ready, or crashed
    after; the text is SGLang's (a backend, a kernel, a missing module)."""
    when = "after the server was ready" if log.ready else "during start-up"
    return ("crashed" if log.ready else "failed"), [f"SGLang stopped {when}: {e['text']}"], []


def _refusal_fixes_for(f: _Figures) -> list[str]:
    """_refusal_fixes with this diagnosis's figures."""
    return _refusal_fixes(f.pre, f.after, f.mfs, f.suggested, f.graph, f.kv_dtype)


def _explain_unbalanced(e: dict) -> tuple[str, list[str], list[str]]:
    """distributed/bootstrap.py refuses when the emptiest rank has under 90% of this
    rank's free memory: something else holds memory on some GPUs."""
    lines = [
        "SGLang refused: the minimum free memory over ranks is below 90% of this "
        "rank's free memory"
        + (f" ({e['pre']:.2f} < 0.9 x {e['local']:.2f})" if e.get("pre") is not None else "")
    ]
    fixes = [
        "free the GPUs first: another process holds memory on some of them "
        "(nvidia-smi --query-compute-apps=pid,used_memory --format=csv)",
        "or set SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0 to make it a warning; "
        "the KV pool is then sized from the emptiest GPU",
    ]
    return "unbalanced", lines, fixes


def _explain_no_kv(f: _Figures) -> tuple[str, list[str], list[str]]:
    """_profile_available_bytes found rest <= 0 (logged, or computed from the figures of a
    log that stops before the pool): the fraction must rise past the minimum viable."""
    lines = ["SGLang refused: Loaded weights leave no GPU memory for the KV cache (rest <= 0)"]
    if f.min_viable is not None:
        lines.append(
            f"minimum viable mem_fraction_static {math.ceil(f.min_viable * 1000) / 1000:.3f} "
            f"(1 {signed_term(f.after)}/{f.pre:.2f}, rounded up)"
            if f.min_viable < 1 else
            f"no mem_fraction_static fits: the weights leave {f.after:.2f} GiB of {f.pre:.2f}"
        )
    return "refused-no-kv", lines, _refusal_fixes_for(f)


def _explain_oom(log: StartupLog, f: _Figures) -> tuple[str, list[str], list[str]]:
    """A CUDA OOM, usually graph capture running out of the memory left outside the static
    pool: give some of the pool back (lower the fraction) or capture smaller graphs."""
    e = log.error("err_oom") or {}
    in_capture = log.error("err_capture") or "graph failed" in e.get("text", "")
    outcome = "oom-during-capture" if (in_capture or f.kv) else "oom"
    lines: list[str] = []
    fixes: list[str] = []
    pool_end = min(
        (r.pool_end_avail for r in log.ranks.values() if r.pool_end_avail is not None),
        default=None,
    )
    if pool_end is not None:
        lines.append(
            f"after the KV pool only {pool_end:.2f} GiB were free for CUDA graphs and activations"
        )
    if e.get("tried_gib") is not None:
        lines.append(
            f"CUDA OOM trying to allocate {e['tried_gib']:.2f} GiB"
            + (f" with {e['free_gib']:.2f} GiB free" if e.get("free_gib") is not None else "")
        )
    if f.mfs is not None and f.pre is not None:
        need = (e.get("tried_gib") or 1.0) + 0.5
        lower = math.floor((f.mfs - need / f.pre) * 1000) / 1000
        fixes.append(
            f"lower --mem-fraction-static to about {lower:.3f} (frees {need:.1f} GiB "
            f"of the KV pool for graph capture)"
        )
    bs = log.server_args.get("cuda_graph_max_bs")
    fixes.append(
        "or lower the decode graph batch: --cuda-graph-max-bs-decode "
        f"{max(int(bs) // 2, 8) if isinstance(bs, int) else 256} (0.5.20+; "
        "--cuda-graph-max-bs before)"
    )
    return outcome, lines, fixes


def _explain_started(log: StartupLog, f: _Figures) -> tuple[str, list[str], list[str]]:
    """The pool was sized: account for where the rest went (KV pool, other pools, graphs)
    and flag a KV cache small enough to limit serving."""
    outcome = "ready" if log.ready else "started"
    tokens, kv, cell, rest, graph, slack = f.tokens, f.kv, f.cell, f.rest, f.graph, f.slack
    lines: list[str] = []
    fixes: list[str] = []
    if tokens:
        lines.append(
            f"KV pool: {tokens:,} tokens"
            + (f", {kv:.2f} GiB" if kv else "")
            + (f" ({cell:,.0f} B/token)" if cell else "")
        )
    if rest is not None and kv:
        lines.append(
            f"rest {rest:.2f} GiB vs KV pool {kv:.2f} GiB: "
            f"{rest - kv:+.2f} GiB went to other pools (draft, fixed overheads)"
        )
    if graph:
        lines.append(
            f"CUDA graphs used {graph:.2f} GiB"
            + (f" of the {slack:.2f} GiB slack" if slack else "")
        )
    if rest is not None and rest < 2.0:
        fixes.append(
            f"the KV cache is only {rest:.2f} GiB: raise --mem-fraction-static "
            f"(each +0.01 adds {f.pre * 0.01:.2f} GiB) or lower --cuda-graph-max-bs"
        )
    return outcome, lines, fixes


def _explain_incomplete(f: _Figures) -> tuple[str, list[str], list[str]]:
    """The log stops before the pool was sized: say what SGLang would have done with the
    figures so far (and the refusal's fixes when rest <= 0)."""
    lines = ["the log stops before the KV pool was sized"]
    fixes: list[str] = []
    rest = f.rest
    if rest is not None:
        lines.append(
            ("it will be refused" if rest <= 0 else "it should size a KV pool of")
            + f" (rest {rest:.2f} GiB)"
        )
        if rest <= 0:
            fixes.extend(_refusal_fixes_for(f))
    if f.graph:
        lines.append(f"CUDA graphs used {f.graph:.2f} GiB")
    return "incomplete", lines, fixes


def _refusal_fixes(
    pre: float | None,
    after: float | None,
    mfs: float | None,
    suggested: float | None,
    graph: float | None,
    kv_dtype: str = "auto",
) -> list[str]:
    fixes: list[str] = []
    if pre is None or after is None or suggested is None:
        return [
            "raise --mem-fraction-static (the log lacks the free-memory figures to say how far)"
        ]
    # Give the KV cache at least 2 GiB on top of the bare minimum, but keep at least the
    # graph memory (or 3 GiB when not measured) outside the static pool.
    keep_out = max(graph or 0.0, 3.0)
    target = math.ceil((1 - (after - 2.0) / pre) * 1000) / 1000
    ceiling = math.floor((1 - keep_out / pre) * 1000) / 1000
    if target <= ceiling:
        fixes.append(
            f"raise --mem-fraction-static to {target:.3f} (minimum viable {suggested:.3f}; "
            f"{target:.3f} leaves {after - pre * (1 - target):.2f} GiB for the KV cache "
            f"and {pre * (1 - target):.2f} GiB for graphs and activations)"
        )
    elif suggested <= ceiling:
        fixes.append(
            f"raise --mem-fraction-static to {ceiling:.3f} (minimum viable {suggested:.3f}; "
            f"more would starve CUDA graph capture)"
        )
    elif suggested >= 1:
        fixes.append(f"no mem_fraction_static fits (the weights leave {after:.2f} GiB of "
                     f"{pre:.2f} free): free weight memory instead")
    else:
        fixes.append(
            f"mem_fraction_static would have to exceed {suggested:.3f}, leaving under "
            f"{keep_out:.1f} GiB for graphs: free weight memory instead"
        )
    fixes.append(
        "lower --cuda-graph-max-bs(-decode) so the raised fraction still leaves room "
        "for graph capture"
    )
    fixes.append(
        "free weight memory: plain TP instead of an all-to-all MoE backend (shared "
        "experts are replicated under EP), fewer --ep-num-redundant-experts, no draft "
        "model"
    )
    if "fp8" not in kv_dtype and "float8" not in kv_dtype:
        fixes.append("then use --kv-cache-dtype fp8_e4m3 to fit twice the tokens in what is left")
    return fixes
