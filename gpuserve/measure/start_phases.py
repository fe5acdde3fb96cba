"""Where a server start's time went, read from the stamps of SGLang's own log lines.

Why: a GLM-5 start takes minutes; the user needs to see which phase takes them (weights,
KV pool, CUDA-graph capture, kernel JIT and autotune, warm-up) and what a cache or a
switch changes. The marks are SGLang's lines (model_runner.py "Load weight begin/end",
memory_pool.py "KV Cache is allocated", kv_cache_configurator.py "Memory pool end",
cuda_graph_setup.py "Capture ... graph begin/end", http_server.py "The server is fired
up and ready to roll!", uvicorn's "Uvicorn running on"), FlashInfer's JIT and autotuner
lines (flashinfer/jit/core.py "Loading JIT ops: X" / "Finished loading JIT ops: X",
flashinfer/autotuner.py "[Autotuner]: Autotuning process starts ..." / "ends") and
SGLang's DeepGEMM pre-compile lines (deep_gemm_wrapper/compile_utils.py). A journal's
own stamp (``short-iso-precise``, microseconds) is preferred to SGLang's (seconds).
Phase definitions: docs/startup.md.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

#: the phases, in the order a start goes through them (jit overlaps the others)
PHASES = ("to_weights", "weights", "kv_pool", "graphs", "jit", "warmup", "first_healthy")
LABELS = {"to_weights": "process start to weights", "weights": "weights load",
          "kv_pool": "KV pool", "graphs": "CUDA-graph capture", "jit": "JIT/autotune",
          "warmup": "warm-up", "first_healthy": "first healthy"}

_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)?[ |]")
_BRACKET = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: [A-Z]+\d+)*\]")
_PYLOG = re.compile(r"(?:^|\s)(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - ")
_MARKS = {
    "started": re.compile(r"systemd\[1\]: Started "),
    "load_begin": re.compile(r"Load weight begin\."),
    "load_end": re.compile(r"Load weight end\."),
    "pool_end": re.compile(r"Memory pool end\.|KV Cache is allocated\."),
    "graph_begin": re.compile(r"Capture .*?(?:cuda|CUDA) graph begin\."),
    "graph_end": re.compile(r"Capture .*?(?:cuda|CUDA) graph end\."),
    "server_up": re.compile(r"Uvicorn running on|Application startup complete"),
    "ready": re.compile(r"The server is fired up and ready to roll!"),
}
#: FlashInfer's spans end at their own close line: a JIT op's by its name, the autotuner's
_JIT_OPEN = re.compile(r"Loading JIT ops: (?P<op>\S+)|\[Autotuner\]: Autotuning process starts")
_JIT_CLOSE = re.compile(r"Finished loading JIT ops: (?P<op>\S+)"
                        r"|\[Autotuner\]: Autotuning process ends")
#: DeepGEMM's pre-compile prints no end: its span ends at the next line not its own
_DEEPGEMM = re.compile(r"DeepGEMM JIT|Required memory for warmup")


def line_time(line: str) -> float | None:
    """Seconds since the epoch of one log line: the journal's or ``docker logs -t``'s
    ISO stamp first, else SGLang's ``[date time]`` or Python logging's stamp (naive,
    read as UTC: only differences matter)."""
    m = _ISO.match(line)
    if m:
        zone = (m.group(2) or "+00:00").replace("Z", "+00:00")
        if len(zone) == 5:
            zone = zone[:3] + ":" + zone[3:]
        try:
            return datetime.fromisoformat(m.group(1) + zone).timestamp()
        except ValueError:
            return None
    m = _BRACKET.search(line)
    if m:
        return _naive(m.group(1))
    m = _PYLOG.search(line)
    return _naive(m.group(1)) + int(m.group(2)) / 1000 if m else None


def _naive(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=UTC).timestamp()


def _marks(lines: list[tuple[float, str]]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {k: [] for k in _MARKS}
    for t, line in lines:
        for kind, pattern in _MARKS.items():
            if pattern.search(line):
                found[kind].append(t)
                break
    return found


def _jit_seconds(lines: list[tuple[float, str]]) -> float | None:
    """The union of the JIT and autotune spans; a span never closed is not counted."""
    spans: list[tuple[float, float]] = []
    opened: dict[str, float] = {}  # an op's name, or "" for the autotuner
    deepgemm: float | None = None
    for t, line in lines:
        if close := _JIT_CLOSE.search(line):
            began = opened.pop(close.group("op") or "", None)
            if began is not None:
                spans.append((began, t))
        elif begin := _JIT_OPEN.search(line):
            opened.setdefault(begin.group("op") or "", t)
        if _DEEPGEMM.search(line):
            deepgemm = t if deepgemm is None else deepgemm
        elif deepgemm is not None:
            spans.append((deepgemm, t))
            deepgemm = None
    if not spans:
        return None
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def phases(text: str) -> dict[str, float]:
    """The phases of the one start in ``text`` (a journal or raw log), seconds to 0.1;
    a phase whose marks are missing is left out."""
    lines = [(t, line) for line in text.splitlines()
             if (t := line_time(line)) is not None]
    if not lines:
        return {}
    m = _marks(lines)
    first = {k: v[0] for k, v in m.items() if v}
    last = {k: v[-1] for k, v in m.items() if v}
    start = first.get("started", lines[0][0])
    up = first.get("server_up", last.get("graph_end", last.get("pool_end")))
    spans = {
        "to_weights": (start, first.get("load_begin")),
        "weights": (first.get("load_begin"), last.get("load_end")),
        "kv_pool": (last.get("load_end"), last.get("pool_end")),
        "graphs": (first.get("graph_begin"), last.get("graph_end")),
        "warmup": (up, first.get("ready")),
        "first_healthy": (start, first.get("ready")),
    }
    out = {k: round(b - a, 1) for k, (a, b) in spans.items()
           if a is not None and b is not None and b >= a}
    jit = _jit_seconds(lines)
    if jit is not None:
        out["jit"] = round(jit, 1)
    return {k: out[k] for k in PHASES if k in out}


def format_phases(found: dict[str, float]) -> str:
    """One line: ``weights load 332.1 s, KV pool 12.0 s, ...`` (empty without phases)."""
    return ", ".join(f"{LABELS[k]} {found[k]:.1f} s" for k in PHASES if k in found)
