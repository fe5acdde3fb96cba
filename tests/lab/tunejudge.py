"""What a lab tune must have decided, given what it measured: the tune's own noise
estimate, the records' figures and the "best" line it printed (tests/lab/test_tune.py,
test_quality.py). The stand-in decodes at the surface's rate on this machine's CPUs, so
a loaded machine adds its own noise: the lab asserts decisions, never fixed winners.
Also the records of a lab tune (:func:`outcomes`) and the surfaces' truth
(:func:`surface_truth`), for tests/lab/test_tune.py and test_tune_surfaces.py."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: the statuses of a record with a figure
MEASURED = ("measured", "stopped")

# A difference "far beyond" the measured noise: four standard errors of the difference
# of two means (the tuner's own test is one-sided 95 %, Student's t about 1.7-2.1), so
# that neither a lucky nor an unlucky draw of the noise decides what is asserted.
WIDE = 4.0
NOISE_LINE = re.compile(r"run-to-run noise: ([\d.]+) % per benchmark run \((\d+) degrees")


def measured_noise(out: str) -> float:
    """The tune's own estimate of one benchmark run's relative standard deviation."""
    found = NOISE_LINE.search(out)
    assert found, out[-3000:]
    return float(found[1]) / 100


def figure(doc: dict, objective: str) -> tuple[float, str]:
    """(the measured tok/s an objective ranks by, its load level) of a tune record."""
    levels = {k: v["output_throughput"] for k, v in doc["levels"].items()}
    level = "1" if objective == "single_stream" else max(levels, key=levels.get)
    return float(levels[level]), level


def runs(doc: dict, objective: str) -> int:
    """How many benchmark runs the record's figure is the mean of."""
    return max(1, len((doc["numbers"].get("runs") or {}).get(figure(doc, objective)[1])
                      or []))


def spread(noise: float, objective: str, *docs: dict) -> float:
    """:data:`WIDE` standard errors of the relative difference of ``docs``' means."""
    return WIDE * noise * sum(1 / runs(d, objective) for d in docs) ** 0.5


def reported_pick(out: str, objective: str, docs: list[dict]) -> tuple[dict, str]:
    """(the record the tune named as best ``objective``, what it said of the gain)."""
    found = re.search(rf"^best {objective}: [\d.,]+ tok/s: .*? \(([^()\s]+)\)"
                      r"(?:; (.*))?$", out, re.M)
    assert found, out[-3000:]
    return next(d for d in docs if d["candidate"] == found[1]), found[2] or ""


def judge_reported(out: str, docs: list[dict], objective: str) -> dict:
    """Assert the tune's "best ``objective``" line is the decision it must take given
    what it measured (``docs``, its records): the measured top, with its gain, or the
    incumbent, kept with "no significant gain" only where the top's gain lies within
    what the measured noise cannot resolve. Returns the picked record."""
    noise = measured_noise(out)
    measured = [d for d in docs if d["status"] in MEASURED]
    incumbent = next(d for d in measured if d["phase"] == "incumbent")
    top = max(measured, key=lambda d: figure(d, objective)[0])
    pick, gain = reported_pick(out, objective, docs)
    top_gain = figure(top, objective)[0] / figure(incumbent, objective)[0] - 1
    if gain.startswith("no significant gain"):
        assert pick is incumbent, (pick["choice"], gain)
        assert top_gain <= spread(noise, objective, top, incumbent), (
            f"{top['choice']} measured {100 * top_gain:+.1f} % over the incumbent, far "
            f"beyond the measured noise {100 * noise:.2f} %: {gain}")
    elif pick is not top:  # a tie on the mean: the same figure
        assert figure(pick, objective)[0] == figure(top, objective)[0], (
            pick["choice"], top["choice"])
    return pick


def outcomes(results: Path, name: str = "lab") -> dict[str, dict]:
    """label -> the tune's record of that candidate."""
    docs = [json.loads(p.read_text())
            for p in (results / f"lab-gpu/tune-{name}").glob("*.json")]
    out = {}
    for doc in docs:
        label = " ".join(f"{k}={v}" for k, v in doc["choice"].items()) or "incumbent"
        out[label] = doc
    return out


# launches within this of the surface's optimum count as it (the stand-in's timings are
# real: its HTTP and tokenizing work blur differences of a percent or two)
TOLERANCE = 0.02


def judge_pick(out: str, docs: list[dict], objective: str, truth, *,
               reported: bool = True) -> dict:
    """Assert the pick for ``objective`` is the decision the tune must take given what it
    measured, and what that decision is worth on the surface; returns the picked record.

    With ``reported``, the tune's own "best" line: the measured top, with its gain, or
    the incumbent with "no significant gain", never where the measured gain lies far
    beyond the measured noise. Without, the measured top (an objective the tune does not
    name). Either way ``truth(doc)`` (the surface's noise-free figure and its optimum)
    must put the pick within the tolerance of the optimum, or within what the measured
    noise cannot resolve."""
    noise = measured_noise(out)
    if reported:
        pick = judge_reported(out, docs, objective)
    else:
        pick = max((d for d in docs if d["status"] in MEASURED),
                   key=lambda d: figure(d, objective)[0])
    value, optimum = truth(pick)
    # the surface's optimum, measured as often as the pick at the most
    blur = spread(noise, objective, pick, pick)
    assert value >= optimum * (1 - max(TOLERANCE, blur)), (
        f"{objective}: picked {pick['choice']} at {value:.1f} tok/s on the surface, its "
        f"optimum {optimum:.1f}; measured noise {100 * noise:.2f} % per run, "
        f"{runs(pick, objective)} runs")
    return pick


def surface_truth(surface: str, tune_file: Path, objective: str):
    """``truth(doc) -> (the surface's noise-free figure of the record's launch, the
    surface's optimum over the tune file's whole space)`` for ``objective``
    (lab/surface.py, bench/tune_surface.py: the same evaluation the stand-in serves)."""
    import tempfile

    from gpuserve.tune.session import prepare
    from gpuserve.tune.space import candidate_profile, load_tune
    from lab import surface as surfaces

    bench = tune_surface_bench()
    spec, raw = load_tune(tune_file)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = prepare(spec, raw, bench.snapshot(Path(tmp)), comm=bench.Comm(),
                           log=lambda _: None, stamp=lambda: "")
    loaded = surfaces.load(REPO / "lab/surfaces" / f"{surface}.yaml")
    by_knob = {k.name: {v.label: v for v in k.values} for k in prepared.knobs}
    opt = surfaces.true_optimum(loaded, bench.every_launch(spec, prepared.knobs), objective,
                                concurrencies=spec.loads, input_len=spec.input_len,
                                output_len=spec.output_len, metric="output")

    def truth(doc: dict) -> tuple[float, float]:
        choice = {k: by_knob[k][label] for k, label in doc["choice"].items()}
        launch = bench.launch_of(candidate_profile(spec, choice, "check"))
        value = next((v for v, _, each, _ in opt.ranking if each == launch), None)
        assert value is not None, (f"{doc['choice']} was measured but fails on the "
                                   f"surface {surface}")
        return value, opt.value

    return truth


def tune_surface_bench():
    """bench/tune_surface.py, loaded by its path (the surface's optimum over a tune file)."""
    spec = importlib.util.spec_from_file_location("tune_surface",
                                                  REPO / "bench/tune_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
