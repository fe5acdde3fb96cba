"""NCCL environment file from the P2P verdict (decisions in gpuserve.host.nccl_env).

Once the measuring stage (roles/gpu_gates) has run, its choice in
/etc/gpuserve/measured.json outranks the driver's verdict here too, so that this role
and that stage write the same files and a rerun changes nothing.

Writes /etc/gpuserve/nccl.env (systemd EnvironmentFile syntax, each value commented
with its reason) and /etc/gpuserve/host.json, which tells the serve deploy whether
SGLang needs ``--disable-custom-all-reduce``. The facts are read inside the operation,
so at execute time it sees the nvidia-smi the driver role has just installed.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import FileContents
from pyinfra.operations import files

from gpuserve.host import defaults as host_defaults
from gpuserve.host import nccl_env
from gpuserve.measure.gate_runs import MEASURED_JSON, read_measured
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.prefetch import Read, fact_if_unchanged

DEFAULTS = host_defaults.NCCL


def _facts():
    from gpuserve.facts import gpu
    from gpuserve.facts import host as host_facts

    return gpu, host_facts


def reads() -> list[Read]:
    """Everything this role reads, for the deploy's prefetch (roles/base/prefetch.py)."""
    gpu, host_facts = _facts()
    return [Read.of(host_facts.Virtualization), Read.of(gpu.NvidiaGpus),
            Read.of(FileContents, path=MEASURED_JSON),
            *(Read.of(gpu.NvidiaP2P, mode=mode) for mode in ("r", "w")),
            *(managed.read(p) for p in (CONFIG_DIR, nccl_env.NCCL_ENV_PATH,
                                        nccl_env.HOST_JSON_PATH))]


CONFIG_DIR = posixpath.dirname(nccl_env.NCCL_ENV_PATH)


_UNREAD = object()


def measured_choice() -> dict | None:
    """The measuring stage's last choice (roles/gpu_gates writes measured.json), which
    outranks the driver's verdict; None before any measurement."""
    lines = fact_if_unchanged(FileContents, path=MEASURED_JSON)
    doc = read_measured("\n".join(lines or []))
    return None if doc is None else doc.get("choice")


def current_plan(overrides: dict[str, str], measured: object = _UNREAD) -> nccl_env.NcclPlan:
    """The plan from the facts as they are at execute time: after the driver role
    installed nvidia-smi (prefetched values only when the deploy changes nothing).
    ``measured``: the measuring stage's choice (default: read from measured.json)."""
    if measured is _UNREAD:
        measured = measured_choice()
    gpu, host_facts = _facts()
    virtualization = fact_if_unchanged(host_facts.Virtualization)
    verdict = nccl_env.combined_verdict(
        *(fact_if_unchanged(gpu.NvidiaP2P, mode=mode) for mode in ("r", "w"))
    )
    gpus = fact_if_unchanged(gpu.NvidiaGpus) or []
    plan = nccl_env.plan_nccl(virtualization, verdict, overrides, len(gpus) or None,
                              measured=measured if isinstance(measured, dict) else None)
    from gpuserve.roles import rdma  # its record joins host.json (roles/rdma)

    plan.rdma = rdma.chosen_record()
    return plan


def planned_files(overrides: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """(path, text) of nccl.env and host.json from the facts as they are now."""
    plan = current_plan(overrides)
    return ((nccl_env.NCCL_ENV_PATH, nccl_env.render_env_file(plan)),
            (nccl_env.HOST_JSON_PATH, nccl_env.host_json(plan)))


@operation()
def nccl_files(overrides: dict[str, str]):
    # Ensure the directory only: its owner and mode belong to the serve deploy
    # (roles/service: 0750 root:<service group>, it holds the secrets), so the host
    # deploy must not loosen them back (and the two deploys must not undo each other).
    changed = False
    if fact_if_unchanged(managed.PathState, path=CONFIG_DIR).kind != "dir":
        changed = True
        yield from files.directory._inner(path=CONFIG_DIR)
    changed |= yield from managed.write_changed(planned_files(overrides))
    if not changed:
        host.noop("NCCL env and host.json are up to date")


@deploy("NCCL environment")
def configure_nccl(overrides: dict[str, str] | None = None):
    if planned.collecting():  # decided when executing: noted for the dry run's preview
        for path, text in planned_files(overrides or {}):
            if not managed.matches(managed.state(path), "file", "root", "root", "644",
                                   managed.sha1(text)):
                planned.file(path, text)
    nccl_files(name="NCCL env and host.json from the P2P verdict", overrides=overrides or {})
