"""Performance surfaces: how fast, how big and how broken an SGLang launch is on a box.

Why: a tuner can only be tested against a server whose speed depends on its launch the
way a real one does. A surface (lab/surfaces/*.yaml, format in lab/surfaces/README.md)
says, for a launch as SGLang resolves it (server-args dest names), the single-stream
decode rate, how the rate per stream falls with concurrency (batch cap, slope, eager
fallback above the decode CUDA-graph max bs), prefill speed and TTFT, extra memory per
GPU, and which launches fail at start or crash while serving, with SGLang's error text.

One implementation for the lab and the stand-in: this file is standard-library only
and is copied verbatim into the SGLang stand-in wheel as ``sglang/_standin/surface.py``
(like gpuserve/launch/flagparser.py); the server runs its decode loop through
``Perf.step_seconds`` and its start-up through ``Surface.start``, and ``evaluate`` /
``true_optimum`` answer the same questions without starting anything.

The memory arithmetic (SGLang's auto mem_fraction_static, KV budget, graph capture) is
the stand-in's ``sim.py``; outside the wheel it is loaded from its source file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1

# metric -> (default, minimum, what it is); README.md of lab/surfaces has the long form
METRICS: dict[str, tuple[float, float, str]] = {
    "decode_tps": (60.0, 1e-9, "decode tokens/s of one request alone (single stream)"),
    "batch_decode_tps": (0.0, 0.0, "decode tokens/s of all running requests together; 0: no cap"),
    "batch_slope": (0.0, 0.0, "per extra running request, the step time grows by this fraction"),
    "eager_factor": (1.0, 1e-9, "decode rate multiplier while the batch exceeds the decode graphs"),
    "prefill_tps": (8000.0, 1e-9, "prompt tokens/s, one prompt at a time"),
    "ttft_s": (0.0, 0.0, "fixed seconds added before each request's first token"),
    "weights_gb": (1.5, 0.0, "GiB of weights and static buffers per GPU before the KV pool"),
    "decode_graph_mb_per_bs": (1.2, 0.0, "MiB per decode CUDA-graph batch size captured"),
    "spec_accept_length": (0.0, 0.0, "average accepted tokens per verify step (speculation)"),
}
HARDWARE = {"gpu_mem_mib": 97887.0, "init_gb": 1.6}
MODEL_KEYS = ("architectures", "model_type", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "hidden_size", "max_position_embeddings",
              "kv_lora_rank", "qk_rope_head_dim")
TOP_KEYS = ("format", "name", "description", "sources", "box", "hardware", "model", "base",
            "rules", "noise")
# noise: relative standard deviation per benchmark run and per server start, and the seed
NOISE_KEYS = ("run", "start", "seed")
MAX_NOISE = 0.2
RULE_KEYS = ("name", "when", "set", "mul", "add", "table", "fail", "quality")
# a rule's output-quality perturbation (the stand-in's toy model, sglang/_standin/toylm.py)
QUALITY_PERTURBATION = re.compile(
    r"(fp8_kv|flat|draft_mismatch|nan_after:\d+|degrade:\d+|noise:\d+(\.\d+)?)"
    r"(,(fp8_kv|flat|draft_mismatch|nan_after:\d+|degrade:\d+|noise:\d+(\.\d+)?))*")
TABLE_KEYS = ("knob", "op", "interpolate", "points", "default")
FAIL_KEYS = ("phase", "builtin", "exception", "message", "frame", "after_requests")
MATCH_OPS = ("eq", "ne", "in", "not_in", "gt", "ge", "lt", "le")
BUILTINS = ("capture_oom", "illegal_memory_access")
# Keys a rule may name beyond the parser's dests: what the stand-in resolves.
DERIVED_KEYS = ("cuda_graph_max_bs", "cuda_graph_max_bs_decode", "decode_cuda_graph",
                "prefill_cuda_graph", "attn_dp_size", "dp_size", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens", "ep_size",
                "mem_fraction_static", "chunked_prefill_size", "max_running_requests",
                "tp_size", "enable_dp_attention", "moe_a2a_backend", "moe_runner_backend",
                "speculative_algorithm", "attention_backend", "kv_cache_dtype")
SPEC_CAPPED = ("EAGLE", "EAGLE3", "STANDALONE")
ILLEGAL_MEMORY_ACCESS = (
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
    "asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")


class SurfaceError(ValueError):
    """A surface file or a launch it cannot judge; names the file and the field."""

    def __init__(self, file: str | Path | None, field_name: str | None, message: str,
                 line: int | None = None) -> None:
        where = str(file) if file is not None else "<surface>"
        if line is not None:
            where = f"{where}:{line}"
        self.file, self.field, self.line = file, field_name, line
        super().__init__(f"{where}: {field_name}: {message}" if field_name
                         else f"{where}: {message}")


# -- a YAML subset (no PyYAML in the stand-in) ----------------------------------------

_BOOLS = {**dict.fromkeys(("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"),
                          True),
          **dict.fromkeys(("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"),
                          False)}
_NULLS = ("", "~", "null", "Null", "NULL")
_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"^[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?$")


def _scalar(text: str, where: str) -> Any:
    """A plain or quoted scalar, resolved like PyYAML's (YAML 1.1) resolver."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return json.loads(text)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if text in _NULLS:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text) and text not in (".", "+.", "-."):
        return float(text.replace("_", ""))
    if text[:1] in "[]{}&*!|>%@`" or text.startswith(("- ", "? ")):
        raise ValueError(f"{where}: unsupported YAML: {text!r}")
    return text


def _strip_comment(line: str) -> str:
    quote, skip = None, False
    for i, ch in enumerate(line):
        if skip:
            skip = False
        elif quote:
            if ch == quote and quote == "'" and line[i + 1:i + 2] == "'":
                skip = True  # '' inside a single-quoted scalar
            elif ch == quote:
                quote = None
        elif ch in "'\"" and (i == 0 or line[i - 1] in " \t[{,:"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _top_level(text: str):
    """(index, character) of each character outside quotes and brackets."""
    quote, depth = None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif depth == 0:
            yield i, ch


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside quotes and brackets."""
    parts, start = [], 0
    for i, ch in _top_level(text):
        if ch == sep:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _key_split(text: str) -> tuple[str, str] | None:
    """``key: rest`` -> (key, rest) when ``text`` starts a mapping entry."""
    for i, ch in _top_level(text):
        if ch == ":" and (i + 1 == len(text) or text[i + 1] in " \t"):
            return text[:i].strip(), text[i + 1:].strip()
    return None


def _flow(text: str, where: str) -> Any:
    """A one-line flow collection (``{a: 1, b: [x, y]}``) or a scalar."""
    text = text.strip()
    if text.startswith("{"):
        if not text.endswith("}"):
            raise ValueError(f"{where}: a flow mapping must close on its line")
        out: dict = {}
        inner = text[1:-1].strip()
        for part in (_split_top(inner, ",") if inner else []):
            kv = _key_split(part.strip())
            if kv is None:
                raise ValueError(f"{where}: expected 'key: value' in {{...}}, got {part!r}")
            key = _scalar(kv[0], where)
            if key in out:
                raise ValueError(f"{where}: duplicate key {key!r}")
            out[key] = _flow(kv[1], where)
        return out
    if text.startswith("["):
        if not text.endswith("]"):
            raise ValueError(f"{where}: a flow sequence must close on its line")
        inner = text[1:-1].strip()
        return [_flow(p, where) for p in _split_top(inner, ",")] if inner else []
    return _scalar(text, where)


def _lines(text: str) -> list[list]:
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise ValueError(f"line {number}: tabs are not allowed in indentation")
        line = _strip_comment(raw)
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        out.append([len(line) - len(line.lstrip(" ")), line.strip(), number])
    return out


def _block(lines: list[list], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1] == "-" or lines[i][1].startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: list[list], i: int, indent: int) -> tuple[list, int]:
    items: list = []
    while i < len(lines) and lines[i][0] == indent and (
            lines[i][1] == "-" or lines[i][1].startswith("- ")):
        rest = lines[i][1][1:].lstrip()
        if not rest:
            if i + 1 < len(lines) and lines[i + 1][0] > indent:
                value, i = _block(lines, i + 1, lines[i + 1][0])
            else:
                value, i = None, i + 1
        elif _key_split(rest) is not None and rest[0] not in "{[\"'":
            # "- key: value": a mapping whose first entry sits after the dash
            lines[i] = [indent + len(lines[i][1]) - len(rest), rest, lines[i][2]]
            value, i = _mapping(lines, i, lines[i][0])
        else:
            value, i = _flow(rest, f"line {lines[i][2]}"), i + 1
        items.append(value)
    return items, i


def _mapping(lines: list[list], i: int, indent: int) -> tuple[dict, int]:
    out: dict = {}
    while i < len(lines) and lines[i][0] == indent:
        col, text, number = lines[i]
        where = f"line {number}"
        kv = _key_split(text)
        if kv is None or text.startswith("- "):
            raise ValueError(f"{where}: expected 'key: value', got {text!r}")
        key = _scalar(kv[0], where)
        if key in out:
            raise ValueError(f"{where}: duplicate key {key!r}")
        if kv[1]:
            if kv[1][0] in "|>":
                raise ValueError(f"{where}: block scalars (| >) are not supported")
            out[key], i = _flow(kv[1], where), i + 1
        elif i + 1 < len(lines) and (lines[i + 1][0] > indent or (
                lines[i + 1][0] == indent and lines[i + 1][1].startswith("- "))):
            out[key], i = _block(lines, i + 1, lines[i + 1][0])
        else:
            out[key], i = None, i + 1
    if i < len(lines) and lines[i][0] > indent:
        raise ValueError(f"line {lines[i][2]}: unexpected indentation")
    return out, i


def parse_yaml(text: str) -> Any:
    """The YAML the surface files use: block mappings and sequences, one-line flow
    collections, comments, plain and quoted scalars (resolved as PyYAML does)."""
    lines = _lines(text)
    if not lines:
        return None
    value, i = _block(lines, 0, lines[0][0])
    if i < len(lines):
        raise ValueError(f"line {lines[i][2]}: unexpected content {lines[i][1]!r}")
    return value


# -- the file format --------------------------------------------------------------------


@dataclass
class Fail:
    """A rule's failure: how and when the launch dies, with which SGLang text."""

    phase: str                  # "start": dies before listening; "serve": after N requests
    exception: str = "RuntimeError"
    message: str = ""
    builtin: str | None = None  # capture_oom | illegal_memory_access
    frame: tuple[str, int, str] = ("sglang/srt/managers/scheduler.py", 1480, "run_event_loop")
    after_requests: int = 1
    rule: str = ""


@dataclass
class Rule:
    """One validated ``rules`` entry: a launch matcher and its effects."""

    name: str
    when: dict
    set: dict
    mul: dict
    add: dict
    table: dict | None
    fail: Fail | None
    quality: str = ""  # output-quality perturbations of a matching launch (composed)


@dataclass
class Surface:
    """A loaded surface file (``load``): the box, the base metrics and the rules."""

    path: str
    name: str
    description: str
    hardware: dict
    model: dict | None
    base: dict
    rules: list[Rule]
    launch_keys: frozenset | None = None
    box: str | None = None    # the lab box (lab/nvidia_repo/boxes/) whose GPUs match
    noise: dict = field(default_factory=lambda: {"run": 0.0, "start": 0.0, "seed": 0})

    # -- rules ----------------------------------------------------------------
    def apply(self, launch: dict) -> tuple[dict, list[Fail]]:
        """Metrics and failures of a resolved launch: ``base`` then every matching rule
        in file order (within a rule: set, mul, add, table)."""
        metrics = {k: float(self.base.get(k, METRICS[k][0])) for k in METRICS}
        fails: list[Fail] = []
        for rule in self.rules:
            if not all(_matches(launch.get(k), m) for k, m in rule.when.items()):
                continue
            for k, v in rule.set.items():
                metrics[k] = float(v)
            for k, v in rule.mul.items():
                metrics[k] *= float(v)
            for k, v in rule.add.items():
                metrics[k] += float(v)
            if rule.table:
                _apply_table(rule.table, launch, metrics)
            if rule.fail:
                fails.append(rule.fail)
        for k, v in metrics.items():
            if not math.isfinite(v) or v < METRICS[k][1]:
                raise SurfaceError(self.path, k, f"rules give {v!r} for this launch "
                                   f"(must be >= {METRICS[k][1]})")
        return metrics, fails

    def quality_of(self, launch: dict) -> str:
        """The output-quality perturbations of a launch: every matching rule's."""
        return ",".join(r.quality for r in self.rules if r.quality and all(
            _matches(launch.get(k), m) for k, m in r.when.items()))

    def start(self, args: Any, shape: Any, speedup: float = 1.0, start_key: str = ""
              ) -> Startup:
        """What the stand-in does when it starts with ``args`` (argparse-like) serving a
        model of ``shape``: resolved launch, memory plan, speed, failures. With
        ``noise.start``, the whole speed of this start is drawn around the surface's
        (seeded by the surface's seed and ``start_key``)."""
        speedup *= noise_factor(self.noise["start"], self.noise["seed"], "start", start_key)
        sim = _sim()
        box = sim.Box(gpu_mem_mib=float(self.hardware["gpu_mem_mib"]),
                      init_gb=float(self.hardware["init_gb"]),
                      weights_gb=float(self.base.get("weights_gb", METRICS["weights_gb"][0])))
        first = sim.plan(args, shape, box)
        launch = resolved_launch(args, first, shape)
        metrics, fails = self.apply(launch)
        box.weights_gb = metrics["weights_gb"]
        box.decode_graph_mb_per_bs = metrics["decode_graph_mb_per_bs"]
        p = sim.plan(args, shape, box)
        if launch.get("speculative_algorithm") in SPEC_CAPPED and \
                getattr(args, "max_running_requests", None) is None:
            # speculative_hook.py: EAGLE/EAGLE3/STANDALONE set max_running_requests=48,
            # which resolve_max_num_reqs then divides among the attention-DP workers
            p.max_running_requests = min(max(1, 48 // p.attn_dp), p.max_running_requests or 48)
        error = p.errors[0] if p.errors else sim.capture_error(p)
        start_fails = [f for f in fails if f.phase == "start"]
        if error is None and start_fails:
            error = _startup_error(sim, start_fails[0], p)
        crash = next((f for f in fails if f.phase == "serve"), None)
        perf = Perf.from_metrics(metrics, p, speedup)
        perf.noise_run, perf.noise_seed = self.noise["run"], f"{self.noise['seed']}|{start_key}"
        perf.quality = self.quality_of(launch)
        return Startup(launch=launch, plan=p, metrics=metrics, perf=perf, error=error,
                       crash=crash)

    def evaluate(self, launch: dict, concurrency: int, input_len: int = 1024,
                 output_len: int = 256, model: dict | None = None,
                 speedup: float = 1.0) -> Evaluation:
        """What the stand-in would do for ``launch`` (dest names; cuda_graph_max_bs is
        accepted for cuda_graph_max_bs_decode) at ``concurrency`` closed-loop streams of
        ``input_len`` prompt and ``output_len`` output tokens."""
        self._check_launch(launch)
        sim = _sim()
        shape = _shape(sim, model if model is not None else self.model)
        st = self.start(LaunchArgs(launch), shape, speedup)
        return _evaluation(st, int(concurrency), int(input_len), int(output_len))

    def _check_launch(self, launch: dict) -> None:
        if not isinstance(launch, dict):
            raise SurfaceError(self.path, "launch", f"must be a mapping, got {launch!r}")
        known = self.launch_keys
        if known is None:
            return
        for key in launch:
            if key not in known:
                raise SurfaceError(self.path, f"launch.{key}",
                                   "not a launch setting (SGLang server-args dest name)")


@dataclass
class Startup:
    """What ``Surface.start`` decided: the stand-in's whole start-up in one record."""

    launch: dict
    plan: Any
    metrics: dict
    perf: Perf
    error: Any          # sim.StartupError or None
    crash: Fail | None


@dataclass
class Evaluation:
    """One launch at one concurrency, as the stand-in would serve it."""

    launch: dict                      # resolved (what the rules saw)
    concurrency: int
    failed: str | None = None         # "start" or "serve" (crashes after N requests)
    error: str | None = None          # SGLang's exception line(s)
    crash_after_requests: int | None = None
    running: int = 0                  # requests decoding together
    per_stream_tps: float = 0.0       # decode tok/s each stream sees
    total_tps: float = 0.0            # decode tok/s of all streams
    ttft_s: float = 0.0               # time to first token of a request that does not queue
    output_tps: float = 0.0           # bench_serving's output_throughput, steady state
    memory: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed is None


@dataclass
class Perf:
    """The decode/prefill model the server runs (defaults: the stand-in's knobs)."""

    decode_tps: float = 60.0
    batch_decode_tps: float = 1500.0
    batch_slope: float = 0.0
    eager_factor: float = 1.0
    graph_max_bs: int | None = None   # None: no eager fallback; 0: decode graphs disabled
    prefill_tps: float = 8000.0
    ttft_s: float = 0.0
    spec_accept_length: float | None = None
    max_running: int | None = None    # admission limits (surface only), whole server
    kv_tokens: int | None = None
    attn_dp: int = 1                  # attention-DP ranks: each captures its own graphs
    noise_run: float = 0.0            # relative sd of the speed of one benchmark run
    noise_seed: str = ""
    quality: str = ""                 # the toy model's perturbations (rules' quality)

    def run_factor(self, run: int) -> float:
        """The speed factor of benchmark run number ``run`` of this start (1.0 without
        noise)."""
        return noise_factor(self.noise_run, self.noise_seed, "run", str(run))

    @classmethod
    def from_metrics(cls, m: dict, p: Any, speedup: float = 1.0) -> Perf:
        return cls(decode_tps=m["decode_tps"] * speedup,
                   batch_decode_tps=m["batch_decode_tps"] * speedup,
                   batch_slope=m["batch_slope"], eager_factor=m["eager_factor"],
                   graph_max_bs=p.decode_max_bs if p.decode_graphs else 0,
                   prefill_tps=m["prefill_tps"] * speedup, ttft_s=m["ttft_s"] / speedup,
                   spec_accept_length=m["spec_accept_length"] or None,
                   # per DP worker in SGLang (resolve_max_num_reqs, one pool per rank)
                   max_running=max(1, int(p.max_running_requests or 1)) * p.attn_dp,
                   kv_tokens=max(1, int(p.max_total_num_tokens or 1)) * p.attn_dp,
                   attn_dp=p.attn_dp)

    def eager(self, running: int) -> bool:
        """Whether a batch of ``running`` decodes without CUDA graphs (above the captured
        max bs SGLang falls back to eager mode)."""
        per_rank = -(-max(int(running), 1) // max(self.attn_dp, 1))
        return self.graph_max_bs is not None and per_rank > self.graph_max_bs

    def step_seconds(self, running: int) -> float:
        """Seconds per decode step of each request while ``running`` decode together:
        the single-stream step, grown by ``batch_slope`` per extra request, slowed by
        ``eager_factor`` above the graphs, and never faster than the batch cap allows."""
        n = max(int(running), 1)
        factor = self.eager_factor if self.eager(n) else 1.0
        step = (1.0 + self.batch_slope * (n - 1)) / (self.decode_tps * factor)
        if self.batch_decode_tps > 0:
            step = max(step, n / (self.batch_decode_tps * factor))
        return step


def noise_factor(sd: float, seed: Any, *key: str) -> float:
    """A seeded draw around 1.0 with relative standard deviation ``sd`` (normal, cut at
    three sd): the same seed and key give the same factor."""
    if not sd:
        return 1.0
    import random

    rng = random.Random("|".join(["gpuserve-lab-noise", str(seed), *key]))
    return 1.0 + sd * max(-3.0, min(3.0, rng.gauss(0.0, 1.0)))


class LaunchArgs:
    """An argparse-like view of a launch dict: missing settings read as None."""

    def __init__(self, launch: dict) -> None:
        self.__dict__.update(launch)
        if launch.get("cuda_graph_max_bs") is not None and \
                launch.get("cuda_graph_max_bs_decode") is None:
            self.__dict__["cuda_graph_max_bs_decode"] = launch["cuda_graph_max_bs"]

    def __getattr__(self, name: str) -> Any:
        return None


def _spec_params(algo: str | None, args: Any, shape: Any) -> tuple:
    steps = getattr(args, "speculative_num_steps", None)
    topk = getattr(args, "speculative_eagle_topk", None)
    draft = getattr(args, "speculative_num_draft_tokens", None)
    if algo and steps is None and topk is None and draft is None:
        # speculative_hook.py::_auto_choose_speculative_params
        if shape.architecture.startswith(("Llama", "Grok")):
            return 5, 4, 8
        return 3, 1, 4
    return steps, topk, draft


def resolved_launch(args: Any, p: Any, shape: Any) -> dict:
    """The launch as the rules see it: every given setting, plus what SGLang resolves
    (mem_fraction_static, chunked_prefill_size, decode graph max bs under both names,
    attention-DP size, the speculative triple, EP forced by the flashinfer all-to-all)."""
    base = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    algo = base.get("speculative_algorithm") or None
    steps, topk, draft = _spec_params(algo, args, shape)
    tp = int(base.get("tp_size") or 1)
    a2a = base.get("moe_a2a_backend") or "none"
    ep = int(base.get("ep_size") or 1)
    if a2a == "flashinfer" and ep == 1:
        ep = tp  # srt/arg_groups/overrides.py::_a2a_ep_size
    mrr = base.get("max_running_requests")
    if mrr is None and algo in SPEC_CAPPED:
        mrr = 48
    base.update({
        "tp_size": tp, "ep_size": ep, "dp_size": p.dp, "attn_dp_size": p.attn_dp,
        "enable_dp_attention": bool(base.get("enable_dp_attention")) or p.attn_dp > 1,
        "moe_a2a_backend": a2a, "moe_runner_backend": base.get("moe_runner_backend") or "auto",
        "mem_fraction_static": p.mem_fraction_static,
        "chunked_prefill_size": p.chunked_prefill_size,
        "cuda_graph_max_bs": p.decode_max_bs, "cuda_graph_max_bs_decode": p.decode_max_bs,
        "decode_cuda_graph": p.decode_graphs, "prefill_cuda_graph": p.prefill_graphs,
        "speculative_algorithm": algo, "speculative_num_steps": steps,
        "speculative_eagle_topk": topk, "speculative_num_draft_tokens": draft,
        "max_running_requests": mrr,
        "kv_cache_dtype": base.get("kv_cache_dtype") or "auto",
    })
    return base


def _matches(value: Any, matcher: Any) -> bool:
    if isinstance(matcher, list):
        return any(_equal(value, m) for m in matcher)
    if isinstance(matcher, dict):
        return all(_op(value, op, arg) for op, arg in matcher.items())
    return _equal(value, matcher)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a is None and b is False) or (b is None and a is False)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def _op(value: Any, op: str, arg: Any) -> bool:
    if op == "eq":
        return _equal(value, arg)
    if op == "ne":
        return not _equal(value, arg)
    if op == "in":
        return any(_equal(value, a) for a in arg)
    if op == "not_in":
        return not any(_equal(value, a) for a in arg)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False  # an unset or non-numeric setting is never above or below
    return {"gt": value > arg, "ge": value >= arg, "lt": value < arg, "le": value <= arg}[op]


def _apply_table(table: dict, launch: dict, metrics: dict) -> None:
    value = launch.get(table["knob"])
    effect = _table_effect(table, value)
    for k, v in effect.items():
        if table["op"] == "set":
            metrics[k] = v
        elif table["op"] == "add":
            metrics[k] += v
        else:
            metrics[k] *= v


def _table_effect(table: dict, value: Any) -> dict:
    points = table["points"]
    for key, effect in points.items():
        if _equal(value, key):
            return effect
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if table["interpolate"] == "none" or not numeric:
        return table.get("default") or {}
    xs = sorted(points)
    if value <= xs[0]:
        return points[xs[0]]
    if value >= xs[-1]:
        return points[xs[-1]]
    hi = next(i for i, x in enumerate(xs) if x > value)
    x0, x1 = xs[hi - 1], xs[hi]
    if table["interpolate"] == "log2":
        t = (math.log2(value) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    else:
        t = (value - x0) / (x1 - x0)
    p0, p1 = points[x0], points[x1]
    return {k: p0.get(k, 0.0) + t * (p1.get(k, 0.0) - p0.get(k, 0.0))
            for k in set(p0) | set(p1)}


def _startup_error(sim: Any, fail: Fail, p: Any) -> Any:
    if fail.builtin == "capture_oom":
        return sim.capture_oom(p, tried_gb=2.0, avail_gb=max(p.after_pool_gb - 0.12, 0.0))
    if fail.builtin == "illegal_memory_access":
        return sim.StartupError("RuntimeError", ILLEGAL_MEMORY_ACCESS, [fail.frame])
    return sim.StartupError(fail.exception, fail.message, [fail.frame])


def crash_error(sim: Any, fail: Fail) -> Any:
    """The exception a ``serve`` failure dies with (illegal memory access by default)."""
    if fail.builtin == "illegal_memory_access" or not fail.message:
        return sim.StartupError("RuntimeError", ILLEGAL_MEMORY_ACCESS, [fail.frame])
    return sim.StartupError(fail.exception, fail.message, [fail.frame])


def _evaluation(st: Startup, concurrency: int, input_len: int, output_len: int
                ) -> Evaluation:
    p, perf = st.plan, st.perf
    memory = {"mem_fraction_static": p.mem_fraction_static, "weights_gb": p.weights_gb,
              "free_after_weights_gb": p.after_weights_gb,
              "kv_rest_gb": p.after_weights_gb - p.pre_gb * (1 - p.mem_fraction_static),
              "kv_gb": p.kv_gb, "max_total_num_tokens": p.max_total_num_tokens,
              "max_running_requests": p.max_running_requests,
              "decode_graph_gb": p.decode_graph_gb, "available_gpu_mem_gb": p.after_graphs_gb}
    ev = Evaluation(launch=st.launch, concurrency=concurrency, memory=memory)
    if st.error is not None:
        ev.failed, ev.error = "start", f"{st.error.exc_type}: {st.error.message}"
        return ev
    if st.crash is not None:
        err = crash_error(_sim(), st.crash)
        ev.failed, ev.error = "serve", f"{err.exc_type}: {err.message}"
        ev.crash_after_requests = st.crash.after_requests
    need = max(1, input_len + output_len)
    fit = max(1, (perf.kv_tokens or need) // need)
    n = max(1, min(concurrency, perf.max_running or concurrency, fit))
    step = perf.step_seconds(n)
    ev.running = n
    ev.per_stream_tps = 1.0 / step
    ev.total_tps = n / step
    ev.ttft_s = perf.ttft_s + input_len / perf.prefill_tps
    # Closed loop: each of n slots runs its prefill then output_len - 1 decode steps;
    # prefill takes one prompt at a time across the server, so requests/s never exceed
    # prefill_tps / input_len. bench_serving divides output tokens by the duration.
    cycle = ev.ttft_s + (output_len - 1) * step
    rate = n / cycle if cycle > 0 else 0.0
    if input_len > 0:
        rate = min(rate, perf.prefill_tps / input_len)
    ev.output_tps = rate * output_len
    return ev


# -- loading ----------------------------------------------------------------------------


def _number(path: str, name: str, value: Any, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SurfaceError(path, name, f"must be a number, got {value!r}")
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise SurfaceError(path, name, f"must be >= {minimum}, got {value!r}")
    return float(value)


def _mapping_of(path: str, name: str, value: Any, allowed: tuple | None = None) -> dict:
    if not isinstance(value, dict):
        raise SurfaceError(path, name, f"must be a mapping, got {type(value).__name__}")
    if allowed is not None:
        for key in value:
            if key not in allowed:
                raise SurfaceError(path, f"{name}.{key}" if name else str(key),
                                   f"unknown key (known: {', '.join(allowed)})")
    return value


def _metrics(path: str, name: str, value: Any, op: str) -> dict:
    value = _mapping_of(path, name, value, tuple(METRICS))
    floor = 0.0 if op in ("mul", "set") else None
    return {k: _number(path, f"{name}.{k}", v, floor) for k, v in value.items()}


def _launch_key(path: str, name: str, key: Any, known: frozenset | None) -> str:
    if not isinstance(key, str) or not key:
        raise SurfaceError(path, name, f"a launch setting must be a name, got {key!r}")
    if known is not None and key not in known:
        raise SurfaceError(path, name, f"{key!r} is not a launch setting (SGLang server-args "
                           "dest name, or one the stand-in resolves: "
                           "cuda_graph_max_bs, attn_dp_size, decode_cuda_graph ...)")
    return key


def _when(path: str, name: str, value: Any, known: frozenset | None) -> dict:
    value = _mapping_of(path, name, value)
    for key, matcher in value.items():
        _launch_key(path, f"{name}.{key}", key, known)
        if isinstance(matcher, dict):
            if not matcher:
                raise SurfaceError(path, f"{name}.{key}", "an empty matcher matches nothing")
            for op, arg in matcher.items():
                where = f"{name}.{key}.{op}"
                if op not in MATCH_OPS:
                    raise SurfaceError(path, where, f"unknown matcher (known: "
                                       f"{', '.join(MATCH_OPS)})")
                if op in ("in", "not_in") and not isinstance(arg, list):
                    raise SurfaceError(path, where, "must be a list")
                if op in ("gt", "ge", "lt", "le"):
                    _number(path, where, arg)
    return value


def _table(path: str, name: str, value: Any, known: frozenset | None) -> dict:
    value = _mapping_of(path, name, value, TABLE_KEYS)
    for required in ("knob", "points"):
        if required not in value:
            raise SurfaceError(path, f"{name}.{required}", "missing")
    out = {"knob": _launch_key(path, f"{name}.knob", value["knob"], known),
           "op": value.get("op", "mul"), "interpolate": value.get("interpolate", "none")}
    if out["op"] not in ("mul", "add", "set"):
        raise SurfaceError(path, f"{name}.op", f"must be mul, add or set, got {out['op']!r}")
    if out["interpolate"] not in ("none", "linear", "log2"):
        raise SurfaceError(path, f"{name}.interpolate",
                           f"must be none, linear or log2, got {out['interpolate']!r}")
    points = _mapping_of(path, f"{name}.points", value["points"])
    if not points:
        raise SurfaceError(path, f"{name}.points", "must not be empty")
    out["points"] = {k: _metrics(path, f"{name}.points.{k}", v, out["op"])
                     for k, v in points.items()}
    if out["interpolate"] != "none":
        for k in points:
            if isinstance(k, bool) or not isinstance(k, (int, float)) or (
                    out["interpolate"] == "log2" and k <= 0):
                raise SurfaceError(path, f"{name}.points.{k}", "interpolated points need "
                                   "numeric (log2: positive) values")
    if "default" in value:
        out["default"] = _metrics(path, f"{name}.default", value["default"], out["op"])
    return out


def _fail(path: str, name: str, value: Any, rule: str) -> Fail:
    value = _mapping_of(path, name, value, FAIL_KEYS)
    phase = value.get("phase")
    if phase not in ("start", "serve"):
        raise SurfaceError(path, f"{name}.phase", f"must be start or serve, got {phase!r}")
    builtin = value.get("builtin")
    if builtin is not None and builtin not in BUILTINS:
        raise SurfaceError(path, f"{name}.builtin", f"must be one of {', '.join(BUILTINS)}")
    if builtin == "capture_oom" and phase != "start":
        raise SurfaceError(path, f"{name}.builtin", "capture_oom happens at start only")
    if builtin is None and not isinstance(value.get("message"), str):
        raise SurfaceError(path, f"{name}.message", "needed (SGLang's error text) "
                           "unless builtin names one")
    fail = Fail(phase=phase, builtin=builtin, message=value.get("message") or "", rule=rule)
    if "exception" in value:
        if not isinstance(value["exception"], str) or not value["exception"]:
            raise SurfaceError(path, f"{name}.exception", "must be an exception class name")
        fail.exception = value["exception"]
    if "frame" in value:
        parts = str(value["frame"]).split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            raise SurfaceError(path, f"{name}.frame", "must be 'path:line:function'")
        fail.frame = (parts[0], int(parts[1]), parts[2])
    if "after_requests" in value:
        n = value["after_requests"]
        if phase != "serve" or isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SurfaceError(path, f"{name}.after_requests",
                               "a positive integer, only with phase: serve")
        fail.after_requests = n
    return fail


def _rule(path: str, index: int, value: Any, known: frozenset | None) -> Rule:
    name = f"rules[{index}]"
    value = _mapping_of(path, name, value, RULE_KEYS)
    effects = [k for k in ("set", "mul", "add", "table", "fail", "quality") if k in value]
    if not effects:
        raise SurfaceError(path, name, "has no effect (set, mul, add, table, fail or quality)")
    quality = value.get("quality", "")
    if quality and (not isinstance(quality, str) or not QUALITY_PERTURBATION.fullmatch(quality)):
        raise SurfaceError(path, f"{name}.quality", "must be perturbations like fp8_kv, flat, "
                           f"draft_mismatch, nan_after:N, degrade:D, noise:S; got {quality!r}")
    label = value.get("name", name)
    if not isinstance(label, str):
        raise SurfaceError(path, f"{name}.name", "must be a string")
    return Rule(
        name=label, when=_when(path, f"{name}.when", value.get("when") or {}, known),
        set=_metrics(path, f"{name}.set", value.get("set") or {}, "set"),
        mul=_metrics(path, f"{name}.mul", value.get("mul") or {}, "mul"),
        add=_metrics(path, f"{name}.add", value.get("add") or {}, "add"),
        table=_table(path, f"{name}.table", value["table"], known) if "table" in value
        else None,
        fail=_fail(path, f"{name}.fail", value["fail"], label) if "fail" in value else None,
        quality=quality)


def from_data(data: Any, path: str = "<surface>", launch_keys: Any = None) -> Surface:
    """A validated Surface from parsed YAML; SurfaceError names the file and the field."""
    known = frozenset(launch_keys) | frozenset(DERIVED_KEYS) if launch_keys else None
    data = _mapping_of(path, "", data if data is not None else {}, TOP_KEYS)
    if data.get("format") != FORMAT:
        raise SurfaceError(path, "format", f"must be {FORMAT}, got {data.get('format')!r}")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise SurfaceError(path, key, "required, a non-empty string")
    sources = data.get("sources") or []
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise SurfaceError(path, "sources", "must be a list of strings")
    box = data.get("box")
    if box is not None and (not isinstance(box, str) or not re.fullmatch(r"[\w.-]+", box)):
        raise SurfaceError(path, "box", f"must be a lab box name, got {box!r}")
    boxes = Path(__file__).resolve().parent / "nvidia_repo" / "boxes"
    if box is not None and boxes.is_dir() and not (boxes / box).is_dir():
        raise SurfaceError(path, "box", f"no lab box {box!r} (lab/nvidia_repo/boxes: "
                           f"{', '.join(sorted(b.name for b in boxes.iterdir() if b.is_dir()))})")
    hw = _mapping_of(path, "hardware", data.get("hardware") or {}, tuple(HARDWARE))
    hardware = {k: _number(path, f"hardware.{k}", hw.get(k, d), 0.0)
                for k, d in HARDWARE.items()}
    model = None
    if data.get("model") is not None:
        model = dict(_mapping_of(path, "model", data["model"], MODEL_KEYS))
    if "base" not in data:
        raise SurfaceError(path, "base", "required (at least decode_tps)")
    base = _metrics(path, "base", data["base"], "set")
    if "decode_tps" not in base:
        raise SurfaceError(path, "base.decode_tps", "required")
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise SurfaceError(path, "rules", "must be a list")
    return Surface(path=path, name=data["name"], description=data["description"],
                   hardware=hardware, model=model, base=base,
                   rules=[_rule(path, i, r, known) for i, r in enumerate(rules)],
                   launch_keys=known, box=box, noise=_noise(path, data.get("noise")))


def _noise(path: str, value: Any) -> dict:
    """``noise: {run: 0.02, start: 0.01, seed: 7}``: relative sd per benchmark run and
    per server start (each 0..0.2), and the seed of the draws."""
    raw = _mapping_of(path, "noise", value if value is not None else {}, NOISE_KEYS)
    out = {k: _number(path, f"noise.{k}", raw.get(k, 0.0), 0.0) for k in ("run", "start")}
    for k, v in out.items():
        if v > MAX_NOISE:
            raise SurfaceError(path, f"noise.{k}", f"at most {MAX_NOISE}, got {v!r}")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SurfaceError(path, "noise.seed", f"must be an integer, got {seed!r}")
    return {**out, "seed": seed}


def load(path: str | Path, launch_keys: Any = None) -> Surface:
    """Read and validate a surface file. ``launch_keys`` (dest names of the SGLang
    version) makes a rule naming anything else an error; by default the dests of every
    flag catalog this file can find (the wheel's, or gpuserve/data/flags beside lab/)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SurfaceError(path, None, f"cannot read: {e.strerror or e}") from e
    try:
        data = parse_yaml(text)
    except ValueError as e:
        raise SurfaceError(path, None, str(e)) from e
    if launch_keys is None:
        launch_keys = catalog_dests()
    return from_data(data, str(path), launch_keys)


def catalog_dests() -> frozenset | None:
    """Every server-args dest of the flag catalogs at hand (None when there is none)."""
    here = Path(__file__).resolve().parent
    files = [here / "flags.json"] if __package__ == "sglang._standin" else sorted(
        (here.parent / "gpuserve" / "data" / "flags").glob("sglang-*.json"))
    dests: set[str] = set()
    for f in files:
        try:
            dests |= {o["dest"] for o in json.loads(f.read_text())["options"]}
        except (OSError, ValueError, KeyError):
            continue
    return frozenset(dests) or None


# -- optimum ----------------------------------------------------------------------------


@dataclass
class Optimum:
    """``true_optimum``'s answer: the best launch and how the others compare."""

    objective: str
    launch: dict | None           # as given
    value: float                  # tok/s
    concurrency: int
    ranking: list                 # (value, concurrency, launch, Evaluation) best first
    failed: list                  # (launch, Evaluation) that fail at start or crash
    near: list                    # launches within ``tolerance`` of the best


def true_optimum(surface: Surface, launches: list[dict], objective: str,
                 concurrencies: tuple[int, ...] = (1, 4, 16, 64),
                 input_len: int = 1024, output_len: int = 256,
                 metric: str = "decode", tolerance: float = 0.02) -> Optimum:
    """The best of ``launches`` on ``surface``.

    ``single_stream``: highest tok/s at concurrency 1; ``throughput``: highest total tok/s
    at the best of ``concurrencies``. ``metric="decode"`` ranks by decode rate (what the
    decode log line shows), ``"output"`` by bench_serving's output_throughput for
    ``input_len``/``output_len`` requests. Launches that fail at start or crash while
    serving are never the optimum (they are listed in ``failed``)."""
    if objective not in ("single_stream", "throughput"):
        raise ValueError(f"objective must be single_stream or throughput, got {objective!r}")
    if metric not in ("decode", "output"):
        raise ValueError(f"metric must be decode or output, got {metric!r}")
    levels = (1,) if objective == "single_stream" else tuple(concurrencies)
    ranking, failed = [], []
    for launch in launches:
        best = None
        for c in levels:
            ev = surface.evaluate(launch, c, input_len, output_len)
            if not ev.ok:
                failed.append((launch, ev))
                break
            value = (ev.total_tps if metric == "decode" else ev.output_tps)
            if best is None or value > best[0] + 1e-9:
                best = (value, c, launch, ev)
        else:
            if best is not None:
                ranking.append(best)
    ranking.sort(key=lambda r: -r[0])
    if not ranking:
        return Optimum(objective, None, 0.0, 0, [], failed, [])
    top = ranking[0]
    near = [r[2] for r in ranking if r[0] >= top[0] * (1 - tolerance)]
    return Optimum(objective, top[2], top[0], top[1], ranking, failed, near)


# -- the memory arithmetic --------------------------------------------------------------


def _shape(sim: Any, model: dict | None) -> Any:
    shape = sim.ModelShape()
    if model:
        shape = sim.ModelShape.from_config(model)
    return shape


_SIM: Any = None


def _sim() -> Any:
    """The stand-in's sim module: a sibling inside the wheel, its source file otherwise."""
    global _SIM
    if _SIM is not None:
        return _SIM
    if __package__ == "sglang._standin":
        from sglang._standin import sim  # type: ignore[import-not-found]
        _SIM = sim
        return sim
    src = Path(__file__).resolve().parent / "sglang_standin" / "src" / "sglang" / "_standin"
    spec = importlib.util.spec_from_file_location("_gpuserve_lab_standin_sim", src / "sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    _SIM = module
    return module
