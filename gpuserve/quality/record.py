"""A quality run (what one launch answered to the prompt set) and the quality reference
of a checkpoint, as record files under ``results_dir/quality/``.

A run holds, per prompt, the greedy token ids and text, the finish reason, the verify
count of a speculative launch, the count of non-finite logprobs and, for completion
prompts, the teacher-forced top-k distribution at every position of the *reference's*
continuation (of its own, for the reference). The reference is the run of the launch
marked ``quality.reference`` (default: the first launch of the checkpoint that passed
its gate), with the checkpoint revision, SGLang version and launch it came from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.measure.record_files import safe_name, write_new_file

SCHEMA = "gpuserve.quality/1"
QUALITY_DIR = "quality"
REFERENCE_DIR = "reference"


@dataclass
class PromptResult:
    """One prompt's reply (greedy) and, for completion prompts, the teacher-forced
    distributions on the reference continuation (``forced``: [[id, logprob], ...] per
    position, ``None`` where the server gave none)."""

    id: str
    kind: str
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    completion_tokens: int = 0
    verify_ct: int | None = None
    non_finite: int = 0
    first_non_finite: int | None = None
    prompt_ids: list[int] = field(default_factory=list)
    forced: list[list[list[float]] | None] = field(default_factory=list)
    answer: str | None = None  # the few-shot task's expected answer
    error: str | None = None  # the request failed: why

    def forced_top(self) -> list[dict[int, float] | None]:
        return [None if pos is None else {int(t): float(lp) for t, lp in pos}
                for pos in self.forced]


@dataclass
class QualityRun:
    """What one launch answered; ``figures``/``verdict`` are filled by the judge."""

    host: str
    profile: str
    model: str
    revision: str | None
    sglang_version: str
    launch_hash: str
    timestamp: str
    prompts: list[PromptResult]
    elapsed_s: float = 0.0
    reference: str | None = None  # the reference's file name this run was judged against
    figures: dict = field(default_factory=dict)
    verdict: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, **asdict(self)}, allow_nan=False, sort_keys=True)


def checkpoint_key(model: str, revision: str | None) -> str:
    """The reference's file stem: model and revision (a checkpoint, not a launch)."""
    return safe_name(f"{model}@{revision}" if revision else model)


def reference_path(results_root: Path, model: str, revision: str | None) -> Path:
    return results_root / QUALITY_DIR / REFERENCE_DIR / f"{checkpoint_key(model, revision)}.json"


def run_path(results_root: Path, run: QualityRun) -> Path:
    stamp = run.timestamp.replace("-", "").replace(":", "")
    return (results_root / QUALITY_DIR / safe_name(run.host)
            / f"{stamp}-quality-{safe_name(run.profile)}.json")


def write_run(results_root: Path, run: QualityRun) -> Path:
    """The run as its own record file (never overwritten)."""
    return write_new_file(run_path(results_root, run), run.to_json() + "\n")


def write_reference(results_root: Path, run: QualityRun) -> Path:
    """Make ``run`` its checkpoint's reference (replacing an older one: a new reference
    is chosen on purpose, ``quality.reference`` or ``gpuserve quality --reference``)."""
    path = reference_path(results_root, run.model, run.revision)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(run.to_json() + "\n")
    tmp.replace(path)
    return path


def _prompt(doc: object, file: Path, i: int) -> PromptResult:
    if not isinstance(doc, dict):
        raise InputError(file, f"prompts[{i}]", "must be a mapping")
    known = PromptResult.__dataclass_fields__
    try:
        return PromptResult(**{k: v for k, v in doc.items() if k in known})
    except TypeError as e:
        raise InputError(file, f"prompts[{i}]", str(e)) from e


def read_run(path: Path) -> QualityRun:
    """A run or reference file; InputError naming the file and field when it is not one."""
    doc = safeload.load_json_file(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(path, "schema", f"not a {SCHEMA} record")
    prompts = doc.get("prompts")
    if not isinstance(prompts, list):
        raise InputError(path, "prompts", "must be a list")
    fields = {k: v for k, v in doc.items()
              if k in QualityRun.__dataclass_fields__ and k != "prompts"}
    try:
        return QualityRun(prompts=[_prompt(p, path, i) for i, p in enumerate(prompts)], **fields)
    except TypeError as e:
        raise InputError(path, None, f"not a quality record: {e}") from e


def read_reference(results_root: Path, model: str, revision: str | None) -> QualityRun | None:
    path = reference_path(results_root, model, revision)
    return read_run(path) if path.is_file() else None


def newest_runs(results_root: Path, host: str | None = None) -> list[tuple[Path, QualityRun]]:
    """Every readable quality run under ``results_root/quality/<host>/``, oldest first."""
    base = results_root / QUALITY_DIR
    dirs = [base / safe_name(host)] if host else [d for d in sorted(base.glob("*"))
                                                  if d.is_dir() and d.name != REFERENCE_DIR]
    out = []
    for d in dirs:
        for path in sorted(d.glob("*-quality-*.json")):
            try:
                out.append((path, read_run(path)))
            except (InputError, OSError):
                continue
    return out
