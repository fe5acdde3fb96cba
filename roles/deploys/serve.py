"""The serve deploy: a launch profile served with SGLang on the host, and proved.

What it does, in order, and how switching profiles, rollback, reruns and secrets work:
docs/deploys.md. Called by deploy/serve.py, or by a pyinfra project's own deploy file.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.files import FileContents

import gpuserve.roles.base.interpreter as interpreter_role
import gpuserve.roles.checks.bench as bench_role
import gpuserve.roles.service as service_role
import gpuserve.roles.service.rollback as rollback_role
import gpuserve.roles.service.running as running_role
import gpuserve.roles.sglang as sglang_role
import gpuserve.roles.weights as weights_role
from gpuserve.facts.document import HostFactsDocument, host_facts_document
from gpuserve.facts.host import InstallTarget, ModelCheckpoint, WeightsState
from gpuserve.host.nccl_env import HOST_JSON_PATH
from gpuserve.launch.interpreter import facts_from
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.launch.locks import Lock
from gpuserve.launch.venvs import parse_listing, referenced_venvs, venvs_to_prune
from gpuserve.memory.remote import read_remote
from gpuserve.monitor.live_judge import LiveSettings, live_settings
from gpuserve.plans.serve import (
    FirstReads,
    HostReads,
    ServePlan,
    first_reads,
    plan_serve,
    read_input,
)
from gpuserve.preview import gib
from gpuserve.roles.base import planned
from gpuserve.roles.base.inventory import group_members, inventory_source, packaged_deploy
from gpuserve.roles.base.prefetch import Read, fact, prefetch, reader
from gpuserve.roles.base.preview import print_planned_preview
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.checks import check_service
from gpuserve.roles.checks import scripts as check_scripts
from gpuserve.roles.checks.probe import serving_probe_read
from gpuserve.roles.checks.quality import print_quality_preview
from gpuserve.roles.checks.scripts import install_check_scripts
from gpuserve.roles.router.live import judge_live
from gpuserve.roles.router.rolling import (
    Switching,
    gateway_of,
    plan_rollout,
    put_back,
    register_restart,
    rollout_guard,
    take_out,
)
from gpuserve.roles.service import configure_service
from gpuserve.roles.service.rollback import RollbackSpec, keep_last_good
from gpuserve.roles.sglang import PruneState, VenvVerified, install_sglang, prune_venvs
from gpuserve.serve.install import state_dir
from gpuserve.serve.service import CONFIG_PATH, ENV_PATH, UNIT_NAME, UNIT_PATH

# the unit files whose venv a prune keeps: the live one and the last good one
UNIT_PATHS = (UNIT_PATH, RollbackSpec(profile_name="").saved("unit"))


def first_batch(first: FirstReads, host_name: str) -> list[Read]:
    """What the plan and every role below read, as far as the input tells before any
    host read (gpuserve/plans/serve.first_reads), for every lock the plan may choose: one
    command, so that a rerun with nothing to do needs no second batch (nor a probe of its
    own: the health gate's first probe with its smoke completion is in it); the second
    batch reads only what this missed, the probe never (the gate probes when it must)."""
    home, user, locks = first.home, first.user, first.locks
    hf = ([Read.of(WeightsState, target=first.weights[0], ref="", models_dir=first.weights[1])]
          if first.weights else [])
    probe = serving_probe_read(first, host_name)
    return [Read.of(InstallTarget, path=home), Read.of(FileContents, path=HOST_JSON_PATH),
            Read.of(HostFactsDocument, sglang_python=""), *sglang_role.account_reads(user),
            *([Read.of(ModelCheckpoint, path=first.checkpoint)] if first.checkpoint else []),
            *hf, *([interpreter_role.choice_read(first.pythons, first.explicit_python)]
                   if locks else []),
            *role_reads(first),
            *([probe] if probe else [])]


def role_reads(first: FirstReads, locks: tuple[Lock, ...] | None = None) -> list[Read]:
    """What the roles below read once the plan exists: paths under ``sglang_home``, the
    service's state, the venv of every lock in ``locks`` (the candidates by default)."""
    home, user = first.home, first.user
    bin_dir = sglang_role.bin_dir(home)
    return [*(read for lock in (first.locks if locks is None else locks)
              for read in sglang_role.reads(user, home, lock, interpreter_role.candidate_paths(
                  home, lock.python, first.explicit_python, first.builds))),
            *interpreter_role.package_reads(list(first.pythons)),
            *interpreter_role.stamp_reads(home, first.builds),
            *service_role.reads(bin_dir), *check_scripts.reads(bin_dir),
            *bench_role.reads(home), *rollback_role.reads(RollbackSpec(profile_name="")),
            *sglang_role.prune_reads(home, UNIT_PATHS), *running_role.reads()]


def host_runtime(home: str) -> HostRuntime:
    """The facts the lock choice and the preflight need, read before any change (the
    interpreter is chosen by the plan, from :func:`host_reads`' interpreter facts).

    GPUs, driver and CUDA toolkit come from the doctor's host-facts document, which runs
    the same commands through the same parsers as the NvidiaGpus, NvidiaDriver and
    CudaToolkit facts: reading them again cost a rerun three more tool runs."""
    target = fact(InstallTarget, path=home)
    document = fact(HostFactsDocument, sglang_python="")
    gpus = document["gpus"] or []
    driver = next((g["driver_version"] for g in gpus if g.get("driver_version")), None)
    if driver is None:
        driver = document["driver"]["version"]
    return HostRuntime(name=host.name, python=target["python"], glibc=target["glibc"],
                       driver=driver, cuda_toolkit=document["cuda"]["toolkit"],
                       free_bytes=target["free_bytes"], gpus=len(gpus),
                       gpu_list=tuple(dict(g) for g in gpus))


def host_reads(first: FirstReads) -> HostReads:
    """The plan's reads of this host (from the prefetch) and of the Hub."""
    read = interpreter_role.choice_read(first.pythons, first.explicit_python)
    return HostReads(
        runtime=host_runtime,
        interpreter=lambda: facts_from(fact(read.cls, **dict(read.kwargs))),
        host_record=lambda: fact(FileContents, path=HOST_JSON_PATH),
        checkpoint=lambda path: fact(ModelCheckpoint, path=path),
        host_facts=lambda: host_facts_document(reader()),
        weights_state=lambda target, ref, models_dir: fact(
            WeightsState, target=target, ref=ref, models_dir=models_dir),
        remote=read_remote)


@packaged_deploy
def serve_sglang() -> None:
    """Serve host data's ``profile`` with SGLang on this host and prove it (health gate,
    smoke completion, throughput checks), keeping a last good configuration to roll
    back to. Reads ``host.data``: ``profile`` (required; a name in ``profiles/`` or a
    path) and the keys of ``gpuserve.plans.serve.defaults()``. Bad input stops the host
    before any operation, naming file and field. Under ``--dry`` it prints what the run
    would change (roles/base/preview.py, from what the roles noted: roles/base/planned.py)."""
    # a rolling switch's live-traffic judge (None: off), checked before any host read
    live = live_settings(host.data.dict(), inventory_source())
    plan = plan_and_read()
    # what the first batch could not know (nothing, unless missed)
    prefetch([*role_reads(first_reads(plan.input), (plan.lock,)),
              *interpreter_role.reads(plan.interpreter)])
    running_role.note_switch(plan.service.profile_name)  # before any change, in words
    serve(plan, live)
    run = run_context()
    if run.dry:  # what the real run would change; pyinfra stops after
        print_planned_preview(with_diff=run.diff, secrets=list(plan.secrets),
                              preflight=[*([plan.pd.summary] if plan.pd else []),  # PD role
                                         *plan.preflight.info, *plan.preflight.warnings],
                              by_value=(ENV_PATH, CONFIG_PATH))
        print_quality_preview(plan)


def plan_and_read() -> ServePlan:
    """The input, the first batch of reads and the plan (``gpuserve/plans/serve.py``)."""
    inputs = read_input(host.data.dict(), inventory_source(), host.name, group_members)
    first = first_reads(inputs)
    prefetch(first_batch(first, host.name))
    plan = plan_serve(inputs, host_reads(first))
    mine = run_context().host(host.name)
    mine.serve_input, mine.serve_plan = inputs, plan
    for line in (*plan.notes, *plan.preflight.info):
        logger.info(f"{host.name}: {line}")
    for line in plan.preflight.warnings:
        logger.warning(f"{host.name}: {line}")
    note, warn = plan.transport
    if note:
        (logger.warning if warn else logger.info)(f"{host.name}: {note}")
    return plan


def serve(plan: ServePlan, live: LiveSettings | None = None) -> None:
    """The operations: install, configure (behind SGLang's gateway a restart is a
    rolling switch: roles/router/rolling.py), check, keep the last good one, prune."""
    rollback = RollbackSpec(profile_name=plan.service.profile_name, unit=UNIT_NAME)
    router = gateway_of(host.name, inventory_source())
    switching = Switching()
    if router is not None:
        rollout_guard(name=f"rolling switch behind the gateway on {router}: no earlier "
                           "worker failed", router=router, switching=switching)

    def take_out_first() -> None:
        rollout = plan_rollout(host.name, inventory_source()) if router else None
        if rollout is None:
            return
        register_restart(rollout, switching)
        planned.action(f"take {rollout.url} out of the gateway on {rollout.router}")
        take_out(name=f"take {rollout.url} out of the gateway on {rollout.router}, wait "
                      "until it is dropped and idle", rollout=rollout, switching=switching,
                 bin_dir=plan.bin_dir, port=plan.service.port, config=plan.config_path)

    install_sglang(user=plan.user, home=plan.home, lock=plan.lock,
                   index_url=plan.index_url, find_links=plan.find_links,
                   expect_gpus=plan.expect_gpus, interpreter=plan.interpreter,
                   trusted=plan.trusted_mirrors)
    install_check_scripts(bin_dir=plan.bin_dir)
    if plan.weights is not None:  # before the service: the unit points at the revision
        w = plan.weights
        if not w.complete:
            planned.action(f"fetch the weights into {w.target}",
                           would=f"fetch {w.repo_id}@{w.commit[:12]}: {w.files} files, "
                                 f"{gib(w.to_fetch)} of {gib(w.total_bytes)}, into {w.target}")
        weights_role.fetch_weights(plan=plan.weights, bin_dir=plan.bin_dir, python=plan.python,
                                   token=lambda: plan.input.service.hf_token,
                                   token_file=f"{state_dir(plan.home)}/hf-token")
    # decided before the service's operations exist, from the batch's read
    service_changed = bool(configure_service(plan=plan.service, before_restart=take_out_first))
    check_service(plan=plan, rollback=rollback)
    if switching.rollout is not None:
        planned.action(f"put {switching.rollout.url} back into the gateway on {router}")
        put_back(name=f"put {switching.rollout.url} back into the gateway on {router}, "
                      "wait until it is ready", rollout=switching.rollout, switching=switching)
        watch_live_traffic(plan, live, rollback, switching)
    if service_changed:
        planned.action("keep this configuration as the last good one")
    keep_last_good(name="keep this configuration as the last good one (root-only copies)",
                   spec=rollback, service_changed=service_changed)
    running_role.record_running(name=f"record what {host.name} runs ({running_role.RUNNING_PATH})",
                                profile=plan.service.profile_name,
                                launch=running_role.launch_of(plan))
    if planned.collecting() and prunes(plan):
        planned.action(f"prune venvs beyond keep_venvs={plan.keep_venvs} (those the units "
                       "name are kept)")
    prune_venvs(name=f"prune venvs beyond keep_venvs={plan.keep_venvs}", home=plan.home,
                keep=plan.keep_venvs, unit_paths=UNIT_PATHS)


def prunes(plan: ServePlan) -> bool:
    """Whether the prune may delete a venv, as far as the state before any change tells
    (the preview): one is beyond ``keep_venvs`` already, or the install adds one."""
    if fact(VenvVerified, venv=plan.venv) != plan.lock.hash:
        return True
    seen = fact(PruneState, home=plan.home, paths=UNIT_PATHS)
    return bool(venvs_to_prune(parse_listing(seen["listing"], plan.home),
                               referenced_venvs(seen["units"], plan.home), plan.keep_venvs))


def watch_live_traffic(plan: ServePlan, settings: LiveSettings | None, rollback: RollbackSpec,
                       switching: Switching) -> None:
    """A switched worker under the gateway's real traffic against the workers not
    switched yet (roles/router/live.py); host data ``rolling_live_window`` 0 (``settings``
    None): not at all."""
    if settings is None or switching.rollout is None:
        return
    what = (f"judge {switching.rollout.url} by live traffic for {settings.window_s} s "
            "against the workers not switched yet")
    planned.action(f"{what} (a read)", changes=False)
    judge_live(name=what, rollout=switching.rollout, switching=switching, settings=settings,
               bin_dir=plan.bin_dir, port=plan.service.port, config=plan.config_path,
               rollback=rollback, health_timeout=plan.health_timeout)
