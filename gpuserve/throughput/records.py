"""Throughput measurements as the predictor reads them, and calibration by them.

Two kinds of JSONL line: a measurement in the public schema (``{"id", "pair",
"baseline", "model", "gpu", "num_gpus", "nodes", "nvlink", "p2p", "tp", "ep",
"attn_dp", "moe_a2a_backend", "kv_cache_dtype", "speculative", "concurrency",
"input_len", "output_len", "decode_only", "measured": {"output_tps", "per_user_tps"},
"source"}``), or the project's own bench record (``gpuserve.result/*``, kind bench), whose
launch is its profile. Why one reader: ``gpuserve plan --calibrate`` and
``bench/throughput_accuracy.py`` must plan a line the same way.

How: docs/planner.md, "Throughput predictor".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.memory.models import ModelArch, load_record, record_names
from gpuserve.memory.planner import KV_DTYPE_BYTES, Layout
from gpuserve.paths import DATA_DIR
from gpuserve.throughput.hardware import gpu, link, link_for
from gpuserve.throughput.model import Box, Prediction, Speculation, Workload, predict

ALIASES_PATH = DATA_DIR / "throughput" / "hf_models.yaml"


@dataclass
class Case:
    """One measurement made plannable: the launch, the box, the workload, the figure."""

    row: dict
    arch: ModelArch
    layout: Layout
    box: Box
    work: Workload
    spec: Speculation | None
    kv_dtype: str
    measured: float  # output tok/s

    def predict(self, box: Box | None = None) -> Prediction:
        """The case's prediction on its box (or ``box``), its figure unseen."""
        return predict(self.arch, self.layout, box or self.box, self.work,
                       kv_dtype=self.kv_dtype, spec=self.spec)


def is_bench_file(path: str | Path) -> bool:
    """A file whose first non-empty line starts with ``{``: JSONL bench records (anything
    else given to ``--calibrate`` is a startup log, read elsewhere)."""
    for line in safeload.read_text(path, max_bytes=64 << 20).splitlines():
        if line.strip():
            return line.lstrip().startswith("{")
    return False


def read_rows(path: str | Path, *, strict: bool = True) -> list[dict]:
    """Every JSON object line of ``path``, in the public schema (the project's bench
    records converted); a line that is not JSON, or (``strict``) a field of the wrong
    type, is an error naming it; not strict, such a row carries why in ``_invalid``."""
    rows = []
    text = safeload.read_text(path, max_bytes=64 << 20)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            doc = _refused(path, n, f"not JSON: {e}", strict)
        if not isinstance(doc, dict):
            doc = _refused(path, n, "a record must be a JSON object", strict)
        row = _from_result(doc) if str(doc.get("schema", "")).startswith(
            "gpuserve.result/") else doc
        if row is not None and "schema" not in row:
            try:
                check_row(row, path, n)
            except InputError as e:
                if strict:
                    raise
                row["_invalid"] = f"{e.field}: {e.message}"
        if row is not None:
            row.setdefault("_line", n)
            rows.append(row)
    return rows


def _refused(path: str | Path, line: int, why: str, strict: bool) -> dict:
    """A line that is no record: an error naming it, or (not strict) a row saying why."""
    if strict:
        raise InputError(path, f"line {line}", why)
    return {"id": f"line {line}", "_invalid": f"line {line}: {why}"}


_INTS = ("num_gpus", "nodes", "tp", "ep", "attn_dp", "concurrency", "input_len",
         "output_len")
_BOOLS = ("nvlink", "p2p", "virtualized", "decode_only")


def check_row(row: dict, path: str | Path, line: int) -> None:
    """A public-schema line's fields have the types the predictor reads (null allowed):
    a wrong one is an error naming the file, line and field."""
    def bad(field: str, what: str) -> InputError:
        return InputError(path, f"line {line}: {field}", f"must be {what}, got "
                          f"{row.get(field)!r:.40}")

    for key in _INTS:
        value = row.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise bad(key, "a whole number or null")
    for key in _BOOLS:
        if row.get(key) is not None and not isinstance(row[key], bool):
            raise bad(key, "true, false or null")
    if not isinstance(row.get("measured") or {}, dict):
        raise bad("measured", "an object with output_tps and/or per_user_tps")
    spec = row.get("speculative")
    if spec is not None and not isinstance(spec, dict):
        raise bad("speculative", "null or an object")
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        value = (spec or {}).get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad(f"speculative.{key}", "a whole number or null")


def _from_result(doc: dict) -> dict | None:
    """A ``gpuserve.result/*`` bench record as a public-schema row: its profile is the
    launch; a record without concurrency was one stream (the notes' figures)."""
    if doc.get("kind") != "bench" or not doc.get("profile"):
        return None
    figures = doc.get("figures") or {}
    tps = figures.get("output_throughput")
    if not isinstance(tps, int | float) or tps <= 0:
        return None
    conc = figures.get("max_concurrency") or figures.get("concurrency") or 1
    return {"id": doc["profile"], "profile": doc["profile"], "host": doc.get("host"),
            "concurrency": int(round(float(conc))),
            "input_len": figures.get("random_input_len") or 1024,
            "output_len": figures.get("random_output_len") or 1024,
            "measured": {"output_tps": float(tps)}, "source": doc.get("note") or "record"}


def measured_tps(row: dict) -> float | None:
    """The row's output tok/s: measured, else per-user tok/s times the concurrency."""
    m = row.get("measured") or {}
    tps = m.get("output_tps")
    if isinstance(tps, int | float) and tps > 0:
        return float(tps)
    per = m.get("per_user_tps")
    if isinstance(per, int | float) and per > 0:
        return float(per) * int(row.get("concurrency") or 1)
    return None


def model_record(model_id: str, extra: dict | None = None) -> str | None:
    """The model record for a Hub repo id: ``extra`` (a data set's own map), the alias
    file, else a record of that name."""
    aliases = {**(safeload.load_yaml_file(ALIASES_PATH).get("models") or {}), **(extra or {})}
    for repo, name in aliases.items():
        if repo.lower() == str(model_id).lower():
            return name
    want = _norm(str(model_id).split("/")[-1])
    for name in record_names():
        if _norm(name) == want:
            return name
    return None


def _norm(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def case_from_row(row: dict, aliases: dict | None = None) -> Case | str:
    """A public-schema row as a plannable case, or why it cannot be planned."""
    if row.get("_invalid"):
        return f"bad field {row['_invalid']}"
    name = model_record(str(row.get("model") or ""), aliases)
    if name is None:
        return f"no model record for {row.get('model')!r}"
    arch = load_record(name)
    card = gpu(str(row.get("gpu") or ""))
    if card is None:
        return f"no memory bandwidth for GPU {row.get('gpu')!r}"
    tp = int(row.get("tp") or row.get("num_gpus") or 1)
    spec_doc = row.get("speculative") or None
    spec = None
    if isinstance(spec_doc, dict) and spec_doc.get("algorithm"):
        spec = Speculation(str(spec_doc["algorithm"]).upper(),
                           int(spec_doc.get("num_steps") or 3),
                           int(spec_doc.get("eagle_topk") or 1),
                           int(spec_doc.get("num_draft_tokens") or
                               (spec_doc.get("num_steps") or 3) + 1))
    layout = Layout(tp=tp, ep=int(row.get("ep") or 1), attn_dp=int(row.get("attn_dp") or 1),
                    moe_a2a_backend=str(row.get("moe_a2a_backend") or "none"),
                    speculative=spec.algorithm if spec else None)
    problems = layout.validate(arch)
    if problems:
        return f"layout refused: {problems[0]}"
    nodes = int(row.get("nodes") or 1)
    box = Box(card, link(link_for(nvlink=row.get("nvlink"), p2p=row.get("p2p"), nodes=nodes,
                                  card=card, gpus=int(row.get("num_gpus") or tp))))
    replicas = max(1, int(row.get("num_gpus") or tp) // tp)
    conc = max(1, int(row.get("concurrency") or 1))
    work = Workload(concurrency=max(1, conc // replicas),
                    input_len=int(row.get("input_len") or 1024),
                    output_len=int(row.get("output_len") or 1024),
                    decode_only=bool(row.get("decode_only")))
    tps = measured_tps(row)
    if tps is None:
        return "no measured output_tps or per_user_tps"
    case = Case(row, arch, layout, box, work, spec, kv_dtype(row.get("kv_cache_dtype")),
                tps / replicas)
    try:
        case.predict()
    except InputError as e:
        return f"not planned: {e.message}"
    return case


def kv_dtype(value: object) -> str:
    """A measurement's KV cache dtype as SGLang names it (``FP8`` is fp8,
    ``float8_e4m3fn`` fp8_e4m3, an FP4 cache nvfp4); unknown names are SGLang's auto."""
    text = str(value or "auto").lower()
    if text in KV_DTYPE_BYTES or text in ("auto", "nvfp4", "fp4_e2m1"):
        return text
    if "fp8" in text or "float8" in text:
        return "fp8_e5m2" if "e5m2" in text else "fp8_e4m3"
    if "fp4" in text:
        return "nvfp4"
    return "bf16" if text in ("float16", "half", "bfloat16") else "auto"


def fit(case: Case) -> Box:
    """The case's box calibrated so the case predicts what it measured: one
    multiplicative factor (the same as the accuracy bench's by a pair's baseline)."""
    plain = Box(case.box.gpu, case.box.link)
    predicted = case.predict(plain).output_tps
    return Box(plain.gpu, plain.link, predicted / case.measured)
