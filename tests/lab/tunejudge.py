"""What a lab tune must have decided, given what it measured: the tune's own noise
estimate, the records' figures and the "best" line it printed (tests/lab/test_tune.py,
test_quality.py). The stand-in decodes at the surface's rate on this machine's CPUs, so
a loaded machine adds its own noise: the lab asserts decisions, never fixed winners."""

from __future__ import annotations

import re

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
