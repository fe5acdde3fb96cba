"""Result records: what a run measured, with enough context to compare runs later.

Why: throughput figures that live only in a terminal are lost (the field notes' 82 ->
89.5 tok/s and EAGLE-3's 54.1 tok/s were never written down). Every smoke completion of
the serve deploy, and every SGLang benchmark run, becomes a record that ``gpuserve
compare`` can put side by side.

Format (schema ``gpuserve.result/1``): **one file per run**, holding one JSON object on
one line, at ``<results_dir>/<host>/<UTC YYYYmmddTHHMMSSZ>-<kind>-<profile>.json``.
One file per run needs no locking (hosts run in parallel), is deleted or kept one run at
a time, and, being one line, is also valid JSON Lines (``cat results/*/*.json`` is a
JSONL stream). Keys::

    {"schema": "gpuserve.result/1", "kind": "smoke" | "bench",
     "host": "gpu1", "profile": "glm5-nvfp4-tp8",
     "launch_hash": "sha256:<64 hex>",   # rendered argv + non-secret env, see launch_hash
     "sglang_version": "0.5.23", "model": "/models/GLM-5-NVFP4", "served_name": "glm-5",
     "timestamp": "2026-11-29T12:00:00Z",  # UTC, ISO 8601
     "figures": {...}, "note": "..."}      # note optional

Figures of a ``smoke`` record: ``tokens``, ``seconds``, ``tok_s`` (end-to-end, one
request, see gpuserve.measure.smoke). Figures of a ``bench`` record: the keys SGLang's
benchmark client writes, under SGLang's names (:data:`BENCH_FIGURES`); absent ones are
``null``. Only the fields above are stored: never argv, env or SGLang's ``server_info``
(which holds the resolved ServerArgs, API key included), so no secret can reach a record.

Readers accept our records and the ``--output-file`` JSON Lines of ``python -m
sglang.benchmark.serving`` (reference sglang.md section 5; the file is opened in append
mode, one object per run). An SGLang line becomes a ``bench`` record whose profile is
its ``--tag`` (else the file's stem), whose version and model come from its
``server_info``, and whose host is unknown. Bad input raises ``InputError`` naming the
file, the line and the key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuserve.errors import InputError
from gpuserve.measure.smoke import SmokeResult

SCHEMA = "gpuserve.result/1"
KINDS = ("smoke", "bench")
SMOKE_FIGURES = ("tokens", "seconds", "tok_s")
# SGLang benchmark client keys kept in a bench record (sglang/benchmark/serving.py result
# dict). num_prompts is written only by some variants; accept_length only with
# speculative decoding.
BENCH_FIGURES = (
    "output_throughput", "input_throughput", "total_throughput", "request_throughput",
    "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_tpot_ms",
    "max_concurrency", "random_input_len", "random_output_len",
    "num_prompts", "completed", "duration", "accept_length",
)
FIGURES = {"smoke": SMOKE_FIGURES, "bench": BENCH_FIGURES}
TEXT_FIELDS = ("host", "profile", "launch_hash", "sglang_version", "model", "served_name",
               "timestamp", "note")

# Env names and flags whose values are secrets: left out of the launch hash entirely.
_SECRET_NAME = re.compile(r"TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|CREDENTIAL", re.I)
_SECRET_FLAG = re.compile(r"api-key|token|secret|password", re.I)
_UNSAFE_PATH_CHARS = re.compile(r"[^A-Za-z0-9._@+-]")


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

    def to_dict(self) -> dict:
        doc: dict = {"schema": SCHEMA, "kind": self.kind}
        for key in TEXT_FIELDS:
            value = getattr(self, key)
            if value is not None or key != "note":
                doc[key] = value
        doc["figures"] = {k: self.figures.get(k) for k in FIGURES[self.kind]}
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, separators=(",", ":"))

    # Figures compare reads, whatever the kind.
    @property
    def output_tok_s(self) -> float | None:
        return self.figures.get("tok_s" if self.kind == "smoke" else "output_throughput")

    @property
    def concurrency(self) -> int | None:
        """Requests in flight: 1 for a smoke completion, ``--max-concurrency`` for a bench."""
        return 1 if self.kind == "smoke" else self.figures.get("max_concurrency")

    @property
    def workload(self) -> tuple:
        """What must match for two records to be compared: kind, concurrency, lengths."""
        return (self.kind, self.concurrency, self.figures.get("random_input_len"),
                self.figures.get("random_output_len"))


@dataclass(frozen=True)
class RecordSpec:
    """What the serve deploy knows at prepare time about the run a smoke check measures."""

    results_dir: str
    profile: str
    launch_hash: str
    sglang_version: str
    model: str
    served_name: str


def launch_hash(args: Iterable[str], env: Mapping[str, str]) -> str:
    """``sha256:<hex>`` of the rendered launch: argv and env, secrets left out.

    Env entries whose name looks secret (``*TOKEN*``, ``*API_KEY*``, ``*SECRET*``, ...)
    and secret-looking flags with their value are dropped before hashing, so the hash
    never depends on (and cannot be used to guess) a secret. Env order does not matter;
    argv order does (it does for SGLang too).
    """
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("--"):
                continue
        if arg.startswith("--") and _SECRET_FLAG.search(arg.split("=", 1)[0]):
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    clean_env = {k: v for k, v in env.items() if not _SECRET_NAME.search(k)}
    blob = json.dumps({"args": kept, "env": dict(sorted(clean_env.items()))},
                      separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


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
    )


def safe_name(text: str) -> str:
    """A path component from a host or profile name (no separators, never . or ..)."""
    name = _UNSAFE_PATH_CHARS.sub("_", text) or "_"
    return "_" + name if name.startswith(".") else name


def record_path(results_dir: str | Path, record: ResultRecord) -> Path:
    stamp = (record.timestamp or utc_now()).replace("-", "").replace(":", "")
    return (Path(results_dir) / safe_name(record.host or "unknown-host")
            / f"{stamp}-{record.kind}-{safe_name(record.profile or 'unknown')}.json")


def write_record(results_dir: str | Path, record: ResultRecord) -> Path:
    """Write ``record`` as its own file under ``results_dir/<host>/``; return the path.

    Never overwrites: a second record in the same second gets a ``-2`` suffix. The file
    is written next to its final name and renamed, so a reader never sees half a record.
    """
    path = record_path(results_dir, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    final, n = path, 1
    while final.exists():
        n += 1
        final = path.with_name(f"{path.stem}-{n}{path.suffix}")
    tmp = final.with_name(f".{final.name}.tmp")
    tmp.write_text(record.to_json() + "\n", encoding="utf-8")
    os.replace(tmp, final)
    return final


# ----------------------------------------------------------------------------- readers


def read_results(path: str | Path) -> list[ResultRecord]:
    """Records from a file (ours or SGLang bench JSONL) or a directory (recursively:
    ``*.json`` and ``*.jsonl``, in path order)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl")
                       and not f.name.startswith("."))
        return [r for f in files for r in read_file(f)]
    if not p.exists():
        raise InputError(p, None, "no such file or directory")
    return read_file(p)


def read_file(path: str | Path) -> list[ResultRecord]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(p, None, f"cannot read: {e}") from e
    docs = _json_documents(text, p)
    return [parse_document(doc, p, line) for line, doc in docs]


def _json_documents(text: str, path: Path) -> list[tuple[int, object]]:
    """(line, object) per non-blank line; a whole-file JSON document (a hand-written,
    indented record) is accepted too."""
    docs: list[tuple[int, object]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            docs.append((n, json.loads(raw)))
        except json.JSONDecodeError as e:
            try:
                whole = json.loads(text)
            except json.JSONDecodeError:
                raise InputError(path, None, f"not a JSON object per line: {e.msg}",
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


def from_dict(doc: Mapping, file: str | Path, line: int | None = None) -> ResultRecord:
    """Our own record; unknown keys are refused (they could only be typos)."""
    if doc.get("schema") != SCHEMA:
        raise InputError(file, "schema", f"unsupported {doc.get('schema')!r}, expected "
                         f"{SCHEMA!r}", line=line)
    kind = doc.get("kind")
    if kind not in KINDS:
        raise InputError(file, "kind", f"must be one of {', '.join(KINDS)}, got {kind!r}",
                         line=line)
    unknown = set(doc) - {"schema", "kind", "figures", *TEXT_FIELDS}
    if unknown:
        raise InputError(file, sorted(unknown)[0], "unknown key", line=line)
    figs = doc.get("figures")
    if not isinstance(figs, dict):
        raise InputError(file, "figures", "must be an object", line=line)
    extra = set(figs) - set(FIGURES[kind])
    if extra:
        raise InputError(file, f"figures.{sorted(extra)[0]}", f"not a {kind} figure",
                         line=line)
    main = "tok_s" if kind == "smoke" else "output_throughput"
    figures = {k: _number(figs.get(k), file, line, f"figures.{k}", required=(k == main))
               for k in FIGURES[kind]}
    texts = {k: _text(doc.get(k), file, line, k) for k in TEXT_FIELDS}
    return ResultRecord(kind=kind, figures=figures, source=_where(file, line), **texts)


def from_sglang_bench(doc: Mapping, file: str | Path, line: int | None = None) -> ResultRecord:
    """A line of ``python -m sglang.benchmark.serving --output-file``: a bench record.

    Only the figures in :data:`BENCH_FIGURES`, the tag and three ``server_info`` strings
    are read; everything else (per-request details, the resolved server arguments) is
    left behind.
    """
    figures = {k: _number(doc.get(k), file, line, k, required=(k == "output_throughput"))
               for k in BENCH_FIGURES}
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
        source=_where(file, line),
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


def record_spec(results_dir: object, source: str, *, profile: str, args: Iterable[str],
                env: Mapping[str, str], sglang_version: str, model: str,
                served_name: str) -> RecordSpec | None:
    """The serve deploy's :class:`RecordSpec` from host data ``results_dir`` (validated
    here, at prepare time) and the rendered launch; None when recording is off."""
    directory = validate_results_dir(results_dir, source)
    if directory is None:
        return None
    return RecordSpec(results_dir=directory, profile=profile,
                      launch_hash=launch_hash(args, env), sglang_version=sglang_version,
                      model=model, served_name=served_name)
