"""Model weights from the Hub onto the host: a ``model.hf`` revision fetched, verified
and sealed in its own immutable directory before the service points at it.

Planned at prepare time (gpuserve/serve/weights.py: commit, marker fact, Hub headers
for the preflight, disk check). Here: the models directory, the token file (0600, the
service user's, written from stdin: never on argv, in the journal or pyinfra's output),
the host script, then ``weights_fetch.py start`` runs the download in the background as
the service user with the SGLang venv's python, and the operation polls its status as a
fact, printing ``<host>: weights: org/name: 1.20 GiB of 3.40 GiB (35%), 110.0 MiB/s,
ETA 21 s`` until it is done, failed, or past ``weights_timeout``. A revision whose
marker is present yields no operation at all. docs/weights.md.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable

from pyinfra import host, logger, state
from pyinfra.api import StringCommand, deploy, operation

from gpuserve.paths import SCRIPTS_DIR
from gpuserve.poll import JOB_FIRST_PAUSES_S, Poll
from gpuserve.roles.base import managed
from gpuserve.roles.base.failure import fail_host
from gpuserve.serve.weights import POLL_S, REPORT_S, WeightsPlan, one_line, progress_line

SCRIPT = "weights_fetch.py"
CLIENT = "hub_client.py"
JOB = "host_job.py"  # the job runner its start imports


def _status(script: str, run_dir: str) -> dict:
    from gpuserve.facts.host import WeightsFetchStatus

    text = host.get_fact(WeightsFetchStatus, script=script, run_dir=run_dir) or ""
    try:
        doc = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


@operation(is_idempotent=False)
def download(plan: WeightsPlan, script: str, python: str, token_file: str | None):
    """Start the background download and poll it (bounded by ``plan.timeout``)."""
    if not state.is_executing:
        return
    argv = ["python3", script, "start", "--run-dir", plan.run_dir, "--user", plan.user,
            "--python", python, "--hung-after", f"{plan.stall_timeout + 60:.0f}", "--",
            "run", "--repo", plan.repo_id, "--commit", plan.commit, "--target", plan.target,
            "--stall-timeout", f"{plan.stall_timeout:g}", "--max-files", str(plan.max_files),
            "--timeout", f"{plan.timeout:g}", "--min-rate", f"{plan.min_rate:g}",
            "--workers", str(plan.workers)]
    if plan.endpoint:
        argv += ["--endpoint", plan.endpoint]
    if token_file:
        argv += ["--token-file", token_file]
    yield StringCommand(" ".join(shlex.quote(a) for a in argv))
    last, phase = -REPORT_S, None
    for elapsed in Poll(plan.timeout, POLL_S, first_s=JOB_FIRST_PAUSES_S):
        doc = _status(script, plan.run_dir)
        if doc.get("state") == "done":
            again = doc.get("refetched") or []
            logger.info(f"{host.name}: weights: {plan.repo_id}@{plan.commit[:12]} verified "
                        f"({doc.get('files')} files, {int(doc.get('total') or 0):,} bytes)"
                        + (f"; fetched again after a hash mismatch: {', '.join(again)}"
                           if again else "") + f": {plan.target}")
            return
        if doc.get("state") == "failed":
            yield fail_host(f"weights: {plan.repo_id}@{plan.commit[:12]}: "
                            f"{one_line(doc.get('error'), limit=400)}; partial files are "
                            f"kept in {plan.target}.partial and the next run resumes them; "
                            "the service was not changed",
                            [one_line(x) for x in doc.get("tail") or []])
            return
        if doc.get("state") == "running" and (elapsed - last >= REPORT_S
                                              or doc.get("phase") != phase):
            logger.info(progress_line(host.name, plan.repo_id, doc))
            last, phase = elapsed, doc.get("phase")
    yield fail_host(f"weights: {plan.repo_id}: not done within {plan.timeout:.0f} s "
                    "(host data weights_timeout); the download keeps running on the "
                    "host and a rerun picks it up", [])


@deploy("Model weights from the Hub")
def fetch_weights(plan: WeightsPlan, bin_dir: str, python: str,
                  token: Callable[[], str | None], token_file: str) -> None:
    """Fetch, verify and seal ``plan``'s revision unless the host has it complete;
    ``token()`` (a function: pyinfra never logs the value) goes to ``token_file`` (in
    the service user's own home, 0600). A floating revision's commit is recorded after
    (its first resolution, or a move host data accepted), even when nothing was fetched."""
    if not plan.complete:
        _fetch(plan, bin_dir, python, token, token_file)
    if plan.ref_record and plan.record:
        refs = posixpath.dirname(plan.ref_record)
        managed.directory(name=f"{refs} (branches resolved on this host)", path=refs,
                          user=plan.user, group=plan.user, mode="755")
        managed.put(name=f"record {plan.ref_record} = {plan.commit}", dest=plan.ref_record,
                    text=plan.commit + "\n", user=plan.user, group=plan.user, mode="644")


def _fetch(plan: WeightsPlan, bin_dir: str, python: str, token: Callable[[], str | None],
           token_file: str) -> None:
    """The directories, the token file, the host script, then the download itself."""
    managed.directory(name=f"{plan.models_dir} (model revisions)", path=plan.models_dir,
                      user="root", group="root", mode="755")
    managed.directory(name=f"{plan.repo_dir} (revisions of {plan.repo_id})",
                      path=plan.repo_dir, user=plan.user, group=plan.user, mode="755")
    secret = token()
    if secret:
        managed.secret(name=f"Hub token for the download ({token_file}, 0600 "
                            f"{plan.user})", dest=token_file, contents=lambda: secret + "\n",
                       user=plan.user, group=plan.user, mode="600")
    managed.directory(name=f"{bin_dir} (gpuserve host scripts)", path=bin_dir, user="root",
                      group="root", mode="755")
    for name in (CLIENT, JOB, SCRIPT):  # the script imports these from its own dir
        managed.put(name=f"host script {bin_dir}/{name}", src=str(SCRIPTS_DIR / name),
                    dest=f"{bin_dir}/{name}", user="root", group="root", mode="755")
    gib = 1 << 30
    download(name=f"fetch {plan.repo_id}@{plan.commit[:12]}: {plan.to_fetch / gib:.2f} GiB "
                  f"to fetch of {plan.total_bytes / gib:.2f} GiB, verified into "
                  f"{plan.target}", plan=plan, script=f"{bin_dir}/{SCRIPT}", python=python,
             token_file=token_file if secret else None)
