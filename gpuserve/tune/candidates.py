"""Candidates: the incumbent, one knob at a time, then the best values combined.

A candidate is a choice of one value for some knobs (the others stay as the incumbent
has them). Its name is ``<tune>-<12 hex>``, a hash of the choice and of what makes a
measurement comparable (the incumbent profile's bytes, the host's configuration, the
deploy's extra host data), so a rerun finds its records under the same name and a
changed host or profile measures afresh. The candidate's profile file extends the
incumbent and holds the chosen fields, so ``--data profile=FILE`` serves it as it is.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuserve import safeload
from gpuserve.tune.space import Knob, KnobValue, TuneSpec, nested

#: "refinement": the phase of earlier tunes' records (a neighbour within the noise now)
PHASES = ("incumbent", "one knob", "retry", "combination", "refinement", "neighbour")


@dataclass(frozen=True)
class Candidate:
    name: str
    phase: str
    choice: dict[str, KnobValue] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.choice:
            return "incumbent"
        return " ".join(f"{k}={v.label}" for k, v in self.choice.items())

    def labels(self) -> dict[str, str]:
        return {k: v.label for k, v in self.choice.items()}


def candidate_name(spec: TuneSpec, choice: Mapping[str, KnobValue], config_key: str) -> str:
    blob = json.dumps({"incumbent": safeload.read_bytes(spec.incumbent).decode("utf-8", "replace"),
                       "config": config_key,
                       "choice": {k: [v.fields, list(v.extra_args)]
                                  for k, v in sorted(choice.items())}},
                      sort_keys=True, default=str)
    return f"{spec.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def incumbent_value(knob: Knob, profile) -> KnobValue | None:
    """The value of ``knob`` the incumbent already has (None: none of them)."""
    for value in knob.values:
        if value.extra_args:
            continue
        if not value.fields and knob.name.startswith("--"):
            if knob.name not in " ".join(profile.extra_args):
                return value
            continue
        if value.fields and all(profile.get(k) == v for k, v in value.fields.items()):
            return value
    return None


def one_knob(spec: TuneSpec, knobs: tuple[Knob, ...], incumbent, config_key: str
             ) -> list[Candidate]:
    """Every value of every knob that differs from the incumbent, alone."""
    out = []
    for knob in knobs:
        current = incumbent_value(knob, incumbent)
        for value in knob.values:
            if value is current:
                continue
            choice = {knob.name: value}
            out.append(Candidate(candidate_name(spec, choice, config_key), "one knob", choice))
    return out


def combinations(spec: TuneSpec, winners: list[tuple[str, list[KnobValue]]],
                 config_key: str, seen: set[str]) -> list[Candidate]:
    """Every combination of two or more of the knobs' best values (``winners``: per
    knob that beat the incumbent, its best value and those within the noise of it,
    best first; the knobs best gain first, at most ``spec.combine`` of them); the
    combination of each knob's best value first."""
    top = winners[:spec.combine]
    out = []
    for size in range(len(top), 1, -1):
        for combo in itertools.combinations(top, size):
            for values in itertools.product(*(vals for _, vals in combo)):
                choice = {name: value for (name, _), value in zip(combo, values,
                                                                   strict=True)}
                name = candidate_name(spec, choice, config_key)
                if name not in seen and name not in {c.name for c in out}:
                    out.append(Candidate(name, "combination", choice))
    return out


def bench_section(spec: TuneSpec, levels: tuple[int, ...], repeat: int = 1
                  ) -> dict[str, Any]:
    """The profile's ``bench`` section for ``levels``: SGLang's client ``repeat`` times
    per level, inside one server (``single`` is concurrency 1; ``single-r2`` its second
    run)."""
    scenarios = {}
    for c in levels:
        name = "single" if c == 1 else f"c{c}"
        for run in range(1, max(repeat, 1) + 1):
            scenarios[name if run == 1 else f"{name}-r{run}"] = {
                "concurrency": c, "prompts": max(2, spec.prompts_per_level * c),
                "input_len": spec.input_len, "output_len": spec.output_len, "warmup": 1}
    # a parent's sweep or expectations would name other scenarios: dropped (null)
    return {"scenarios": scenarios, "sweep": None, "expect": None}


def scenario_level(name: str | None) -> int | None:
    """The load level of a scenario name (``single``, ``c8``, ``c8-r2``)."""
    base, _, run = (name or "").partition("-r")
    if run and not run.isdigit():
        return None
    if base == "single":
        return 1
    if base.startswith("c") and base[1:].isdigit():
        return int(base[1:])
    return None


def profile_text(spec: TuneSpec, candidate: Candidate, directory: Path,
                 levels: tuple[int, ...] | None, header: str = "", repeat: int = 1) -> str:
    """The candidate's profile file (to be written into ``directory``): extends the
    incumbent by a relative path, sets the chosen fields and extra args, and (with
    ``levels``) the bench scenarios of those load levels."""
    import os

    fields: dict[str, Any] = {}
    extra: list[str] = []
    for value in candidate.choice.values():
        fields.update(value.fields)
        extra.extend(value.extra_args)
    doc: dict[str, Any] = {"extends": os.path.relpath(spec.incumbent, directory.resolve()),
                           "description": f"tune {spec.name}: {candidate.label}"}
    doc.update(nested(fields))
    if extra:
        from gpuserve.launch.profiles import load_profile

        doc["extra_args"] = [*load_profile(spec.incumbent).extra_args, *extra]
    if levels:
        doc["bench"] = bench_section(spec, levels, repeat)
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return header + body
