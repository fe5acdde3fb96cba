"""What the remove deploy takes off a host, decided at prepare time from host data alone.

Pure: ``plan_removal`` lists the units to stop and disable and the paths to delete, each
with what it is; roles/remove reads which of them exist and removes only those, so a
rerun changes nothing. Removed: the server's and the gateway's units, env files,
configs and secrets, their venvs, locks and host scripts, the last good copies. Kept:
the records (the controller's results, the host deploy's ``/etc/gpuserve/host.json``,
``nccl.env`` and ``measured.json``, the benchmark runs under ``<sglang_home>/bench``),
the service accounts, the weights (the models directory and the service's Hub
cache) unless host data ``remove_weights`` is true, and the JIT caches unless
``remove_caches`` is true. Only fixed names under the homes
are deleted, never a home itself (a home of ``/opt`` must not take ``/opt`` with it).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.plans import router as router_plan
from gpuserve.serve import install, service, weights
from gpuserve.serve.jit_cache import jit_dir
from gpuserve.serve.running import RUNNING_PATH
from gpuserve.settings import settings

DEFAULTS = {
    # the remove deploy (deploy/remove.py) deletes the weights too: the models directory
    # (models_dir) and the service's Hub cache (<sglang_home>/cache); records are kept
    # either way
    # accepts: bool
    "remove_weights": False,
    # the remove deploy deletes the JIT and autotune caches too (<sglang_home>/cache/jit:
    # FlashInfer, Triton, DeepGEMM, torch inductor; docs/startup.md); kept by default, so
    # the next serve deploy starts without recompiling
    # accepts: bool
    "remove_caches": False,
}

#: The last good copies the rollback keeps (roles/service/rollback.py LAST_GOOD_DIR).
LAST_GOOD_DIR = f"{service.CONFIG_DIR}/last-good"
#: The serve and gateway deploys' default homes (their registries' values, which a unit
#: test holds these to; named here so that the reference lists only the keys this
#: deploy reads, not every key of those registries).
SGLANG_HOME = "/opt/gpuserve"
ROUTER_HOME = "/opt/gpuserve-router"


@dataclass(frozen=True)
class Target:
    path: str
    what: str


@dataclass(frozen=True)
class RemovalPlan:
    units: tuple[tuple[str, str], ...]  # (unit name, its file)
    files: tuple[Target, ...]
    directories: tuple[Target, ...]
    kept: tuple[str, ...]  # what stays, said in the deploy's output


def _flag(data: dict, key: str, source: str) -> bool:
    value = settings(data, DEFAULTS).get(key)
    if not isinstance(value, bool):
        raise InputError(source, key, f"must be true or false, got {value!r:.40}")
    return value


def plan_removal(host_data: dict, source: str) -> RemovalPlan:
    """The units, files and directories to remove; ``InputError`` for bad host data
    before any host is read."""
    home = install.validate_home(host_data.get("sglang_home", SGLANG_HOME), source)
    try:
        router_home = install.validate_home(host_data.get("router_home", ROUTER_HOME), source)
    except InputError as exc:  # the same rule, under its own key
        raise InputError(source, "router_home", exc.message) from None
    with_weights = _flag(host_data, "remove_weights", source)
    with_caches = _flag(host_data, "remove_caches", source)
    models = weights.models_dir_of(host_data, source, home)
    files = [
        Target(service.UNIT_PATH, "the SGLang unit"),
        Target(service.ENV_PATH, "the SGLang env file (profile env, arguments, HF_TOKEN)"),
        Target(service.CONFIG_PATH, "the SGLang secrets config (API key)"),
        Target(f"{install.state_dir(home)}/hf-token", "the weights step's Hub token"),
        Target(router_plan.UNIT_PATH, "the gateway unit"),
        Target(RUNNING_PATH, "the record of the profile the host runs"),
    ]
    dirs = [
        Target(LAST_GOOD_DIR, "the last good unit, env and config copies"),
        Target(f"{home}/venvs", "the SGLang venvs"),
        Target(f"{home}/locks", "the SGLang lock requirements"),
        Target(f"{home}/tools", "the pinned uv that builds the venvs"),
        Target(install.bin_dir(home), "the host scripts (redactor, checks)"),
        Target(router_plan.CONFIG_DIR, "the gateway's manifest and API key"),
        *(Target(f"{router_home}/{name}", f"the gateway's {what}") for name, what in (
            ("venvs", "venvs"), ("locks", "lock requirements"), ("tools", "pinned uv"),
            ("bin", "host scripts"),
            ("cache", "state directory"))),
    ]
    kept = ["records (controller results, /etc/gpuserve/host.json, nccl.env, "
            f"measured.json, {home}/bench)", "the service accounts"]
    caches = jit_dir(install.state_dir(home))
    if with_caches and not with_weights:  # the Hub cache's removal takes them with it
        dirs.append(Target(caches, "the JIT and autotune caches (remove_caches)"))
    elif not with_caches and not with_weights:
        kept.append(f"the JIT and autotune caches ({caches}; remove_caches=true removes "
                    "them)")
    if with_weights:
        dirs += [Target(models, "the model weights (remove_weights)"),
                 Target(install.state_dir(home), "the service's Hub cache and, inside it, the JIT "
                        "caches (remove_weights)")]
    else:
        kept.append(f"the weights ({models}, {install.state_dir(home)}; "
                    "remove_weights=true removes them)")
    units = ((service.UNIT_NAME, service.UNIT_PATH),
             (router_plan.UNIT_NAME, router_plan.UNIT_PATH))
    return RemovalPlan(units, tuple(files), tuple(dirs), tuple(kept))
