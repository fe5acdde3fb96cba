"""A tune file: which launch settings a tune varies, over which values, judged how.

Why a file of its own beside the profiles (``profiles/tune/<name>.tune.yaml``): the
profile says how a model is served; the tune file says what to try around it, and both
are data a user reviews. Every value is checked with the host's SGLang flag catalog here,
before any host is touched, with errors naming this file, the line and the knob.

How: docs/tune.md, "The tune file" and "gpuserve.tune.space: the annotated format"
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.launch.profiles import (
    NAME_PATTERN,
    SECTIONS,
    Origin,
    Profile,
    error_at,
    load_profile_with,
    read_with_origins,
    resolve_profile_path,
)

TOP_KEYS = ("incumbent", "knobs", "loads", "requests", "objectives", "budget",
            "early_stop", "combine", "repeats", "description")
OBJECTIVES = ("single_stream", "goodput", "pareto")
#: SLO names -> SGLang benchmark figure (milliseconds)
SLO_FIGURES = {f"{stat}_{metric}": f"{stat}_{metric}_ms"
               for stat in ("median", "p99", "mean") for metric in ("ttft", "itl", "tpot")}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]+)\s*$")
_MS_UNITS = {"ms": 1.0, "s": 1000.0}
_WALL_UNITS = {"s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
MAX_KNOB_VALUES = 32
MAX_KNOBS = 16
MAX_LOADS = 16
#: without a budget the tune measures its whole plan: at most this many launches
UNBUDGETED_LAUNCHES = 12
#: ``auto`` values count as this many when sizing a plan before the host is read
#: (gpuserve/tune/defaults.py gives at most five per knob)
AUTO_VALUES = 5
MAX_WALL_S = 30 * 24 * 3600.0
DEFAULT_REQUESTS = {"input_len": 1024, "output_len": 256, "prompts_per_level": 2}
OFF = "off"


@dataclass(frozen=True)
class KnobValue:
    """One value of a knob: the profile fields it sets (dotted -> value, None unsets) and
    the extra SGLang arguments it adds; ``label`` is how tables show it."""

    label: str
    fields: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[KnobValue, ...]
    origin: Origin


@dataclass(frozen=True)
class Objective:
    name: str
    slo: dict[str, float] = field(default_factory=dict)  # SGLang figure -> limit in ms


@dataclass(frozen=True)
class Budget:
    loads: int | None = None  # candidate server starts, incumbent included
    wall_s: float | None = None


@dataclass(frozen=True)
class Repeats:
    """Benchmark runs in the same server: the incumbent's load levels run ``incumbent``
    times (the host's noise); then the incumbent, the leader and every candidate within
    the noise of the leader run again until separated or they have the runs that tell
    a gain of ``resolution`` from the noise, at most ``most`` runs per load level (a
    contender whose gain over the incumbent is undecided up to the incumbent's runs,
    at most twice ``most``)."""

    incumbent: int = 3
    most: int = 10
    resolution: float = 0.02


@dataclass(frozen=True)
class TuneSpec:
    name: str
    source: Path
    incumbent: Path
    knobs: tuple[Knob, ...]
    loads: tuple[int, ...]
    input_len: int
    output_len: int
    prompts_per_level: int
    objectives: tuple[Objective, ...]
    budget: Budget
    early_stop: float | None
    combine: int
    repeats: Repeats = field(default_factory=Repeats)
    locations: dict[str, Origin] = field(default_factory=dict, repr=False, compare=False)

    def objective(self, name: str) -> Objective | None:
        return next((o for o in self.objectives if o.name == name), None)

    def error(self, dotted: str, message: str) -> InputError:
        origin = self.locations.get(dotted) or Origin(str(self.source), None)
        return InputError(origin.file, dotted, message, origin.line)


# ----------------------------------------------------------------------------- parsing


def load_tune(path: str | Path) -> tuple[TuneSpec, dict[str, Any]]:
    """Parse a tune file (no catalog check yet: that needs the host's SGLang version,
    :func:`check_space`). Returns the spec and the raw ``knobs`` mapping, which
    :func:`resolve_knobs` turns into knobs once host defaults are known."""
    src = Path(path)
    if not src.exists():
        raise InputError(src, None, "no such tune file")
    safeload.regular_file(src)  # a FIFO, a device, a directory: named, never opened
    data, locs = read_with_origins(src)
    error = error_at(locs, src)
    for key in data:
        if key not in TOP_KEYS:
            raise error(str(key), f"unknown key (valid: {', '.join(TOP_KEYS)})")
    name = src.name.removesuffix(".yaml").removesuffix(".yml").removesuffix(".tune")
    if not NAME_PATTERN.fullmatch(name) or len(name) > 40:
        raise InputError(src, None, "a tune file's name (before .tune.yaml) is 1-40 letters, "
                         "digits, '.', '_', '-'")
    incumbent = _incumbent(data.get("incumbent"), src, error)
    knobs = data.get("knobs")
    if not isinstance(knobs, Mapping) or not knobs:
        raise error("knobs", "the search space is empty: give at least one knob with "
                    "values (e.g. memory.cuda_graph_max_bs: [128, 256])")
    if len(knobs) > MAX_KNOBS:
        raise error("knobs", f"{len(knobs)} knobs: at most {MAX_KNOBS}")
    requests = _requests(data.get("requests"), error)
    spec = TuneSpec(
        name=name, source=src, incumbent=incumbent, knobs=(),
        loads=_loads(data.get("loads"), error), objectives=_objectives(data.get("objectives"),
                                                                        error),
        budget=_budget(data.get("budget"), error),
        early_stop=_fraction(data.get("early_stop", 0.75), "early_stop", error),
        combine=_int(data.get("combine", 2), "combine", error, low=0, high=8),
        repeats=_repeats(data.get("repeats"), error), locations=locs, **requests)
    if spec.budget.loads is None and spec.budget.wall_s is None:
        # no budget, or one whose every bound is null: the space itself must be small
        spec = _bounded_by_space(spec, knobs, error, "knobs" if data.get("budget") is None
                                 else "budget")
    return spec, dict(knobs)


def plan_bound(one_knob: int) -> int:
    """The most launches a tune can load: the incumbent and every one-knob value (the
    sweep), then follow-ups (retries, each objective's combinations, neighbours) of at
    most ``FOLLOW_UP`` x the sweep's loads, rounded up."""
    sweep = 1 + one_knob
    return sweep + math.ceil(FOLLOW_UP * sweep)


#: after the one-knob sweep, retries, combinations and neighbours load at most this
#: fraction of the sweep's loads more (rounded up): they follow up what the sweep found
FOLLOW_UP = 0.5
#: a tune retries at most this many values that failed alone for memory
MAX_RETRIES = 2


def _bounded_by_space(spec: TuneSpec, knobs: Mapping, error, at: str) -> TuneSpec:
    """No budget: the tune measures its whole plan, so the plan must be small.

    ``at`` is the field named when it is not: ``knobs`` when the file has no budget,
    ``budget`` when its budget sets no bound (``{loads: null, wall: null}``)."""
    one_knob = sum(AUTO_VALUES if v == "auto" else len(v) if isinstance(v, list) else 1
                   for v in knobs.values())
    bound = plan_bound(one_knob)
    if bound > UNBUDGETED_LAUNCHES:
        unset = ("without a budget" if at == "knobs" else "a budget whose loads and wall "
                 "are null (not set) bounds nothing, and without a bound")
        raise error(at, f"{len(knobs)} knobs with {one_knob} values plan up to {bound} "
                    f"launches; {unset} a tune measures at most {UNBUDGETED_LAUNCHES}: "
                    "give budget: {loads: N} and/or {wall: 2 h}")
    import dataclasses

    return dataclasses.replace(spec, budget=Budget(loads=bound))


def _incumbent(raw: Any, src: Path, error) -> Path:
    if not isinstance(raw, str) or not raw:
        raise error("incumbent", "required: the profile the tune starts from (a name in "
                    "profiles/ or a path relative to this file)")
    try:
        path = resolve_profile_path(raw)  # a bare name: profiles/<name>.yaml, as serve's
    except InputError as e:
        raise error("incumbent", e.message) from e
    if "/" in raw and not Path(raw).is_absolute():
        path = src.parent / raw  # a path: relative to the tune file
    if not path.exists():
        raise error("incumbent", f"no such profile: {path}")
    what = safeload.not_regular(path.stat().st_mode)
    if what:
        raise error("incumbent", f"{path} is {what}, not a regular file")
    target = path.resolve()
    if target.suffix not in (".yaml", ".yml"):
        raise error("incumbent", f"{raw!r} resolves to {target}, which is not a profile's "
                    ".yaml file (a symlink out of place?)")
    return target


def _int(value: Any, at: str, error, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(at, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise error(at, f"must be in {low}..{high}, got {value}")
    return value


def _fraction(value: Any, at: str, error) -> float | None:
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise error(at, f"must be a fraction in (0, 1) or null, got {value!r}")
    return float(value)


def _loads(raw: Any, error) -> tuple[int, ...]:
    if raw is None:
        return (1, 8, 32, 64)
    if not isinstance(raw, list) or not raw:
        raise error("loads", "must be a non-empty list of concurrencies, starting at 1")
    levels = [_int(v, f"loads[{i}]", error, low=1, high=4096) for i, v in enumerate(raw)]
    if levels[0] != 1:
        raise error("loads[0]", "the first load level must be 1 (single stream)")
    if levels != sorted(set(levels)) or len(levels) > MAX_LOADS:
        raise error("loads", f"must rise strictly, at most {MAX_LOADS} levels")
    return tuple(levels)


def _requests(raw: Any, error) -> dict[str, int]:
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise error("requests", "must be a mapping (input_len, output_len, prompts_per_level)")
    for key in raw:
        if key not in DEFAULT_REQUESTS:
            raise error(f"requests.{key}", f"unknown key (valid: {', '.join(DEFAULT_REQUESTS)})")
    merged = {**DEFAULT_REQUESTS, **raw}
    return {"input_len": _int(merged["input_len"], "requests.input_len", error, low=1,
                              high=1_048_576),
            "output_len": _int(merged["output_len"], "requests.output_len", error, low=1,
                               high=1_048_576),
            "prompts_per_level": _int(merged["prompts_per_level"], "requests.prompts_per_level",
                                      error, low=1, high=100)}


def parse_ms(value: Any, at: str, error) -> float:
    """``"2 s"`` / ``"150 ms"`` -> milliseconds; a bare number or another unit is an error."""
    if isinstance(value, bool | int | float):
        raise error(at, f"give a unit: \"{value} ms\" or \"{value} s\"")
    m = _DURATION.match(value) if isinstance(value, str) else None
    if not m or m.group(2) not in _MS_UNITS:
        raise error(at, f"must be a duration in ms or s (e.g. \"200 ms\", \"2 s\"), "
                    f"got {value!r}")
    ms = float(m.group(1)) * _MS_UNITS[m.group(2)]
    if not math.isfinite(ms) or ms <= 0:
        raise error(at, f"must be positive, got {value!r}")
    return ms


def _objectives(raw: Any, error) -> tuple[Objective, ...]:
    if raw is None:
        return (Objective("single_stream"), Objective("pareto"))
    if not isinstance(raw, Mapping) or not raw:
        raise error("objectives", f"must be a non-empty mapping of {', '.join(OBJECTIVES)}")
    out = []
    for name, settings in raw.items():
        at = f"objectives.{name}"
        if name not in OBJECTIVES:
            raise error(at, f"unknown objective (valid: {', '.join(OBJECTIVES)})")
        settings = {} if settings is None else settings
        if not isinstance(settings, Mapping):
            raise error(at, "must be a mapping")
        for key in settings:
            if key != "slo" or name != "goodput":
                raise error(f"{at}.{key}", "unknown key" + (" (valid: slo)"
                                                           if name == "goodput" else ""))
        slo = {}
        if name == "goodput":
            raw_slo = settings.get("slo")
            if not isinstance(raw_slo, Mapping) or not raw_slo:
                raise error(f"{at}.slo", "goodput needs SLOs, e.g. {median_ttft: 2 s, "
                            "p99_itl: 100 ms}")
            for key, limit in raw_slo.items():
                if key not in SLO_FIGURES:
                    raise error(f"{at}.slo.{key}", "unknown SLO (valid: "
                                f"{', '.join(SLO_FIGURES)})")
                slo[SLO_FIGURES[key]] = parse_ms(limit, f"{at}.slo.{key}", error)
        out.append(Objective(name, slo))
    return tuple(out)


def _repeats(raw: Any, error) -> Repeats:
    if raw is None:
        return Repeats()
    if not isinstance(raw, Mapping):
        raise error("repeats", "must be a mapping (incumbent, most, resolution)")
    for key in raw:
        if key not in ("incumbent", "most", "resolution"):
            raise error(f"repeats.{key}", "unknown key (valid: incumbent, most, resolution)")
    runs = _int(raw.get("incumbent", Repeats.incumbent), "repeats.incumbent", error, low=1,
                high=20)
    most = _int(raw.get("most", max(Repeats.most, runs)), "repeats.most", error, low=runs,
                high=50)
    resolution = raw.get("resolution", Repeats.resolution)
    if isinstance(resolution, bool) or not isinstance(resolution, int | float) or \
            not 0.001 <= resolution <= 0.5:
        raise error("repeats.resolution", "must be a relative gain between 0.001 and 0.5 "
                    f"(0.02: 2 %), got {resolution!r}")
    return Repeats(runs, most, float(resolution))


def _budget(raw: Any, error) -> Budget:
    """``loads`` and/or ``wall``; a null one is not set (both null: no bound at all,
    which :func:`load_tune` treats as no budget)."""
    if raw is None:
        return Budget(loads=None)
    if not isinstance(raw, Mapping) or not raw:
        raise error("budget", "must be a mapping with loads and/or wall")
    for key in raw:
        if key not in ("loads", "wall"):
            raise error(f"budget.{key}", "unknown key (valid: loads, wall)")
    loads = raw.get("loads")
    if loads is not None:
        loads = _int(loads, "budget.loads", error, low=1, high=10_000)
    wall = raw.get("wall")
    wall_s = None
    if wall is not None:
        m = _DURATION.match(wall) if isinstance(wall, str) else None
        if not m or m.group(2) not in _WALL_UNITS:
            raise error("budget.wall", f"must be a duration in s, min or h (e.g. \"2 h\"), "
                        f"got {wall!r}")
        wall_s = float(m.group(1)) * _WALL_UNITS[m.group(2)]
        if wall_s <= 0:
            raise error("budget.wall", f"must be positive, got {wall!r}")
        if not math.isfinite(wall_s) or wall_s > MAX_WALL_S:
            raise error("budget.wall", f"at most 30 days ({MAX_WALL_S:.0f} s), got "
                        f"{wall[:40]!r}")
    return Budget(loads=loads, wall_s=wall_s)


# ----------------------------------------------------------------------------- knobs


def _section_fields() -> set[str]:
    import dataclasses

    return {f"{name}.{f.name}" for name, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)}


#: sections and fields a tune may not vary: the model and its checkpoint, where the
#: server listens, the node layout; a tune varies how one node launches one model
FIXED_SECTIONS = ("model", "server")
FIXED_FIELDS = {"parallel.nnodes", "parallel.node_rank", "parallel.dist_init_addr",
                "parallel.dist_init_port"}
#: SGLang dests of the same things, for raw flags (``--nnodes``, ``--model-path``, ...)
FIXED_DESTS = frozenset({
    "model_path", "tokenizer_path", "served_model_name", "revision", "load_format",
    "download_dir", "trust_remote_code", "quantization", "model_loader_extra_config",
    "host", "port", "nnodes", "node_rank", "dist_init_addr", "dist_init_port",
    "config", "tokenizer_mode", "skip_tokenizer_init", "model_impl"})


def fixed_field(name: str) -> bool:
    return name.split(".", 1)[0] in FIXED_SECTIONS or name in FIXED_FIELDS


def _check_raw(value: Any, at: str, spec: TuneSpec) -> None:
    """Every scalar of a knob value: finite numbers, text without control characters
    (a newline or a terminal escape would reach a command line and a terminal)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_raw(key, at, spec)
            _check_raw(item, f"{at}.{key}" if _printable(key) else at, spec)
    elif isinstance(value, list):
        for item in value:
            _check_raw(item, at, spec)
    elif isinstance(value, float) and not math.isfinite(value):
        raise spec.error(at, f"must be a finite number, got {value!r}")
    elif isinstance(value, str) and not _printable(value):
        raise spec.error(at, f"holds a control character (newline, tab, escape, ...): "
                         f"{ascii(value)[:60]}")
    elif isinstance(value, str) and len(value) > 512:
        raise spec.error(at, f"at most 512 characters, got {len(value)}")


def _printable(value: Any) -> bool:
    return not isinstance(value, str) or value.isprintable()


def _label(value: Any) -> str:
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def knob_values(name: str, raw: Any, spec: TuneSpec) -> Knob:
    """One knob's values (``auto`` already replaced by the caller), checked for shape and
    field names; the types and the catalog are checked by :func:`check_space`."""
    if not _printable(name) or len(name) > 128:
        raise spec.error("knobs", f"a knob's name holds a control character or is too long: "
                         f"{ascii(name)[:60]}")
    at = f"knobs.{name}"
    origin = spec.locations.get(at) or Origin(str(spec.source), None)
    if name.startswith("--"):
        _check_flag_name(name, at, spec)
    elif fixed_field(name):
        raise spec.error(at, "a tune varies launch settings, not the model, its checkpoint, "
                         "where the server listens or the node layout")
    if not isinstance(raw, list) or not raw:
        raise spec.error(at, "must be a non-empty list of values")
    if len(raw) > MAX_KNOB_VALUES:
        raise spec.error(at, f"at most {MAX_KNOB_VALUES} values")
    fields = _section_fields()
    values: list[KnobValue] = []
    for index, value in enumerate(raw):
        vat = f"{at}[{index}]"
        _check_raw(value, vat, spec)
        if name.startswith("--"):
            values.append(_flag_value(name, value, vat, spec))
        elif name in fields:
            if isinstance(value, Mapping | list):
                raise spec.error(vat, f"{name} takes a single value, got {type(value).__name__}")
            value = None if value == "auto" else value
            values.append(KnobValue(_label(value), {name: value}))
        else:
            values.append(_bundle(name, value, vat, fields, spec))
    values = _short_labels(values)
    labels = [v.label for v in values]
    if len(set(labels)) != len(labels):
        raise spec.error(at, f"values repeat: {labels}")
    return Knob(name, tuple(values), origin)


_SHORT = {"mem_fraction_static": "mfs", "cuda_graph_max_bs": "graph_bs",
          "max_running_requests": "max_running", "chunked_prefill_size": "chunk"}


def _short_labels(values: list[KnobValue]) -> list[KnobValue]:
    """Bundle labels name only the fields whose values differ between the bundles."""
    if not any("=" in v.label for v in values):
        return values
    keys = {k for v in values for k in v.fields}
    varying = {k for k in keys if len({repr(v.fields.get(k, "-")) for v in values}) > 1}
    out = []
    for v in values:
        if v.label == OFF or not v.fields:
            out.append(v)
            continue
        shown = [k for k in v.fields if k in varying] or list(v.fields)[:1]
        text = ",".join(f"{_SHORT.get(k.rsplit('.', 1)[-1], k.rsplit('.', 1)[-1])}="
                        f"{_label(v.fields[k])}" for k in shown)
        out.append(KnobValue(text, v.fields, v.extra_args))
    return out


def _check_flag_name(name: str, at: str, spec: TuneSpec) -> None:
    """A flag knob's name alone: no ``=value`` in it, and no secret (its values are
    never shown: they would be the secret)."""
    from gpuserve.launch.secrets import secret_flags

    if "=" in name:
        raise spec.error("knobs", "a flag knob is named without '=VALUE' (the values go in "
                         "its list)")
    hits = secret_flags([name])
    if hits:
        raise spec.error(at, f"{name} carries a secret ({hits[0].flag}): set it in host data "
                         "(sglang_api_key / hf_token), never in a tune; its values are not "
                         "shown")


def _flag_value(name: str, value: Any, at: str, spec: TuneSpec) -> KnobValue:
    if value is None or value == OFF or value is False:  # YAML reads off as false
        return KnobValue(OFF)
    if isinstance(value, bool) and value:
        return KnobValue("on", extra_args=(name,))
    if isinstance(value, Mapping | list | bool):
        raise spec.error(at, f"a flag's value is a number or a string, got {value!r}")
    return KnobValue(str(value), extra_args=(name, str(value)))


def _bundle(name: str, value: Any, at: str, fields: set[str], spec: TuneSpec) -> KnobValue:
    if (value == OFF or value is False) and name in SECTIONS:  # YAML reads off as false
        unset = {f: None for f in fields if f.startswith(f"{name}.")}
        return KnobValue(OFF, unset)
    if not isinstance(value, Mapping) or not value:
        raise spec.error(at, f"{name!r} is neither a profile field nor a flag (--...), so "
                         "each value must be a mapping of profile fields, e.g. "
                         "{parallel.ep: 8, moe.a2a_backend: flashinfer}"
                         + (f", or {OFF!r}" if name in SECTIONS else ""))
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in fields:
            raise spec.error(f"{at}.{key}", "not a profile field (e.g. memory.cuda_graph_max_bs)")
        if fixed_field(key):
            raise spec.error(f"{at}.{key}", "a tune varies launch settings, not the model, "
                             "its checkpoint, where the server listens or the node layout")
        out[key] = None if item == "auto" else item
    label = ",".join(f"{k.rsplit('.', 1)[-1]}={_label(v)}" for k, v in out.items())
    return KnobValue(label, out)


def nested(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``{"memory.x": 1}`` -> ``{"memory": {"x": 1}}`` (a child profile's shape)."""
    out: dict[str, Any] = {}
    for dotted, value in fields.items():
        section, _, key = dotted.partition(".")
        out.setdefault(section, {})[key] = value
    return out


def candidate_profile(spec: TuneSpec, choice: Mapping[str, KnobValue], name: str,
                      extra_origins: bool = True) -> Profile:
    """The incumbent with one value per knob in ``choice`` applied, validated like a
    profile file (types, cross-field rules, catalogs of its sglang_versions); errors name
    the tune file's line of the value."""
    fields: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    extra: list[str] = []
    for knob_name, value in choice.items():
        for dotted, item in value.fields.items():
            fields[dotted] = item
            origins[dotted] = spec.locations.get(f"knobs.{knob_name}") or Origin(
                str(spec.source), None)
        extra.extend(value.extra_args)
    overrides = nested(fields)
    # the tuner benchmarks every candidate at its own load levels, the incumbent's
    # scenarios and floors dropped (candidates.bench_section): they are not checked here
    overrides["bench"] = None
    if extra:
        base = _incumbent_extra_args(spec)
        overrides["extra_args"] = [*base, *extra]
        origins["extra_args"] = Origin(str(spec.source), None)
    return load_profile_with(spec.incumbent, overrides, origins if extra_origins else {}, name)


def _incumbent_extra_args(spec: TuneSpec) -> list[str]:
    from gpuserve.launch.profiles import load_profile

    return list(load_profile(spec.incumbent).extra_args)


def check_space(spec: TuneSpec, knobs: tuple[Knob, ...], version: str) -> None:
    """Render every knob value on the incumbent for SGLang ``version`` and check it with
    that version's flag catalog; InputError naming the tune file and ``knobs.N[i]``."""
    from gpuserve.launch import catalog
    from gpuserve.launch.dialect import render_launch

    flags = catalog.load_catalog(catalog.base_version(version))
    for knob in knobs:
        if knob.name.startswith("--"):
            _check_flag(knob, flags, spec)
        for index, value in enumerate(knob.values):
            at = f"knobs.{knob.name}[{index}]"
            try:
                profile = candidate_profile(spec, {knob.name: value}, "tune-check")
                render_launch(profile, version)
            except InputError as e:
                line = _value_line(spec, knob, index)
                raise InputError(spec.source, at, f"{value.label}: {e.message}"
                                 + (f" ({e.field})" if e.field and e.field not in at else ""),
                                 line) from e


def _check_flag(knob: Knob, flags, spec: TuneSpec) -> None:
    at = f"knobs.{knob.name}"
    try:
        option = flags.resolve(knob.name)
    except InputError as e:
        raise spec.error(at, f"{e.message}: the host's SGLang lacks this flag") from e
    if option.action == "DeprecatedAliasStoreAction" or (option.extra or {}).get("new_flag"):
        new = (option.extra or {}).get("new_flag") or option.name
        raise spec.error(at, f"{knob.name} is a deprecated alias of {new} in SGLang "
                         f"{flags.version}: name {new}, or the profile field that renders "
                         "the right spelling per version (e.g. memory.cuda_graph_max_bs)")
    if knob.name not in option.flags:
        raise spec.error(at, f"{knob.name} only abbreviates {option.name}: name it in full")
    if option.dest in FIXED_DESTS:
        raise spec.error(at, f"{knob.name} sets {option.dest}: a tune varies launch settings, "
                         "not the model, its checkpoint, where the server listens or the "
                         "node layout")


def _value_line(spec: TuneSpec, knob: Knob, index: int) -> int | None:
    origin = spec.locations.get(f"knobs.{knob.name}[{index}]") or knob.origin
    return origin.line
