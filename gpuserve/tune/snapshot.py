"""What a tune knows about the host before it loads anything: one read of the host.

Why one read: pruning and prediction run on the controller for every candidate, and a
checkpoint scan, the doctor's host-facts document and the measured gates cost an SSH
round trip each. ``deploy/tune_snapshot.py`` (gpuserve.roles.deploys.tune_snapshot)
reads them once with the serve deploy's own plan and writes this document
(``gpuserve.tune-snapshot/1``) to the controller; the tune reads it here.

How: docs/tune.md, "gpuserve.tune.snapshot: the document"
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.memory.draft import local_draft_dir

SCHEMA = "gpuserve.tune-snapshot/1"
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d))\s")
_STARTED = re.compile(r"systemd\[1\]: Started gpuserve-sglang\.service")
_READY = re.compile(r"The server is fired up and ready to roll!")
_PROFILE = re.compile(r"^# Profile: (\S+)$", re.M)


@dataclass(frozen=True)
class StartTiming:
    load_s: float  # systemd start to SGLang ready
    log: str  # the journal lines of that start


@dataclass(frozen=True)
class HostSnapshot:
    host: str
    sglang_version: str
    lock: str
    gpus: list[dict]
    checkpoint: str | None
    host_facts: dict | None
    host_json: str | None
    journal: str = ""
    profile: str | None = None
    measures: list[dict] = field(default_factory=list)
    # the separate draft checkpoints the candidates name: directory -> its scan's JSON
    drafts: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_name(self) -> str:
        return str(self.gpus[0].get("name")) if self.gpus else "GPU"

    def config_key(self) -> str:
        """What makes a measurement on this host comparable: the lock, the GPUs and the
        host's NCCL choice (host.json). Part of each candidate's name."""
        names = ",".join(sorted({str(g.get("name")) for g in self.gpus}))
        return f"{self.host}|{self.lock}|{len(self.gpus)}x{names}|{self.host_json or ''}"


def _stamp(line: str) -> float | None:
    m = _ISO.match(line)
    if not m:
        return None
    text = m.group(1)
    if re.search(r"[+-]\d{4}$", text):
        text = text[:-2] + ":" + text[-2:]
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def last_start(journal: str) -> StartTiming | None:
    """The last start that reached "ready" in a ``short-iso-precise`` journal: its load
    time and its lines (None when no start in the text got there)."""
    lines = journal.splitlines()
    found = None
    start_index = None
    for index, line in enumerate(lines):
        if _STARTED.search(line):
            start_index = index
        elif _READY.search(line) and start_index is not None:
            t0, t1 = _stamp(lines[start_index]), _stamp(line)
            if t0 is not None and t1 is not None and t1 >= t0:
                found = StartTiming(t1 - t0, "\n".join(lines[start_index:index + 1]))
            start_index = None
    return found


def last_run(journal: str) -> str:
    """The journal lines of the unit's last start, to the end (a crash under load
    included)."""
    lines = journal.splitlines()
    starts = [i for i, line in enumerate(lines) if _STARTED.search(line)]
    return "\n".join(lines[starts[-1]:] if starts else lines[-200:])


def failed_run(journal: str, within: int = 3) -> str:
    """The journal lines of the newest of the last ``within`` starts that names an error,
    else the last start's: a candidate that crashed is often not the last start by the
    time its journal is read (systemd's Restart=on-failure, then the rollback, start the
    server again), and which start is last depends on how fast the host got there."""
    lines = journal.splitlines()
    starts = [i for i, line in enumerate(lines) if _STARTED.search(line)]
    if not starts:
        return "\n".join(lines[-200:])
    ends = [*starts[1:], len(lines)]
    for begin, end in list(zip(starts, ends, strict=True))[::-1][:within]:
        run = "\n".join(lines[begin:end])
        if error_line(run):
            return run
    return "\n".join(lines[starts[-1]:])


_ERROR = re.compile(r"\b(\w*Error|CUDA error|Not enough memory|out of memory)\b")


def error_line(text: str) -> str | None:
    """The last line naming an exception (SGLang's own text), prefix stripped."""
    hits = [line for line in text.splitlines() if _ERROR.search(line)]
    if not hits:
        return None
    line = hits[-1]
    return line.split(": ", 1)[-1].strip()[:300] if _ISO.match(line) else line.strip()[:300]


def parse_snapshot(path: str | Path) -> HostSnapshot:
    doc = safeload.load_json_file(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(path, "schema", f"not a {SCHEMA} document")

    def text(key: str, required: bool = False) -> Any:
        value = doc.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise InputError(path, key, "must be a string")
        return value

    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise InputError(path, "gpus", "must be a list of objects")
    facts = doc.get("host_facts")
    if facts is not None and not isinstance(facts, dict):
        raise InputError(path, "host_facts", "must be an object")
    drafts = doc.get("drafts") or {}
    if not isinstance(drafts, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in drafts.items()):
        raise InputError(path, "drafts", "must map draft directories to checkpoint scans")
    return HostSnapshot(host=text("host", True), sglang_version=text("sglang_version", True),
                        lock=text("lock", True), gpus=gpus, checkpoint=text("checkpoint"),
                        host_facts=facts, host_json=text("host_json"),
                        journal=text("journal") or "", profile=text("profile"),
                        drafts={k: v for k, v in drafts.items() if v})


#: At most this many draft checkpoints are read for one tune (one scan each).
MAX_DRAFTS = 8


def draft_data(spec, raw_knobs: dict[str, Any]) -> list[str]:
    """The snapshot deploy's ``tune_drafts`` host data (``--data``): the draft directories
    the candidates name, read with the model's checkpoint (none: no argument)."""
    from gpuserve.launch.profiles import load_profile

    incumbent = load_profile(spec.incumbent)
    drafts = draft_paths(raw_knobs, incumbent.speculative.draft_model, incumbent.model.path)
    return [f"tune_drafts={json.dumps(drafts)}"] if drafts else []


def draft_paths(raw_knobs: dict[str, Any], incumbent_draft: str | None,
                model_path: str = "") -> list[str]:
    """The local draft directories a tune's candidates may load (``speculative.draft_model``
    in the knobs' values, the incumbent's own): the snapshot scans each, so the pre-load
    check charges a draft's real weights. Hub ids (no leading /) are not read, nor the
    model's own directory (its MTP layers are in its scan already)."""
    found = [incumbent_draft] if incumbent_draft else []
    for name, values in raw_knobs.items():
        for value in values if isinstance(values, list) else []:
            if name == "speculative.draft_model":
                found.append(value)
            elif isinstance(value, dict):
                found.append(value.get("speculative.draft_model"))
    paths = {local_draft_dir(p, model_path) for p in found if isinstance(p, str)}
    return sorted(p for p in paths if p)[:MAX_DRAFTS]


def served_profile(env_file_text: str) -> str | None:
    """The profile name the serve deploy wrote into the live EnvironmentFile."""
    m = _PROFILE.search(env_file_text or "")
    return m.group(1) if m else None
