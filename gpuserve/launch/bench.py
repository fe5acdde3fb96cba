"""Throughput checks: the scenarios a profile is benchmarked with, its expectations, and
the gate that judges a run.

Why: the field notes are about throughput (89.5 tok/s single stream vs 225 tok/s batch),
yet nothing measured it after a deploy. The serve deploy runs SGLang's own client once
per scenario after the health gate; this module is the pure part: what to run, with
which argv, and whether the numbers pass.

How: docs/benchmarks.md, "gpuserve.launch.bench: the profile's bench section"
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuserve.errors import InputError, one_of
from gpuserve.terminal import escaped_key, non_ascii_note


class BenchMode(StrEnum):
    """Host data ``bench``: when the throughput checks run."""

    AUTO = "auto"  # when the served configuration is new to the host
    ALWAYS = "always"
    OFF = "off"


class OnRegression(StrEnum):
    """What a missed throughput gate does."""

    REPORT = "report"  # keep serving, fail the host
    ROLLBACK = "rollback"  # back to the last good configuration, fail the host


ON_REGRESSION = tuple(OnRegression)
BENCH_MODES = tuple(BenchMode)

# SGLang client figures an expectation may name, and the unit family of each.
_THROUGHPUT = ("output_throughput", "input_throughput", "total_throughput")
_LATENCY = tuple(
    f"{stat}_{metric}_ms"
    for stat in ("mean", "median", "p90", "p95", "p99")
    for metric in ("ttft", "itl", "tpot", "e2e_latency")
)
FIGURE_UNITS: dict[str, str] = {
    **{name: "tok/s" for name in _THROUGHPUT},
    "request_throughput": "req/s",
    **{name: "ms" for name in _LATENCY},
}
# unit as written -> (family, factor to the figure's own unit)
_UNITS = {"tok/s": ("tok/s", 1.0), "tokens/s": ("tok/s", 1.0), "req/s": ("req/s", 1.0),
          "ms": ("ms", 1.0), "s": ("ms", 1000.0)}
_EXPECT = re.compile(r"^\s*(>=|<=)?\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*(\S+)\s*$")

#: The keys of the profile's ``bench`` mapping (docs/reference/profile.md is generated
#: from the comments).
BENCH_KEYS = (
    # scenarios by name, each a mapping of the keys below (default: single and batch;
    # a scenario named like a default takes that one's values for the keys it omits)
    # accepts: mapping of name to mapping
    "scenarios",
    # concurrencies: one closed-loop scenario cN each, with the batch scenario's lengths
    # and 2 x N prompts
    # accepts: list[int]
    "sweep",
    # per scenario, SGLang figures to gate on: {figure: "[>=|<=] NUMBER UNIT"}, e.g.
    # output_throughput: ">= 1200 tok/s", median_ttft_ms: "<= 800 ms"
    # accepts: mapping of scenario to mapping of figure to str
    "expect",
    # how far output_throughput may fall below the last good run's, e.g. "10%"
    # accepts: str or number (a percentage in [0, 100))
    "regression_tolerance",
    # a missed gate: report (keep serving) or rollback; host data on_regression overrides it
    # accepts: str: report or rollback
    "on_regression",
    # seconds one scenario's client may run (default 1800, at most 86400)
    # accepts: int or float
    "timeout",
)
#: The keys of one ``bench.scenarios`` entry.
SCENARIO_KEYS = (
    # requests in flight at once (1..4096)
    # accepts: int
    "concurrency",
    # requests in all (at least concurrency, at most 100000)
    # accepts: int
    "prompts",
    # prompt tokens per request (random tokens, fixed length)
    # accepts: int
    "input_len",
    # output tokens per request
    # accepts: int
    "output_len",
    # requests sent before the measured run (0..1000)
    # accepts: int
    "warmup",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
MAX_PROMPTS = 100_000
#: Scenarios a profile may run, named and sweep levels together. Every changed deploy
#: runs each one (tens of seconds to minutes apiece: warm-up, then the prompts), so 64
#: is already an hour's run; a doubling sweep from 1 to 4096 needs 13.
MAX_SCENARIOS = 64
MAX_LEN = 1_048_576


@dataclass(frozen=True)
class Scenario:
    """One run of the client: closed loop, ``concurrency`` requests in flight, fixed
    input/output lengths (``--random-range-ratio 1``), ``prompts`` requests in all."""

    name: str
    concurrency: int
    prompts: int
    input_len: int
    output_len: int
    warmup: int = 1

    def to_dict(self) -> dict:
        return {"name": self.name, **{k: getattr(self, k) for k in SCENARIO_KEYS}}


# Same lengths, so the two are points of one throughput-vs-concurrency curve.
DEFAULT_SCENARIOS = (
    Scenario("single", concurrency=1, prompts=4, input_len=1024, output_len=256),
    Scenario("batch", concurrency=64, prompts=128, input_len=1024, output_len=256),
)


@dataclass(frozen=True)
class Expectation:
    scenario: str
    figure: str  # SGLang's key, e.g. output_throughput, median_ttft_ms
    op: str  # ">=" or "<="
    value: float  # in the figure's own unit (tok/s, req/s, ms)
    unit: str

    @property
    def text(self) -> str:
        return f"{self.figure} {self.op} {self.value:g} {self.unit}"

    def holds(self, measured: float) -> bool:
        return measured >= self.value if self.op == ">=" else measured <= self.value


@dataclass(frozen=True)
class BenchSpec:
    scenarios: tuple[Scenario, ...] = DEFAULT_SCENARIOS
    expectations: tuple[Expectation, ...] = ()
    regression_tolerance_pct: float | None = None
    on_regression: str | None = None  # None: not set in the profile
    timeout_s: float = 1800.0

    def scenario(self, name: str) -> Scenario:
        return next(s for s in self.scenarios if s.name == name)

    def fingerprint(self) -> str:
        """What a recorded run depends on besides the launch: the scenarios."""
        blob = json.dumps([s.to_dict() for s in self.scenarios], separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- parsing


ErrorAt = Callable[[str, str], InputError]


def parse_bench(raw: Any, error: ErrorAt, max_running_requests: int | None = None
                ) -> BenchSpec:
    """The profile's ``bench`` mapping as a :class:`BenchSpec`; ``error(field, message)``
    builds the InputError naming the profile file and line of ``field``."""
    if raw is None:
        return BenchSpec()
    if not isinstance(raw, Mapping):
        raise error("bench", f"must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in BENCH_KEYS:
            raise error(f"bench.{escaped_key(str(key))}", f"unknown key"
                        f"{non_ascii_note(str(key))} (valid: {', '.join(sorted(BENCH_KEYS))})")
    scenarios = _scenarios(raw.get("scenarios"), error)
    named = len(scenarios)
    scenarios += _sweep(raw.get("sweep"), scenarios, error)
    if len(scenarios) > MAX_SCENARIOS:
        raise error("bench.scenarios" if named > MAX_SCENARIOS else "bench.sweep",
                    f"{len(scenarios)} scenarios ({named} named, {len(scenarios) - named} "
                    f"sweep levels): at most {MAX_SCENARIOS}, because every changed deploy "
                    "runs each one")
    if max_running_requests is not None:
        for s in scenarios:
            if s.concurrency > max_running_requests:
                where = (f"bench.scenarios.{s.name}.concurrency" if not s.name.startswith("c")
                         or "sweep" not in raw else "bench.sweep")
                raise error(where, f"concurrency {s.concurrency} exceeds the profile's "
                            f"memory.max_running_requests={max_running_requests}: the extra "
                            "requests would only queue")
    names = [s.name for s in scenarios]
    expectations = _expectations(raw.get("expect"), names, error)
    tolerance = _tolerance(raw.get("regression_tolerance"), error)
    on_regression = raw.get("on_regression")
    if on_regression is not None and on_regression not in ON_REGRESSION:
        raise error("bench.on_regression", f"must be one of {', '.join(ON_REGRESSION)}, "
                    f"got {on_regression!r}")
    timeout = raw.get("timeout", BenchSpec.timeout_s)
    if not _positive_number(timeout) or timeout > 86_400:
        raise error("bench.timeout", f"must be a number of seconds in (0, 86400], "
                    f"got {timeout!r}")
    return BenchSpec(tuple(scenarios), tuple(expectations), tolerance, on_regression,
                     float(timeout))


def _positive_number(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and value > 0)


def _count(value: Any, at: str, error: ErrorAt, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(at, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise error(at, f"must be in {low}..{high}, got {value}")
    return value


def _scenarios(raw: Any, error: ErrorAt) -> list[Scenario]:
    if raw is None:
        return list(DEFAULT_SCENARIOS)
    if not isinstance(raw, Mapping) or not raw:
        raise error("bench.scenarios", "must be a non-empty mapping of scenario name to "
                    "settings (concurrency, prompts, input_len, output_len, warmup)")
    defaults = {s.name: s for s in DEFAULT_SCENARIOS}
    out: list[Scenario] = []
    for name, settings in raw.items():
        at = f"bench.scenarios.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise error(at, "a scenario name is 1-32 letters, digits, '_', '.', '-'")
        if not isinstance(settings, Mapping):
            raise error(at, f"must be a mapping, got {type(settings).__name__}")
        for key in settings:
            if key not in SCENARIO_KEYS:
                raise error(f"{at}.{escaped_key(str(key))}", f"unknown key"
                            f"{non_ascii_note(str(key))} (valid: {', '.join(SCENARIO_KEYS)})")
        base = defaults.get(name, DEFAULT_SCENARIOS[-1])
        values = {k: settings.get(k, getattr(base, k)) for k in SCENARIO_KEYS}
        values["concurrency"] = _count(values["concurrency"], f"{at}.concurrency", error,
                                       low=1, high=4096)
        values["prompts"] = _count(values["prompts"], f"{at}.prompts", error, low=1,
                                   high=MAX_PROMPTS)
        for key in ("input_len", "output_len"):
            values[key] = _count(values[key], f"{at}.{key}", error, low=1, high=MAX_LEN)
        values["warmup"] = _count(values["warmup"], f"{at}.warmup", error, low=0, high=1000)
        if values["prompts"] < values["concurrency"]:
            raise error(f"{at}.prompts", f"{values['prompts']} prompts cannot keep "
                        f"{values['concurrency']} requests in flight: give at least "
                        "concurrency prompts")
        out.append(Scenario(name, **values))
    return out


def _sweep(raw: Any, scenarios: list[Scenario], error: ErrorAt) -> list[Scenario]:
    """``sweep: [8, 32]``: closed-loop scenarios ``c8``, ``c32`` with the batch (else the
    last) scenario's lengths and 2 x concurrency prompts (bench.md section 6)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        raise error("bench.sweep", "must be a non-empty list of concurrencies")
    shape = next((s for s in scenarios if s.name == "batch"), scenarios[-1])
    taken = {s.name for s in scenarios}
    out = []
    for index, value in enumerate(raw):
        c = _count(value, f"bench.sweep[{index}]", error, low=1, high=4096)
        name = f"c{c}"
        if name in taken:
            raise error(f"bench.sweep[{index}]", f"scenario {name} already exists")
        taken.add(name)
        out.append(Scenario(name, concurrency=c, prompts=2 * c, input_len=shape.input_len,
                            output_len=shape.output_len, warmup=shape.warmup))
    return out


def parse_expectation(scenario: str, figure: str, text: Any, at: str,
                      error: ErrorAt) -> Expectation:
    if figure not in FIGURE_UNITS:
        raise error(at, f"not a figure of SGLang's benchmark client (known: "
                    f"{', '.join(sorted(FIGURE_UNITS))})")
    family = FIGURE_UNITS[figure]
    if _positive_number(text):
        raise error(at, f"give a unit: e.g. \"{text} {family}\"")
    match = _EXPECT.match(text) if isinstance(text, str) else None
    if not match:
        raise error(at, f"must look like \"[>=|<=] NUMBER UNIT\" (unit {family}), "
                    f"got {text!r}")
    op, number, unit = match.groups()
    if unit not in _UNITS or _UNITS[unit][0] != family:
        allowed = [u for u, (fam, _) in _UNITS.items() if fam == family]
        raise error(at, f"unknown unit {unit!r} for {figure} (use {' or '.join(allowed)})")
    value = float(number) * _UNITS[unit][1]
    if not math.isfinite(value) or value <= 0:
        raise error(at, f"must be a positive finite number, got {number}")
    op = op or ("<=" if family == "ms" else ">=")
    return Expectation(scenario, figure, op, value, family)


def _expectations(raw: Any, names: list[str], error: ErrorAt) -> list[Expectation]:
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise error("bench.expect", "must be a mapping of scenario name to figures")
    out = []
    for scenario, figures in raw.items():
        at = f"bench.expect.{scenario}"
        if scenario not in names:
            raise error(at, f"no scenario {scenario!r} (scenarios: {', '.join(names)})")
        if not isinstance(figures, Mapping) or not figures:
            raise error(at, "must be a mapping of SGLang figure to \"[>=|<=] NUMBER UNIT\"")
        for figure, text in figures.items():
            out.append(parse_expectation(scenario, str(figure), text, f"{at}.{figure}",
                                         error))
    return out


def _tolerance(raw: Any, error: ErrorAt) -> float | None:
    if raw is None:
        return None
    text = str(raw).strip() if isinstance(raw, str | int | float) and not isinstance(
        raw, bool) else None
    number = text[:-1].strip() if text and text.endswith("%") else text
    try:
        value = float(number) if number is not None else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value < 100:
        raise error("bench.regression_tolerance", f"must be a percentage in [0, 100), "
                    f"e.g. 10%, got {raw!r}")
    return value


# ------------------------------------------------------------------------ host data


def validate_mode(value: Any, source: str) -> BenchMode:
    """Host data ``bench``: ``auto`` (run when the served configuration changed since
    the host's last benchmarked one), ``always``, or ``off``."""
    return BenchMode(one_of(value, source, "bench", BENCH_MODES, "auto"))


def validate_on_regression(value: Any, source: str) -> OnRegression | None:
    if value is None or value == "":
        return None
    if value not in ON_REGRESSION:
        raise InputError(source, "on_regression", f"must be one of "
                         f"{', '.join(ON_REGRESSION)}, got {value!r}")
    return OnRegression(value)


# ------------------------------------------------------------------------------ argv


def client_argv(scenario: Scenario, *, port: int, served_name: str, tokenizer: str,
                output_file: str, tag: str) -> list[str]:
    """``python -m sglang.benchmark.serving`` arguments for one scenario (bench.md):
    SGLang's native backend, ``random-ids`` prompts (no download; the tokenizer is the
    model directory, read offline), fixed lengths, a closed loop of ``concurrency``."""
    return [
        "--backend", "sglang",
        "--base-url", f"http://127.0.0.1:{port}",
        "--model", served_name,
        "--tokenizer", tokenizer,
        "--dataset-name", "random-ids",
        "--random-input-len", str(scenario.input_len),
        "--random-output-len", str(scenario.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(scenario.prompts),
        "--max-concurrency", str(scenario.concurrency),
        "--warmup-requests", str(scenario.warmup),
        "--output-file", output_file,
        "--tag", tag,
    ]


def run_fingerprint(launch_hash: str, lock: str, spec: BenchSpec) -> str:
    """Identity of a benchmarked configuration: the rendered launch, the installed lock
    and the scenarios. Equal to the host's mark means: already measured, skip."""
    blob = f"{launch_hash}|{lock}|{spec.fingerprint()}"
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------------------ gate


@dataclass
class GateResult:
    checked: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.misses

    def to_dict(self) -> dict:
        return {"passed": self.passed, "checked": list(self.checked),
                "misses": list(self.misses)}


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.1f}" if abs(value) < 1e6 else f"{value:.3g}"


def judge(spec: BenchSpec, scenario: str, figures: Mapping[str, Any],
          last_good: Mapping[str, Any] | None, last_good_label: str = "last good"
          ) -> GateResult:
    """Expectations of ``scenario`` and the regression tolerance against the figures of
    the host's last good run (None: no such run). Each line shows the numbers side by
    side: measured, expected (or the last good figure and the allowed floor)."""
    result = GateResult()
    for e in spec.expectations:
        if e.scenario != scenario:
            continue
        measured = figures.get(e.figure)
        if not isinstance(measured, int | float) or isinstance(measured, bool):
            result.misses.append(f"{scenario}: {e.figure} missing from the run "
                                 f"(expected {e.op} {_fmt(e.value)} {e.unit})")
            continue
        line = (f"{scenario}: {e.figure} {_fmt(measured)} {e.unit}, expected {e.op} "
                f"{_fmt(e.value)} {e.unit}")
        (result.checked if e.holds(measured) else result.misses).append(line)
    tol = spec.regression_tolerance_pct
    if tol is not None and last_good is not None:
        now, before = figures.get("output_throughput"), last_good.get("output_throughput")
        if isinstance(now, int | float) and isinstance(before, int | float) and before > 0:
            floor = before * (1 - tol / 100)
            change = (now - before) / before * 100
            line = (f"{scenario}: output_throughput {_fmt(now)} tok/s vs {last_good_label} "
                    f"{_fmt(before)} tok/s ({change:+.1f}%, tolerance -{tol:g}%)")
            (result.checked if now >= floor else result.misses).append(line)
    return result


def result_line(host: str, scenario: Scenario, figures: Mapping[str, Any]) -> str:
    """``<host>: bench: batch c64 1024/256: 2,210.4 out tok/s, TTFT 812 ms, ITL 27.1 ms``."""

    def get(key: str) -> str:
        value = figures.get(key)
        return _fmt(value) if isinstance(value, int | float) else "-"

    return (f"{host}: bench: {scenario.name} c{scenario.concurrency} "
            f"{scenario.input_len}/{scenario.output_len}: "
            f"{get('output_throughput')} out tok/s, {get('request_throughput')} req/s, "
            f"median TTFT {get('median_ttft_ms')} ms, median ITL {get('median_itl_ms')} ms "
            f"({get('completed')} requests in {get('duration')} s)")


# ------------------------------------------------------------------- host run status


class RunState(StrEnum):
    """A benchmark run's state on the host (``sglang_bench.py status``'s words)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    MISSING = "missing"


@dataclass(frozen=True)
class RunStatus:
    """One ``sglang_bench.py status`` report (gpuserve/data/scripts/sglang_bench.py)."""

    state: RunState
    done: int = 0
    total: int | None = None
    elapsed: float = 0.0
    rc: int | None = None
    tail: tuple[str, ...] = ()
    line: str | None = None  # SGLang's result line (server_info removed), when done


def parse_status(text: str) -> RunStatus:
    """The host script's JSON; anything else is reported as a failed run with its text."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return RunStatus(RunState.FAILED, tail=tuple(str(text).splitlines()[-15:]))
    if not isinstance(doc, dict) or doc.get("state") not in tuple(RunState):
        return RunStatus(RunState.FAILED, tail=(str(text)[:500],))
    total = doc.get("total")
    return RunStatus(
        state=RunState(doc["state"]), done=int(doc.get("done") or 0),
        total=int(total) if isinstance(total, int) else None,
        elapsed=float(doc.get("elapsed") or 0.0),
        rc=doc.get("rc") if isinstance(doc.get("rc"), int) else None,
        tail=tuple(str(x) for x in doc.get("tail") or ()),
        line=doc.get("line") if isinstance(doc.get("line"), str) else None,
    )


def progress_line(host: str, scenario: Scenario, status: RunStatus) -> str:
    """``<host>: bench: batch (c64, 128 prompts): 37/128 requests, 41 s``."""
    total = status.total or scenario.prompts
    return (f"{host}: bench: {scenario.name} (c{scenario.concurrency}, {scenario.prompts} "
            f"prompts): {status.done}/{total} requests, {status.elapsed:.0f} s")
