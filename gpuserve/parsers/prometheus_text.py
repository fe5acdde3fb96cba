"""Prometheus's text exposition format (version 0.0.4), as SGLang's, smg's and the
exporters' ``/metrics`` serve it: ``name{label="value",...} value [timestamp]`` lines,
``#`` comments (HELP, TYPE and others) ignored.

Why our own: a host's answer is input (bounded, validated), and the figures the fleet
status and the rolling switch read need samples only, not the client library.
How: docs/metrics.md, "Reading a host's /metrics".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpuserve.parsers.common import ParseError, as_lines

#: most samples one answer may hold (a 8-GPU host with every DCGM field has a few
#: thousand; SGLang per rank some hundreds)
MAX_SAMPLES = 200_000
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SPECIAL = {"+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf, "NaN": math.nan}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted by label name
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


def _unescape(text: str) -> str:
    return re.sub(r"\\.", lambda m: _ESCAPES.get(m.group(0), m.group(0)), text)


def _labels(line: str, start: int, line_no: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """The labels from ``{`` at ``start``; returns them and the index after ``}``."""
    pos, out = start + 1, {}
    if line[pos:pos + 1] == "}":
        return (), pos + 1
    while True:
        match = _LABEL.match(line, pos)
        if match is None:
            raise ParseError("malformed labels", line_no, line[:200])
        out[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
        if match.group(3) == "}":
            return tuple(sorted(out.items())), pos
        if line[pos:pos + 1] == "}":  # a trailing comma is allowed
            return tuple(sorted(out.items())), pos + 1


def _value(text: str, line_no: int, line: str) -> float:
    if text in _SPECIAL:
        return _SPECIAL[text]
    try:
        return float(text)
    except ValueError:
        raise ParseError("not a number", line_no, line[:200]) from None


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of one answer, in order; ``ParseError`` names the first bad line."""
    samples: list[Sample] = []
    for line_no, raw in enumerate(as_lines(text), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = _NAME.match(line)
        if name is None:
            raise ParseError("not a sample line", line_no, line[:200])
        pos = name.end()
        labels: tuple[tuple[str, str], ...] = ()
        if line[pos:pos + 1] == "{":
            labels, pos = _labels(line, pos, line_no)
        rest = line[pos:].split()
        if not rest or len(rest) > 2:
            raise ParseError("expected a value (and a timestamp)", line_no, line[:200])
        samples.append(Sample(name.group(0), labels, _value(rest[0], line_no, line)))
        if len(samples) > MAX_SAMPLES:
            raise ParseError(f"more than {MAX_SAMPLES} samples")
    return samples
