"""NCCL environment file from the measured P2P verdict (decisions in gpuserve.host.nccl_env).

Writes /etc/gpuserve/nccl.env (systemd EnvironmentFile syntax, each value commented
with its reason) and /etc/gpuserve/host.json, which tells the serve deploy whether
SGLang needs ``--disable-custom-all-reduce``. The facts are read inside the operation,
so at execute time it sees the nvidia-smi the driver role has just installed.
"""

from __future__ import annotations

import posixpath
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from gpuserve.host import nccl_env

DEFAULTS = {
    # Overrides of the derived NCCL env, e.g. {"NCCL_DEBUG": "INFO"}; "" removes a key
    # (e.g. {"NCCL_P2P_DISABLE": ""} to keep P2P on in a VM with a P2P clique).
    "nccl_env": {},
}


def _facts():
    from gpuserve.facts import gpu
    from gpuserve.facts import host as host_facts

    return gpu, host_facts


def current_plan(overrides: dict[str, str]) -> nccl_env.NcclPlan:
    gpu, host_facts = _facts()
    virtualization = host.get_fact(host_facts.Virtualization)
    verdict = nccl_env.combined_verdict(
        *(host.get_fact(gpu.NvidiaP2P, mode=mode) for mode in ("r", "w"))
    )
    gpus = host.get_fact(gpu.NvidiaGpus) or []
    return nccl_env.plan_nccl(virtualization, verdict, overrides, len(gpus) or None)


@operation()
def nccl_files(overrides: dict[str, str]):
    plan = current_plan(overrides)
    # Ensure the directory only: its owner and mode belong to the serve deploy
    # (roles/service: 0750 root:<service group>, it holds the secrets), so the host
    # deploy must not loosen them back (and the two deploys must not undo each other).
    yield from files.directory._inner(path=posixpath.dirname(nccl_env.NCCL_ENV_PATH))
    yield from files.put._inner(
        src=StringIO(nccl_env.render_env_file(plan)), dest=nccl_env.NCCL_ENV_PATH, mode="644"
    )
    yield from files.put._inner(
        src=StringIO(nccl_env.host_json(plan)), dest=nccl_env.HOST_JSON_PATH, mode="644"
    )


@deploy("NCCL environment")
def configure_nccl(overrides: dict[str, str] | None = None):
    nccl_files(name="NCCL env and host.json from the P2P verdict", overrides=overrides or {})
