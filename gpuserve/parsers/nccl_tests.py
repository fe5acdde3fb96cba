"""nccl-tests (``all_reduce_perf`` and friends) text output -> rows and summary.

Why a parser of the text report: the GPU gates judge all-reduce, all-gather and
all-to-all from nccl-tests' own output, whatever its build, options, ``mpirun
--tag-output`` prefixes or interleaved NCCL_DEBUG lines.

How: docs/gpu-gates.md, "gpuserve.parsers.nccl_tests: the output layout"
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from gpuserve.parsers.common import ParseError, as_lines

_MPI_PREFIX_RE = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:\s?")
_NCCL_LOG_RE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ERROR|VERSION)\b")
_RANK_RE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[([^\]]*)\]\s+(.*?)\s*$"
)
_PARAMS_RE = re.compile(r"^#\s*nThread\s")
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?\s*$")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?\s*$")
_STARTING_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_CONCLUDED_RE = re.compile(r"^#\s*Collective test concluded:\s*(\S+)")
_VERSION_RE = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_ERROR_RE = re.compile(r"^#\s*error:\s*(.*)$")

# Columns of the current layout, used when the output has no column header (a tail).
DEFAULT_COLUMNS = (
    ("size", "count", "type", "redop", "root")
    + ("time", "algbw", "busbw", "#wrong")  # out-of-place
    + ("time", "algbw", "busbw", "#wrong")  # in-place
)
_TIME_NAMES = ("time", "cputime")
_NUMERIC_FIELDS = ("time", "algbw", "busbw", "i_min", "i_max", "i_p99", "i_cv%")


@dataclass
class Timing:
    """One half of a row (out-of-place or in-place); times in us, bandwidths in GB/s."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None = None  # "#wrong" elements; None for "N/A" (validation off)
    error: float | None = None  # very old builds' max error column
    extra: dict[str, float] = field(default_factory=dict)  # i_min, i_max, i_p99, i_cv%


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str | None
    root: int | None
    out_of_place: Timing | None
    in_place: Timing | None
    timestamp: str | None = None


@dataclass
class Rank:
    rank: int
    group: int
    pid: int
    host: str
    device: int
    pci: str
    name: str


@dataclass
class NcclTestsResult:
    collective: str | None = None
    version: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    ranks: list[Rank] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    bw_check: str | None = None  # "OK" / "FAILED" when NCCL_TESTS_MIN_BW was set
    concluded: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def wrong_total(self) -> int:
        """Sum of #wrong over all rows (N/A counts as 0)."""
        return sum(
            t.wrong or 0 for r in self.rows for t in (r.out_of_place, r.in_place) if t is not None
        )

    @property
    def ok(self) -> bool:
        """No wrong values, no out-of-bounds values and no failed bandwidth check."""
        return (
            bool(self.rows)
            and self.wrong_total == 0
            and not self.out_of_bounds
            and self.bw_check != "FAILED"
        )

    def to_json(self) -> dict:
        return asdict(self)


def _params(line: str) -> dict[str, str]:
    """``# nThread 1 nGpus 8 ... step: 2(factor) warmup iters: 5 ...`` -> dict.

    Keys are runs of words (``warmup iters``), values the tokens that start with a digit.
    """
    params: dict[str, str] = {}
    key: list[str] = []
    for token in line.lstrip("#").split():
        if token[0].isdigit() or token[0] == "-":
            if key:
                params[" ".join(key).rstrip(":")] = token
            key = []
        else:
            key.append(token)
    return params


def _number(token: str, line_no: int, line: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"not a number: {token!r}", line_no, line) from None


def _wrong(token: str, line_no: int, line: str) -> int | None:
    if token == "N/A":
        return None
    value = _number(token, line_no, line)
    if value != int(value) or value < 0:
        raise ParseError(f"#wrong is not a count: {token!r}", line_no, line)
    return int(value)


def _timing(names: list[str], tokens: list[str], line_no: int, line: str) -> Timing:
    values = dict(zip(names, tokens, strict=True))
    time_key = next(n for n in names if n in _TIME_NAMES)
    timing = Timing(
        time_us=_number(values[time_key], line_no, line),
        algbw=_number(values["algbw"], line_no, line),
        busbw=_number(values["busbw"], line_no, line),
    )
    if "#wrong" in values:
        timing.wrong = _wrong(values["#wrong"], line_no, line)
    if "error" in values:
        timing.error = None if values["error"] == "N/A" else _number(values["error"], line_no, line)
    for name in names:
        if name in _NUMERIC_FIELDS and name not in ("time", "algbw", "busbw"):
            timing.extra[name] = _number(values[name], line_no, line)
    return timing


def _parse_row(columns: list[str], tokens: list[str], line_no: int, line: str) -> Row:
    timestamp_cols = 1 if columns and columns[-1] == "timestamp" else 0
    cols = columns[: len(columns) - timestamp_cols]
    timestamp = None
    if timestamp_cols:
        # The timestamp may contain spaces; it is everything after the known columns.
        if len(tokens) <= len(cols):
            raise ParseError(f"expected {len(cols)} fields and a timestamp", line_no, line)
        timestamp = " ".join(tokens[len(cols) :])
        tokens = tokens[: len(cols)]
    if len(tokens) != len(cols):
        raise ParseError(f"expected {len(cols)} fields, got {len(tokens)}", line_no, line)
    time_idx = [i for i, name in enumerate(cols) if name in _TIME_NAMES]
    if not time_idx:
        raise ParseError("column header has no time column", line_no, line)
    pre = dict(zip(cols[: time_idx[0]], tokens[: time_idx[0]], strict=True))
    for key in ("size", "count", "type"):
        if key not in pre:
            raise ParseError(f"column header has no {key!r} column", line_no, line)
    if not pre["size"].isdigit() or not pre["count"].isdigit():
        raise ParseError("size and count must be integers", line_no, line)
    root = pre.get("root")
    if root is not None and not re.fullmatch(r"-?\d+", root):
        raise ParseError(f"root is not an integer: {root!r}", line_no, line)
    halves: list[Timing | None] = []
    bounds = [*time_idx, len(cols)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        halves.append(_timing(cols[start:end], tokens[start:end], line_no, line))
    while len(halves) < 2:
        halves.append(None)
    return Row(
        size=int(pre["size"]),
        count=int(pre["count"]),
        type=pre["type"],
        redop=pre.get("redop"),
        root=int(root) if root is not None else None,
        out_of_place=halves[0],
        in_place=halves[1],
        timestamp=timestamp,
    )


def _is_column_header(body: str) -> bool:
    tokens = body.split()
    return len(tokens) >= 3 and tokens[:2] == ["size", "count"]


def parse_nccl_tests(text: str | Iterable[str]) -> NcclTestsResult:
    """Parse the stdout of an nccl-tests binary (e.g. ``all_reduce_perf -b 8 -e 128M``)."""
    result = NcclTestsResult()
    columns: list[str] | None = None
    recognised = False
    for line_no, raw in enumerate(as_lines(text), start=1):
        line = _MPI_PREFIX_RE.sub("", raw).rstrip()
        stripped = line.strip()
        if not stripped or _NCCL_LOG_RE.search(line):
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if _is_column_header(body):
                columns = body.split()
                result.columns = columns
                recognised = True
            elif m := _RANK_RE.match(stripped):
                result.ranks.append(
                    Rank(int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5]), m[6], m[7])
                )
                recognised = True
            elif _PARAMS_RE.match(stripped):
                result.params = _params(stripped)
                recognised = True
            elif m := _OOB_RE.match(stripped):
                result.out_of_bounds = int(m[1])
                recognised = True
            elif m := _AVG_RE.match(stripped):
                result.avg_busbw = _number(m[1], line_no, raw)
                result.bw_check = m[2]
                recognised = True
            elif m := _STARTING_RE.match(stripped):
                result.collective = m[1]
            elif m := _CONCLUDED_RE.match(stripped):
                result.collective = result.collective or m[1]
                result.concluded = True
            elif m := _VERSION_RE.match(stripped):
                result.version = m[1]
            elif m := _ERROR_RE.match(stripped):
                result.errors.append(m[1])
            continue
        tokens = stripped.split()
        if not tokens[0].isdigit():
            continue  # launcher or library chatter between rows
        result.rows.append(_parse_row(columns or list(DEFAULT_COLUMNS), tokens, line_no, raw))
        recognised = True
    if not recognised:
        raise ParseError("no nccl-tests header, result row or footer found")
    if not result.columns:
        result.columns = list(DEFAULT_COLUMNS)
    return result
