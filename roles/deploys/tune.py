"""A tune's one read of the host: ``tune_snapshot()``, run by ``gpuserve tune`` first.

It plans the incumbent profile exactly as the serve deploy would (host data, lock,
on-host preflight: gpuserve/plans/serve.py, so a tune that the host cannot serve stops
here) and writes what the controller needs to judge every candidate without another
SSH round trip: GPUs, the checkpoint scan, the doctor's host-facts document, host.json,
the service's journal (load time, SGLang's own memory figures) and the profile the host
serves now (gpuserve/tune/snapshot.py). It yields no operation: the host is not changed,
and pyinfra says "No changes".

Host data: the serve deploy's keys, plus ``tune_snapshot``: the controller path the
document is written to (0600: the journal is the service's), and ``tune_drafts``: the
separate draft directories the tune's candidates name, each scanned like the model's
checkpoint so the pre-load check plans the draft's real weights.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FactBase
from pyinfra.facts.files import FileContents

from gpuserve.errors import InputError
from gpuserve.facts.document import host_facts_document
from gpuserve.facts.host import ModelCheckpoint
from gpuserve.host.nccl_env import HOST_JSON_PATH
from gpuserve.measure.results import utc_now
from gpuserve.roles.base.inventory import inventory_source, packaged_deploy
from gpuserve.roles.base.prefetch import fact, reader
from gpuserve.roles.deploys.operate import ServiceJournal
from gpuserve.roles.deploys.serve import plan_and_read
from gpuserve.serve.service import ENV_PATH, UNIT_NAME
from gpuserve.tune.snapshot import MAX_DRAFTS, SCHEMA

JOURNAL_LINES = 4000

#: Host data of the snapshot deploy (besides the serve deploy's keys).
TUNE_DEFAULTS = {
    # the controller path gpuserve tune's host snapshot is written to (0600); set by
    # gpuserve tune for its read-only run, never in an inventory
    # accepts: str (a path on the controller) or None
    "tune_snapshot": None,
    # the separate draft checkpoints (speculative.draft_model directories) the tune's
    # candidates name, scanned like the model's; set by gpuserve tune, never in an inventory
    # accepts: list of absolute paths (at most 8) or None
    "tune_drafts": None,
}


class ServedProfileName(FactBase):
    """The ``# Profile: NAME`` line of the live EnvironmentFile (only that line: the file
    holds secrets)."""

    def command(self, path: str) -> str:
        return f"sed -n 's/^# Profile: //p' {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        names = [line.strip() for line in output if line.strip()]
        return names[-1] if names else None


def _draft_dirs() -> list[str]:
    """Host data ``tune_drafts``: absolute directories, at most MAX_DRAFTS."""
    value = host.data.get("tune_drafts") or []
    if not isinstance(value, list) or len(value) > MAX_DRAFTS or not all(
            isinstance(p, str) and p.startswith("/") and p.isprintable() for p in value):
        raise InputError(inventory_source(), "tune_drafts", f"a list of at most {MAX_DRAFTS} "
                         "absolute directories (set by gpuserve tune)")
    return value


@packaged_deploy
def tune_snapshot() -> None:
    """Write the tune's host snapshot to host data ``tune_snapshot`` (see module doc)."""
    target = host.data.get("tune_snapshot")
    if not isinstance(target, str) or not target:
        raise InputError(inventory_source(), "tune_snapshot", "required: the controller "
                         "path to write the snapshot to (set by gpuserve tune)")
    if len(state.activated_hosts) > 1:  # one file, one host: a tune measures one box
        raise InputError(inventory_source(), "tune_snapshot", f"a tune measures one host, "
                         f"this run has {len(state.activated_hosts)}: give gpuserve tune "
                         "--limit HOST")
    plan = plan_and_read()  # the serve deploy's input and plan, its interpreter chosen once
    path = plan.input.checkpoint_path
    host_json = fact(FileContents, path=HOST_JSON_PATH)
    doc = {
        "schema": SCHEMA, "host": host.name, "taken": utc_now(),
        "sglang_version": plan.version, "lock": f"{plan.lock.name}@{plan.lock.hash}",
        "gpus": [dict(g) for g in plan.runtime.gpu_list],
        "checkpoint": fact(ModelCheckpoint, path=path) if path else None,
        "host_facts": host_facts_document(reader()),
        "host_json": "\n".join(host_json) if host_json else None,
        "journal": host.get_fact(ServiceJournal, unit=UNIT_NAME, lines=JOURNAL_LINES),
        "profile": host.get_fact(ServedProfileName, path=ENV_PATH),
        "drafts": {p: fact(ModelCheckpoint, path=p) for p in _draft_dirs()},
    }
    out = Path(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, default=str)
    os.replace(out.with_suffix(".tmp"), out)
