"""Result records: what a run measured, with enough context to compare runs later.

Why: throughput figures that live only in a terminal are lost (the field notes' 82 ->
89.5 tok/s and EAGLE-3's 54.1 tok/s were never written down). Every smoke completion of
the serve deploy and every SGLang benchmark run becomes one record file
(``gpuserve.result/2``, secrets removed by the writer) that ``gpuserve compare`` puts
side by side; readers also take /1 files and SGLang's ``--output-file`` lines. Bad input
raises ``InputError`` naming the file, the line and the key.

How: docs/benchmarks.md, "gpuserve.measure.results: record format and readers"
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from gpuserve import __version__, safeload
from gpuserve.errors import InputError
from gpuserve.launch.secrets import is_secret_env_name, split_secret_args
from gpuserve.measure.record_files import safe_name, write_new_file
from gpuserve.measure.smoke import SmokeResult
from gpuserve.redact import redact

SCHEMA = "gpuserve.result/2"
SCHEMAS = ("gpuserve.result/1", SCHEMA)
_OUR_SCHEMA_PREFIX = "gpuserve.result/"
KINDS = ("smoke", "bench")
SMOKE_FIGURES = ("tokens", "seconds", "tok_s")
# SGLang benchmark client keys kept in a bench record (sglang/benchmark/serving.py result
# dict). num_prompts is written only by some variants; accept_length only with
# speculative decoding. The mean/p99 latencies let compare show tails and noise.
BENCH_FIGURES = (
    "output_throughput", "input_throughput", "total_throughput", "request_throughput",
    "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_tpot_ms",
    "max_concurrency", "random_input_len", "random_output_len",
    "num_prompts", "completed", "duration", "accept_length",
    "mean_ttft_ms", "mean_itl_ms", "mean_tpot_ms", "p99_itl_ms", "p99_tpot_ms",
    "median_e2e_latency_ms", "p99_e2e_latency_ms",
)
FIGURES = {"smoke": SMOKE_FIGURES, "bench": BENCH_FIGURES}
MAIN_FIGURE = {"smoke": "tok_s", "bench": "output_throughput"}
TEXT_FIELDS = ("host", "profile", "launch_hash", "sglang_version", "model", "served_name",
               "timestamp", "note")
V2_TEXT_FIELDS = ("scenario", "profile_hash", "lock", "server_start")
#: text fields written only when set (older records and most kinds have none)
OPTIONAL_TEXT_FIELDS = ("note", "server_start")
V2_FIELDS = (*V2_TEXT_FIELDS, "context", "gate", "sglang")
CONTEXT_KEYS = ("argv", "env", "gpus", "driver", "cuda", "nccl_env", "p2p",
                "gpuserve_version")
GATE_KEYS = ("passed", "misses", "checked")

# Env names that are secrets (gpuserve.launch.secrets.is_secret_env_name: HF_TOKEN, not
# SGLANG_MAX_TOKENS_PER_BATCH): left out of the launch hash and of records, and their
# values, of any length, scrubbed from every other string.
# Secret *flags* are judged by gpuserve.launch.secrets: resolved like SGLang's parser
# (--api-k is --api-key), so --max-total-tokens and --tokenizer-path stay in the hash.


@dataclass(frozen=True)
class ResultRecord:
    kind: str
    profile: str | None
    figures: dict = field(default_factory=dict)
    host: str | None = None
    launch_hash: str | None = None
    sglang_version: str | None = None
    model: str | None = None
    served_name: str | None = None
    timestamp: str | None = None
    note: str | None = None
    source: str | None = None  # "file:line" it was read from; not stored
    scenario: str | None = None
    profile_hash: str | None = None
    lock: str | None = None
    context: dict | None = None
    gate: dict | None = None
    sglang: dict | None = None
    server_start: str | None = None  # a smoke's unit start (InvocationID): which server

    def to_dict(self) -> dict:
        """The stored document: strict JSON types only, secrets removed (again)."""
        doc: dict = {"schema": SCHEMA, "kind": self.kind}
        for key in (*TEXT_FIELDS, *V2_TEXT_FIELDS):
            value = getattr(self, key)
            if value is not None or key not in OPTIONAL_TEXT_FIELDS:
                doc[key] = value
        doc["context"] = None if self.context is None else clean_context(self.context)
        doc["gate"] = self.gate
        doc["figures"] = {k: self.figures.get(k) for k in FIGURES[self.kind]}
        doc["sglang"] = None if self.sglang is None else clean_sglang_line(self.sglang)
        return _redact(_strict(doc), _secret_values(self.context))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    # Figures compare reads, whatever the kind.
    @property
    def output_tok_s(self) -> float | None:
        return self.figures.get(MAIN_FIGURE[self.kind])

    @property
    def concurrency(self) -> int | None:
        """Requests in flight: 1 for a smoke completion, ``--max-concurrency`` for a bench."""
        return 1 if self.kind == "smoke" else self.figures.get("max_concurrency")

    @property
    def workload(self) -> tuple:
        """What must match for two records to be compared: kind, concurrency, lengths."""
        return (self.kind, self.concurrency, self.figures.get("random_input_len"),
                self.figures.get("random_output_len"))

    @property
    def is_good(self) -> bool:
        """False only when the deploy's throughput gate ran and failed."""
        return not (self.gate is not None and self.gate.get("passed") is False)


@dataclass(frozen=True)
class RecordSpec:
    """What the serve deploy knows at prepare time about the runs it will record."""

    results_dir: str
    profile: str
    launch_hash: str
    sglang_version: str
    model: str
    served_name: str
    profile_hash: str | None = None
    lock: str | None = None
    context: dict | None = None


# ----------------------------------------------------------------------------- secrets


def _split_secret_args(args: Iterable[str]) -> tuple[list[str], list[str]]:
    """(argv without secret flags and their values, the secret values dropped).

    No catalog is at hand here (a record may come from any SGLang version), so the
    conservative judgement of gpuserve.launch.secrets applies: whatever a committed
    catalog resolves to a secret option (``--api-k``), names a secret, or abbreviates
    a known secret option; never a valid non-secret option of a committed catalog."""
    return split_secret_args(args)


def strip_secret_args(args: Iterable[str]) -> list[str]:
    """argv without secret flags (``--flag value``, ``--flag=value``, and the argparse
    abbreviations of SGLang's secret options, e.g. ``--api-k``) and their values."""
    return _split_secret_args(args)[0]


def strip_secret_env(env: Mapping[str, object]) -> dict:
    """``env`` without entries whose name is a secret's (``*_TOKEN``, ``*_API_KEY``, ...;
    gpuserve.launch.secrets.is_secret_env_name)."""
    return {k: v for k, v in env.items() if not is_secret_env_name(k)}


def _secret_values(context: Mapping | None) -> set[str]:
    """The secret values a raw context carries, to scrub them from anywhere else."""
    if not isinstance(context, Mapping):
        return set()
    values: set[str] = set()
    argv = context.get("argv")
    if isinstance(argv, list):
        values.update(_split_secret_args(str(a) for a in argv)[1])
    for key in ("env", "nccl_env"):
        env = context.get(key)
        if isinstance(env, Mapping):
            values.update(str(v) for k, v in env.items() if is_secret_env_name(k))
    # any length: a short secret is still a secret (host data refuses short ones, but a
    # record may come from elsewhere); only the empty string is no value to look for
    return {v for v in values if v}


def _redact(value, secrets: set[str]):
    """``value`` with every occurrence of a secret inside any string replaced
    (gpuserve.redact's rule: a secret that contains another is replaced whole)."""
    if not secrets:
        return value
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {_redact(k, secrets): _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, secrets) for v in value]
    return value


def clean_context(context: Mapping) -> dict:
    """``context`` as stored: known keys only (a typo'd key is a bug, not data), secret
    flags and env entries removed."""
    unknown = set(context) - set(CONTEXT_KEYS)
    if unknown:
        raise InputError(None, f"context.{sorted(unknown)[0]}", "unknown key (known: "
                         f"{', '.join(CONTEXT_KEYS)})")
    doc = dict(context)
    if doc.get("argv") is not None:
        doc["argv"] = strip_secret_args(str(a) for a in doc["argv"])
    for key in ("env", "nccl_env"):
        if doc.get(key) is not None:
            doc[key] = strip_secret_env(doc[key])
    return doc


def clean_sglang_line(line: Mapping) -> dict:
    """SGLang's line as stored: without ``server_info`` (resolved ServerArgs, API key)."""
    return {k: v for k, v in line.items() if k != "server_info"}


def _strict(value):
    """``value`` with non-finite floats as the strings "inf", "-inf", "nan" (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


# ----------------------------------------------------------------------------- hashes


def launch_hash(args: Iterable[str], env: Mapping[str, str]) -> str:
    """``sha256:<hex>`` of the rendered launch: argv and env, secrets left out.

    Env entries whose name is a secret's (``*_TOKEN``, ``*_API_KEY``, ``*_SECRET*``, ...)
    and secret-looking flags with their value are dropped before hashing, so the hash
    never depends on (and cannot be used to guess) a secret. Env order does not matter;
    argv order does (it does for SGLang too).
    """
    blob = json.dumps({"args": strip_secret_args(args),
                       "env": dict(sorted(strip_secret_env(env).items()))},
                      separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def profile_hash(paths: Iterable[str | Path]) -> str:
    """``sha256:<hex>`` of the profile file(s), in the order given: each file's name and
    bytes. Why: two runs of "the same" profile name are only comparable if the file did
    not change in between; compare shows when it did."""
    digest = hashlib.sha256()
    for path in paths:
        p = Path(path)
        data = safeload.read_bytes(p)  # a profile: a regular file of CONFIG's size
        digest.update(p.name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return "sha256:" + digest.hexdigest()


# ----------------------------------------------------------------------------- records


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def smoke_record(spec: RecordSpec, host: str, result: SmokeResult,
                 timestamp: str | None = None) -> ResultRecord:
    return ResultRecord(
        kind="smoke", profile=spec.profile, host=host, launch_hash=spec.launch_hash,
        sglang_version=spec.sglang_version, model=spec.model, served_name=spec.served_name,
        timestamp=timestamp or utc_now(),
        figures={"tokens": result.completion_tokens, "seconds": round(result.elapsed_s, 4),
                 "tok_s": round(result.tokens_per_s, 3)},
        profile_hash=spec.profile_hash, lock=spec.lock, context=spec.context,
        server_start=result.server_start,
    )


#: Records and SGLang lines: bounded size and depth (gpuserve/safeload.py); ``NaN`` and
#: ``Infinity`` parse, as SGLang's json writes them, and the figure checks decide.
READ_LIMITS = safeload.DATA.but(finite=False, json_constants=True)


def parse_sglang_line(text: str, source: str) -> dict:
    """One line of SGLang's ``--output-file`` (``Infinity``/``NaN`` accepted, as Python's
    json writes them); InputError naming ``source`` when it is not one JSON object."""
    try:
        doc = safeload.loads_json(text, source, READ_LIMITS)
    except InputError as e:
        why = e.message.removeprefix("invalid JSON: ")  # ``source`` already says where
        raise InputError(source, None, f"not an SGLang benchmark JSON line: {why}") from e
    if not isinstance(doc, dict):
        raise InputError(source, None, "not an SGLang benchmark JSON line: expected an "
                         f"object, got {type(doc).__name__}")
    return doc


def bench_figures(line: Mapping, file, where: int | None = None) -> dict:
    """:data:`BENCH_FIGURES` from an SGLang line: ``output_throughput`` must be a finite
    number; the others a number or null (non-finite ones become null)."""
    figures = {}
    for key in BENCH_FIGURES:
        value = line.get(key)
        if isinstance(value, float) and not math.isfinite(value) and key != "output_throughput":
            value = None
        figures[key] = _number(value, file, where, key, required=key == "output_throughput")
    return figures


def validate_gate(gate: object, file, line: int | None = None) -> dict | None:
    """``{"passed": bool, "misses": [str], "checked": [str]}`` or None."""
    if gate is None:
        return None
    if not isinstance(gate, dict):
        raise InputError(file, "gate", "must be an object or null", line=line)
    unknown = set(gate) - set(GATE_KEYS)
    if unknown:
        raise InputError(file, f"gate.{sorted(unknown)[0]}", "unknown key", line=line)
    if not isinstance(gate.get("passed"), bool):
        raise InputError(file, "gate.passed", "must be true or false", line=line)
    for key in ("misses", "checked"):
        value = gate.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(file, f"gate.{key}", "must be a list of strings", line=line)
    return {"passed": gate["passed"], "misses": list(gate.get("misses", [])),
            "checked": list(gate.get("checked", []))}


def bench_record(spec: RecordSpec, host: str, scenario: str, line: dict,
                 gate: dict | None = None, timestamp: str | None = None) -> ResultRecord:
    """The record of one scenario's SGLang benchmark run (``line``: its parsed JSON line,
    see :func:`parse_sglang_line`); ``gate``: the deploy's throughput gate verdict."""
    where = f"{host}: bench {spec.profile}/{scenario}"
    if not isinstance(line, dict):
        raise InputError(where, None, f"expected an SGLang JSON object, got "
                         f"{type(line).__name__}")
    return ResultRecord(
        kind="bench", profile=spec.profile, host=host, scenario=scenario,
        launch_hash=spec.launch_hash, sglang_version=spec.sglang_version, model=spec.model,
        served_name=spec.served_name, timestamp=timestamp or utc_now(),
        figures=bench_figures(line, where), profile_hash=spec.profile_hash, lock=spec.lock,
        context=spec.context, gate=validate_gate(gate, where),
        sglang=clean_sglang_line(line),
    )


def last_good(records: list[ResultRecord], host: str, profile: str,
              scenario: str) -> ResultRecord | None:
    """The latest bench record of ``host``/``profile``/``scenario`` whose gate did not fail
    (latest by timestamp; among equal ones, the later in ``records``)."""
    pool = [(r.timestamp or "", i, r) for i, r in enumerate(records)
            if r.kind == "bench" and r.host == host and r.profile == profile
            and r.scenario == scenario and r.is_good]
    return max(pool, key=lambda t: t[:2])[2] if pool else None


def record_path(results_dir: str | Path, record: ResultRecord) -> Path:
    stamp = (record.timestamp or utc_now()).replace("-", "").replace(":", "")
    name = f"{stamp}-{record.kind}-{safe_name(record.profile or 'unknown')}"
    if record.kind == "bench" and record.scenario:
        name += f"-{safe_name(record.scenario)}"
    return Path(results_dir) / safe_name(record.host or "unknown-host") / f"{name}.json"


def write_record(results_dir: str | Path, record: ResultRecord) -> Path:
    """Write ``record`` as its own file under ``results_dir/<host>/``; return the path.

    Never overwrites: a second record in the same second gets a ``-2`` suffix. The file
    is written next to its final name and renamed, so a reader never sees half a record.
    """
    text = record.to_json() + "\n"  # before touching the disk: a bad record writes nothing
    return write_new_file(record_path(results_dir, record), text)


# ----------------------------------------------------------------------------- readers


def newest_smoke(results_dir: str | Path, host: str) -> ResultRecord | None:
    """The newest smoke record of ``host`` under ``results_dir`` (file names start with
    their UTC timestamp), or None when there is none or it does not read: the serve
    deploy then makes the smoke again rather than trust it."""
    folder = Path(results_dir) / safe_name(host)
    try:
        names = sorted(p.name for p in folder.glob("*-smoke-*.json")
                       if not p.name.startswith("."))
    except OSError:
        return None
    if not names:
        return None
    path = folder / names[-1]
    try:
        records = read_results(path)
    except (InputError, OSError):
        return None
    if len(records) != 1 or records[0].kind != "smoke":
        return None
    return replace(records[0], source=str(path))  # the file, not file:line


def read_results(path: str | Path, skipped: list[str] | None = None,
                 measures: list[dict] | None = None) -> list[ResultRecord]:
    """Records from a file (ours or SGLang bench JSONL) or a directory (recursively:
    ``*.json`` and ``*.jsonl``, in path order; hidden files and other suffixes ignored).

    Why the skipping: a results directory also collects other things (the host's fetched
    ``host.json``, plots). Documents whose ``schema`` names another kind
    (``gpuserve.host/1``) are skipped wherever they are; in a directory, a file with no
    result document at all (no ``gpuserve.result/*`` schema, no ``output_throughput``) is
    skipped too. Each skip is appended to ``skipped`` ("file: why") when given. A file
    that holds results and a bad line, or is not JSON, is still an error. With
    ``measures``, ``gpuserve.measure/1`` records are checked and appended there (each
    with its file as ``_source``) instead of being skipped.
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl")
                       and not f.name.startswith("."))
        return [r for f in files for r in read_file(f, skipped, in_directory=True,
                                                     measures=measures)]
    if not p.exists():
        raise InputError(p, None, "no such file or directory")
    return read_file(p, skipped, measures=measures)


def read_file(path: str | Path, skipped: list[str] | None = None, *,
              in_directory: bool = False,
              measures: list[dict] | None = None) -> list[ResultRecord]:
    p = Path(path)
    text = safeload.read_text(p, READ_LIMITS.max_bytes)
    docs = _json_documents(text, p)
    if measures is not None:
        docs = [(line, doc) for line, doc in docs
                if not _take_measure(doc, p, measures, skipped)]
        if not docs:
            return []
    if in_directory and docs and not any(_is_result(doc) for _, doc in docs):
        other = _foreign_schema(docs[0][1])
        _note_skip(skipped, f"{p}: schema {other!r} is not a result record" if other
                   else f"{p}: no result record in it")
        return []
    records = []
    for line, doc in docs:
        other = _foreign_schema(doc)
        if other:
            _note_skip(skipped, f"{p}:{line}: schema {other!r} is not a result record")
            continue
        records.append(parse_document(doc, p, line))
    return records


def _take_measure(doc: object, path: Path, measures: list[dict],
                  skipped: list[str] | None) -> bool:
    """A ``gpuserve.measure/1`` record goes to ``measures``, one that fails its check is
    skipped with the file and field (it holds no result either way); True for both."""
    from gpuserve.measure.gates import MEASURE_SCHEMA, validate_measure_record

    if not isinstance(doc, dict) or doc.get("schema") != MEASURE_SCHEMA:
        return False
    try:
        measures.append({**validate_measure_record(doc, path), "_source": str(path)})
    except InputError as e:
        _note_skip(skipped, f"{e} (not a usable {MEASURE_SCHEMA} record)")
    return True


def _note_skip(skipped: list[str] | None, why: str) -> None:
    if skipped is not None:
        skipped.append(why)


def _foreign_schema(doc: object) -> str | None:
    """The ``schema`` of a document that is not ours (another gpuserve kind), else None."""
    if isinstance(doc, dict):
        schema = doc.get("schema")
        if isinstance(schema, str) and not schema.startswith(_OUR_SCHEMA_PREFIX):
            return schema
    return None


def _is_result(doc: object) -> bool:
    return isinstance(doc, dict) and (
        "output_throughput" in doc
        or ("schema" in doc and _foreign_schema(doc) is None))


def _json_documents(text: str, path: Path) -> list[tuple[int, object]]:
    """(line, object) per non-blank line; a whole-file JSON document (a hand-written,
    indented record, a ``host.json``) is accepted too."""
    docs: list[tuple[int, object]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            docs.append((n, safeload.loads_json(raw, path, READ_LIMITS, line=n)))
        except InputError as e:
            try:
                whole = safeload.loads_json(text, path, READ_LIMITS)
            except InputError:
                why = e.message.removeprefix("invalid JSON: ")
                raise InputError(path, None, f"not a JSON object per line: {why}",
                                 line=n) from e
            first = next(i for i, line in enumerate(text.splitlines(), 1) if line.strip())
            return [(first, whole)]
    return docs


def parse_document(doc: object, file: str | Path, line: int | None = None) -> ResultRecord:
    """One JSON object: a gpuserve record (has ``schema``) or an SGLang bench line."""
    if not isinstance(doc, dict):
        raise InputError(file, None, f"expected a JSON object, got {type(doc).__name__}",
                         line=line)
    if "schema" in doc:
        return from_dict(doc, file, line)
    if "output_throughput" in doc:
        return from_sglang_bench(doc, file, line)
    raise InputError(file, None, "neither a gpuserve result record (no 'schema') nor an "
                     "SGLang benchmark line (no 'output_throughput')", line=line)


def _number(value: object, file, line, key: str, *, required: bool = False):
    if value is None:
        if required:
            raise InputError(file, key, "required number is missing or null", line=line)
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(file, key, f"must be a finite number, got {value!r}", line=line)
    return value


def _text(value: object, file, line, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(file, key, f"must be a string, got {value!r}", line=line)
    return value


def _object(value: object, file, line, key: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise InputError(file, key, f"must be an object or null, got {value!r}", line=line)
    return value


def _context(value: object, file, line) -> dict | None:
    ctx = _object(value, file, line, "context")
    if ctx is None:
        return None
    unknown = set(ctx) - set(CONTEXT_KEYS)
    if unknown:
        raise InputError(file, f"context.{sorted(unknown)[0]}", "unknown key", line=line)
    argv = ctx.get("argv")
    if argv is not None and (not isinstance(argv, list)
                             or not all(isinstance(a, str) for a in argv)):
        raise InputError(file, "context.argv", "must be a list of strings", line=line)
    for key in ("env", "nccl_env", "gpus"):
        _object(ctx.get(key), file, line, f"context.{key}")
    return ctx


def from_dict(doc: Mapping, file: str | Path, line: int | None = None) -> ResultRecord:
    """Our own record (/1 or /2); unknown keys are refused (they could only be typos)."""
    schema = doc.get("schema")
    if schema not in SCHEMAS:
        raise InputError(file, "schema", f"unsupported {schema!r}, expected one of "
                         f"{', '.join(SCHEMAS)}", line=line)
    kind = doc.get("kind")
    if kind not in KINDS:
        raise InputError(file, "kind", f"must be one of {', '.join(KINDS)}, got {kind!r}",
                         line=line)
    known = {"schema", "kind", "figures", *TEXT_FIELDS}
    if schema == SCHEMA:
        known |= set(V2_FIELDS)
    unknown = set(doc) - known
    if unknown:
        raise InputError(file, sorted(unknown)[0], f"unknown key in {schema}", line=line)
    figs = doc.get("figures")
    if not isinstance(figs, dict):
        raise InputError(file, "figures", "must be an object", line=line)
    extra = set(figs) - set(FIGURES[kind])
    if extra:
        raise InputError(file, f"figures.{sorted(extra)[0]}", f"not a {kind} figure",
                         line=line)
    figures = {k: _number(figs.get(k), file, line, f"figures.{k}",
                          required=(k == MAIN_FIGURE[kind]))
               for k in FIGURES[kind]}
    texts = {k: _text(doc.get(k), file, line, k) for k in (*TEXT_FIELDS, *V2_TEXT_FIELDS)}
    return ResultRecord(kind=kind, figures=figures, source=_where(file, line),
                        context=_context(doc.get("context"), file, line),
                        gate=validate_gate(doc.get("gate"), file, line),
                        sglang=_object(doc.get("sglang"), file, line, "sglang"), **texts)


def from_sglang_bench(doc: Mapping, file: str | Path, line: int | None = None) -> ResultRecord:
    """A line of ``python -m sglang.benchmark.serving --output-file``: a bench record.

    The figures in :data:`BENCH_FIGURES`, the tag and three ``server_info`` strings are
    read; the line itself is kept (``sglang``) without its ``server_info``.
    """
    figures = bench_figures(doc, file, line)
    info = doc.get("server_info")
    if info is not None and not isinstance(info, dict):
        raise InputError(file, "server_info", "must be an object or null", line=line)
    info = info or {}
    tag = _text(doc.get("tag"), file, line, "tag")
    version = info.get("version")
    served = info.get("served_model_name")
    model = info.get("model_path")
    return ResultRecord(
        kind="bench", profile=tag or Path(file).stem, figures=figures,
        sglang_version=version if isinstance(version, str) else None,
        served_name=served if isinstance(served, str) else None,
        model=model if isinstance(model, str) else None,
        source=_where(file, line), sglang=clean_sglang_line(doc),
    )


def _where(file, line) -> str:
    return f"{file}:{line}" if line is not None else str(file)


def validate_results_dir(value: object, source: str) -> str | None:
    """Host data ``results_dir``: a path string; empty, null or false turns recording off."""
    if value is None or value is False or value == "":
        return None
    if not isinstance(value, str):
        raise InputError(source, "results_dir", f"must be a directory path (string), or "
                         f"empty to record nothing; got {value!r}")
    return value


@dataclass(frozen=True)
class Served:
    """What the records say was served: the profile (and its hash), the model and the
    name it is served under, the SGLang release and its lock."""

    profile: str
    sglang_version: str
    model: str
    served_name: str
    profile_hash: str | None = None
    lock: str | None = None


def record_spec(results_dir: object, source: str, served: Served, *, args: Iterable[str],
                env: Mapping[str, str], context: Mapping | None = None) -> RecordSpec | None:
    """The serve deploy's :class:`RecordSpec` from host data ``results_dir`` (validated
    here, at prepare time), what is served and the rendered launch; None when recording
    is off.

    ``context`` (see :data:`CONTEXT_KEYS`) gets ``argv`` and ``env`` from the launch and
    ``gpuserve_version`` from this package unless given; secrets are removed here and
    again by the writer.
    """
    directory = validate_results_dir(results_dir, source)
    if directory is None:
        return None
    args = list(args)
    ctx = None
    if context is not None:
        ctx = {"argv": args, "env": dict(env), "gpuserve_version": __version__, **context}
        ctx = _redact(clean_context(ctx), _secret_values(ctx))
    return RecordSpec(results_dir=directory, profile=served.profile,
                      launch_hash=launch_hash(args, env),
                      sglang_version=served.sglang_version, model=served.model,
                      served_name=served.served_name, profile_hash=served.profile_hash,
                      lock=served.lock, context=ctx)
