"""The deploys' preview under ``pyinfra ... --dry`` (with ``--diff``: the files' diffs).

pyinfra's ``--dry`` stops before executing; operations that act only when executing
(install, switch, checks, a driver's files, a reboot) show nothing there, so a switch
looked like a no-op. This prints, per host and from the host's own plan and prefetched
state, what the real run would change (gpuserve/preview.py): the serve deploy's from its
plan, the host and gateway deploys' from what their roles noted (roles/planned.py). It
runs at prepare time and reads only: the live texts of the files that would change come
in one batch (roles/prefetch.py).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.files import FileContents

from gpuserve.preview import (
    Preview,
    file_diff,
    gib,
    lock_install,
    preview_lines,
    restart_reason,
)
from gpuserve.roles import managed, planned
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


def serve_preview(plan: ServePlan, with_diff: bool) -> Preview:
    """The preview of this host's serve plan (reads the live texts it diffs)."""
    files = {f.dest: f.contents() for f in service_files(plan.service) if differs(f)}
    if plan.service.config_text is None and managed.state(CONFIG_PATH).kind != "absent":
        files[CONFIG_PATH] = None  # removed: no API key any more
    diffs = live_diffs(files, with_diff,
                       [host.data.get("hf_token"), host.data.get("sglang_api_key")])
    steps = planned_steps(plan.service)
    stale = managed.unit_state(UNIT_NAME, MANAGED_FILES).stale
    would = []
    installs = fact(VenvVerified, venv=plan.venv) != plan.lock.hash
    if installs:
        lock = plan.lock
        would.append("install " + lock_install(lock.name, "SGLang", plan.version,
                                               len(lock.packages), lock.download_bytes,
                                               plan.venv))
    fetches = plan.weights is not None and not plan.weights.complete
    if fetches:
        w = plan.weights
        would.append(f"fetch {w.repo_id}@{w.commit[:12]}: {w.files} files, "
                     f"{gib(w.to_fetch)} of {gib(w.total_bytes)}, into {w.target}")
    preview = Preview(host=host.name, diffs={p: d for p, d in diffs.items() if d},
                      would=would, steps=steps,
                      restarts={"server": restart_reason(list(files), steps, stale)},
                      preflight=[*([plan.pd.summary] if plan.pd else []),  # its PD role
                                 *plan.preflight.info, *plan.preflight.warnings]
                      if plan.preflight else [])
    preview.operations = _operations(plan, preview, list(files), installs, fetches)
    return preview


def live_diffs(files: dict[str, str | None], with_diff: bool, secrets: list[str | None],
               whole_secret: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Each path's diff from its live text (read in one batch) to the planned one (None:
    removed), secrets redacted (``whole_secret``: paths whose every line is); without
    ``--diff`` a line saying there are changes."""
    if with_diff and files:
        prefetch([Read.of(FileContents, path=p) for p in files])  # one command
    diffs = {}
    for path, text in files.items():
        if not with_diff:
            diffs[path] = ["(changes; --diff shows them)"]
            continue
        live = fact(FileContents, path=path)
        live_text = "\n".join(live) + "\n" if live is not None else None
        diffs[path] = file_diff(path, live_text, text, secrets, path in whole_secret)
    return diffs


def _operations(plan: ServePlan, preview: Preview, changed: list[str], installs: bool,
                fetches: bool) -> list[str]:
    """The operations that would act, in the order the deploy adds them."""
    ops = []
    if installs:
        ops.append(f"install the venv {plan.venv} and verify it against the lock")
    if fetches:
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


def print_planned_preview(with_diff: bool, secrets: list[str | None]) -> None:
    """Log what this host's roles noted they would change (roles/planned.py): the host
    and gateway deploys' preview, in the serve preview's lines."""
    notes = planned.notes()
    files = {path: f.text for path, f in notes.files.items()}
    hidden = frozenset(path for path, f in notes.files.items() if f.secret)
    diffs = live_diffs(files, with_diff, secrets, hidden)
    preview = Preview(host=host.name, diffs={p: d for p, d in diffs.items() if d},
                      would=list(notes.would), steps=list(notes.steps),
                      restarts=dict(notes.restarts), operations=list(notes.operations),
                      acts=notes.acts or bool(files))
    for line in preview_lines(preview):
        logger.info(line)
