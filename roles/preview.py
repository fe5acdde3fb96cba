"""The serve deploy's preview under ``pyinfra ... --dry`` (with ``--diff``: the files' diffs).

pyinfra's ``--dry`` stops before executing; operations that act only when executing
(install, switch, checks) show nothing there, so a switch looked like a no-op. This
prints, per host and from the host's own plan and prefetched state, what the real run
would change (gpuserve/serve/preview.py). It runs at prepare time and reads only: the
live texts of the files that would change come in one batch (roles/prefetch.py).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.files import FileContents

from gpuserve.roles import managed
from gpuserve.roles.prefetch import Read, fact, prefetch
from gpuserve.roles.service import (
    CONFIG_PATH,
    MANAGED_FILES,
    UNIT_NAME,
    planned_steps,
    service_files,
)
from gpuserve.roles.service import _differs as differs
from gpuserve.roles.sglang import VenvVerified
from gpuserve.serve.plan import ServePlan
from gpuserve.serve.preview import Preview, file_diff, gib, preview_lines, restart_reason


def serve_preview(plan: ServePlan, with_diff: bool) -> Preview:
    """The preview of this host's serve plan (reads the live texts it diffs)."""
    files = {f.dest: f.contents() for f in service_files(plan.service) if differs(f)}
    if plan.service.config_text is None and managed.state(CONFIG_PATH).kind != "absent":
        files[CONFIG_PATH] = None  # removed: no API key any more
    if with_diff and files:
        prefetch([Read.of(FileContents, path=p) for p in files])  # one command
    secrets = [host.data.get("hf_token"), host.data.get("sglang_api_key")]
    diffs = {}
    for path, planned in files.items():
        live = fact(FileContents, path=path) if with_diff else None
        live_text = "\n".join(live) + "\n" if live is not None else None
        diffs[path] = (file_diff(path, live_text, planned, secrets) if with_diff
                       else ["(changes; --diff shows them)"])
    steps = planned_steps(plan.service)
    stale = managed.unit_state(UNIT_NAME, MANAGED_FILES).stale
    install = None
    if fact(VenvVerified, venv=plan.venv) != plan.lock.hash:
        lock = plan.lock
        install = (f"lock {lock.name}: SGLang {plan.version}, {len(lock.packages)} packages, "
                   f"{gib(lock.download_bytes)} of wheels, into {plan.venv}")
    weights = None
    if plan.weights is not None and not plan.weights.complete:
        w = plan.weights
        weights = (f"{w.repo_id}@{w.commit[:12]}: {w.files} files, {gib(w.to_fetch)} of "
                   f"{gib(w.total_bytes)}, into {w.target}")
    preview = Preview(host=host.name, diffs={p: d for p, d in diffs.items() if d},
                      install=install, weights=weights, steps=steps,
                      restart_why=restart_reason(list(files), steps, stale),
                      preflight=[*plan.preflight.info, *plan.preflight.warnings]
                      if plan.preflight else [])
    preview.operations = _operations(plan, preview, list(files))
    return preview


def _operations(plan: ServePlan, preview: Preview, changed: list[str]) -> list[str]:
    """The operations that would act, in the order the deploy adds them."""
    ops = []
    if preview.install:
        ops.append(f"install the venv {plan.venv} and verify it against the lock")
    if preview.weights:
        ops.append(f"fetch the weights into {plan.weights.target}")
    ops += [f"write {path}" for path in changed]
    if preview.steps:
        ops.append(f"systemctl {', '.join(preview.steps)} {UNIT_NAME}")
    ops.append(f"health gate on port {plan.service.port} (a read; waits "
               f"{plan.health_timeout:g} s at most after a restart)")
    ops.append("smoke completion (a read)")
    if plan.bench is not None:
        ops.append(f"throughput checks: bench {plan.bench.mode} "
                   f"({len(plan.bench.spec.scenarios)} scenarios)")
    if preview.steps:
        ops.append("keep this configuration as the last good one")
    return ops


def print_serve_preview(plan: ServePlan, with_diff: bool) -> None:
    """Log the preview, one line each (pyinfra's logger: the run's own output)."""
    for line in preview_lines(serve_preview(plan, with_diff)):
        logger.info(line)
