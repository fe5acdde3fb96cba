"""The serve deploy: a launch profile served with SGLang on the host, and proved.

What it does, in order, and how switching profiles, rollback, reruns and secrets work:
docs/deploys.md. Called by deploy/serve.py, or by a pyinfra project's own deploy file.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.files import FileContents

import gpuserve.roles.checks.bench as bench_role
import gpuserve.roles.interpreter as interpreter_role
import gpuserve.roles.service as service_role
import gpuserve.roles.service.rollback as rollback_role
import gpuserve.roles.service.running as running_role
import gpuserve.roles.sglang as sglang_role
import gpuserve.roles.weights as weights_role
from gpuserve.facts.document import HostFactsDocument, host_facts_document
from gpuserve.facts.host import InstallTarget, ModelCheckpoint, WeightsState
from gpuserve.host.nccl_env import HOST_JSON_PATH
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.launch.locks import Lock
from gpuserve.measure.health import health_generates
from gpuserve.memory.remote import read_remote
from gpuserve.monitor.live_judge import live_settings
from gpuserve.roles import checks as checks_role
from gpuserve.roles.checks import check_service, install_check_scripts, serving_probe_read
from gpuserve.roles.checks.quality import print_quality_preview, quality_request
from gpuserve.roles.inventory import group_members, inventory_source, packaged_deploy
from gpuserve.roles.prefetch import Read, fact, prefetch, reader
from gpuserve.roles.preview import print_serve_preview
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
from gpuserve.roles.run_context import run_context
from gpuserve.roles.service import UNIT_NAME, UNIT_PATH, configure_service, planned_steps
from gpuserve.roles.service.rollback import RollbackSpec, keep_last_good
from gpuserve.roles.sglang import install_sglang, prune_venvs
from gpuserve.serve.install import state_dir
from gpuserve.serve.plan import ServePlan, plan_serve, read_input

# the unit files whose venv a prune keeps: the live one and the last good one
UNIT_PATHS = (UNIT_PATH, RollbackSpec(profile_name="").saved("unit"))


def host_reads(home: str, user: str, checkpoint: str | None,
               weights: tuple[str, str] | None = None) -> list[Read]:
    """What the plan reads from the host before any change (one prefetch), the
    checkpoint scan of the profile's model directory included (and, for a profile
    pinned to a Hub commit, the state of the revision's directory: ``weights``)."""
    hf = ([Read.of(WeightsState, target=weights[0], ref="", models_dir=weights[1])]
          if weights else [])
    return [Read.of(InstallTarget, path=home), Read.of(FileContents, path=HOST_JSON_PATH),
            Read.of(HostFactsDocument, sglang_python=""), *sglang_role.account_reads(user),
            *([Read.of(ModelCheckpoint, path=checkpoint)] if checkpoint else []), *hf]


def role_reads(user: str, home: str, locks: list[Lock], serving: Read | None = None
               ) -> list[Read]:
    """What the roles below read once the plan exists, as far as it is known before:
    paths under ``sglang_home``, the service's state, the venv of every lock the plan
    may choose (``locks``) and, given ``serving``, the health gate's first probe with
    its smoke completion. Read in the first batch, so that a rerun with nothing to do
    needs no second one (nor a probe of its own); the second prefetch reads only what
    this missed, the probe never (the gate probes when it must)."""
    bin_dir = sglang_role.bin_dir(home)
    return [*(read for lock in locks for read in sglang_role.reads(
                user, home, lock, interpreter_role.candidate_paths(home, lock.python))),
            *interpreter_role.package_reads(sorted({lk.python for lk in locks})),
            *interpreter_role.stamp_reads(home, sorted({lk.python for lk in locks})),
            *service_role.reads(bin_dir), *checks_role.reads(bin_dir),
            *bench_role.reads(home), *rollback_role.reads(RollbackSpec(profile_name="")),
            *sglang_role.prune_reads(home, UNIT_PATHS), *([serving] if serving else []),
            *running_role.reads()]


def host_runtime(home: str, locks: list[Lock]) -> HostRuntime:
    """The facts the lock choice and the preflight need, read before any change.

    GPUs, driver and CUDA toolkit come from the doctor's host-facts document, which runs
    the same commands through the same parsers as the NvidiaGpus, NvidiaDriver and
    CudaToolkit facts: reading them again cost a rerun three more tool runs."""
    target = fact(InstallTarget, path=home)
    interpreter = (interpreter_role.choose_on_host({lk.python for lk in locks}, home)
                   if locks else None)
    document = fact(HostFactsDocument, sglang_python="")
    gpus = document["gpus"] or []
    driver = next((g["driver_version"] for g in gpus if g.get("driver_version")), None)
    if driver is None:
        driver = document["driver"]["version"]
    python = interpreter.version if interpreter else target["python"]
    return HostRuntime(name=host.name, python=python, glibc=target["glibc"],
                       driver=driver, cuda_toolkit=document["cuda"]["toolkit"],
                       free_bytes=target["free_bytes"], gpus=len(gpus),
                       gpu_list=tuple(dict(g) for g in gpus), interpreter=interpreter)


@packaged_deploy
def serve_sglang() -> None:
    """Serve host data's ``profile`` with SGLang on this host and prove it (health gate,
    smoke completion, throughput checks), keeping a last good configuration to roll
    back to. Reads ``host.data``: ``profile`` (required; a name in ``profiles/`` or a
    path) and the keys of ``gpuserve.roles.sglang.DEFAULTS``,
    ``gpuserve.roles.service.DEFAULTS`` and ``gpuserve.roles.checks.DEFAULTS``.
    Bad input stops the host before any operation, naming file and field."""
    plan = plan_and_read()
    rollback = RollbackSpec(profile_name=plan.service.profile_name, unit=UNIT_NAME)
    prefetch([*role_reads(plan.user, plan.home, [plan.lock]),  # nothing, unless missed
              *interpreter_role.reads(plan.interpreter)])
    running_role.note_switch(plan.service.profile_name)  # before any change, in words
    run = run_context()
    if run.dry:  # what the real run would change (roles/preview.py); pyinfra stops after
        print_serve_preview(plan, with_diff=run.diff)
        print_quality_preview(plan)
    serve(plan, rollback)


def plan_and_read() -> ServePlan:
    """The first batch of reads and the plan (``gpuserve/serve/plan.py``).

    Reads run as one batched command (roles/prefetch.py): what the plan needs, and what
    every role below reads, for every lock the plan may choose; a second batch, once the
    plan names the lock and paths, reads only what the first could not know."""
    data, source = host.data.dict(), inventory_source()
    inputs = read_input(data, source, host.name, group_members)  # the one profile load
    home, user = inputs.settings.home, inputs.settings.user
    locks = inputs.candidate_locks
    prefetch([*host_reads(home, user, inputs.checkpoint_path, inputs.weights_target),
              *([interpreter_role.choice_read({lk.python for lk in locks})] if locks else []),
              *role_reads(user, home, locks, serving_probe_read(inputs, host.name))])
    plan = plan_serve(
        data,
        source,
        host_runtime=lambda home: host_runtime(home, locks),
        host_record=lambda: fact(FileContents, path=HOST_JSON_PATH),
        checkpoint=lambda path: fact(ModelCheckpoint, path=path),
        host_facts=lambda: host_facts_document(reader()),
        host_name=host.name,
        group_members=group_members,
        weights_state=lambda target, ref, models_dir: fact(
            WeightsState, target=target, ref=ref, models_dir=models_dir),
        remote=read_remote,
        inputs=inputs,
    )
    mine = run_context().host(host.name)
    mine.serve_input, mine.serve_plan = inputs, plan
    for line in plan.preflight.info:
        logger.info(f"{host.name}: {line}")
    for line in plan.preflight.warnings:
        logger.warning(f"{host.name}: {line}")
    note, warn = plan.transport
    if note:
        (logger.warning if warn else logger.info)(f"{host.name}: {note}")
    return plan


def serve(plan: ServePlan, rollback: RollbackSpec) -> None:
    """The operations: install, configure (behind SGLang's gateway a restart is a
    rolling switch: roles/router/rolling.py), check, keep the last good one, prune."""
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
        take_out(name=f"take {rollout.url} out of the gateway on {rollout.router}, wait "
                      "until it is dropped and idle", rollout=rollout, switching=switching,
                 bin_dir=plan.bin_dir, port=plan.service.port, config=plan.config_path)

    install_sglang(user=plan.user, home=plan.home, lock=plan.lock,
                   index_url=plan.index_url, find_links=plan.find_links,
                   expect_gpus=plan.expect_gpus, interpreter=plan.interpreter)
    install_check_scripts(bin_dir=plan.bin_dir)
    if plan.weights is not None:  # before the service: the unit points at the revision
        weights_role.fetch_weights(plan=plan.weights, bin_dir=plan.bin_dir,
                                   python=f"{plan.venv}/bin/python",
                                   token=lambda: host.data.get("hf_token"),
                                   token_file=f"{state_dir(plan.home)}/hf-token")
    # decided before the service's operations exist, from the batch's read
    service_changed = bool(planned_steps(plan.service))
    configure_service(plan=plan.service, before_restart=take_out_first)
    check_service(unit=UNIT_NAME, port=plan.service.port, served_name=plan.service.served_name,
                  profile_name=plan.service.profile_name, bin_dir=plan.bin_dir,
                  health_timeout=plan.health_timeout, config_path=plan.config_path,
                  record=plan.record, rollback=rollback, bench=plan.bench,
                  serves_http=plan.node is None or plan.node.is_head,
                  smoke_per_start=health_generates(dict(plan.service.environment)),
                  start=plan.start, quality=quality_request(plan))
    if switching.rollout is not None:
        put_back(name=f"put {switching.rollout.url} back into the gateway on {router}, "
                      "wait until it is ready", rollout=switching.rollout, switching=switching)
        watch_live_traffic(plan, rollback, switching)
    keep_last_good(name="keep this configuration as the last good one (root-only copies)",
                   spec=rollback, service_changed=service_changed)
    running_role.record_running(name=f"record what {host.name} runs ({running_role.RUNNING_PATH})",
                                profile=plan.service.profile_name,
                                launch=running_role.launch_of(plan))
    prune_venvs(name=f"prune venvs beyond keep_venvs={plan.keep_venvs}", home=plan.home,
                keep=plan.keep_venvs, unit_paths=UNIT_PATHS)


def watch_live_traffic(plan: ServePlan, rollback: RollbackSpec, switching: Switching) -> None:
    """A switched worker under the gateway's real traffic against the workers not
    switched yet (roles/router/live.py); host data ``rolling_live_window`` 0: not at all.
    Its settings are checked here, before any change."""
    settings = live_settings(host.data.dict(), inventory_source())
    if settings is None or switching.rollout is None:
        return
    judge_live(name=f"judge {switching.rollout.url} by live traffic for "
                    f"{settings.window_s} s against the workers not switched yet",
               rollout=switching.rollout, switching=switching, settings=settings,
               bin_dir=plan.bin_dir, port=plan.service.port, config=plan.config_path,
               rollback=rollback, health_timeout=plan.health_timeout)
