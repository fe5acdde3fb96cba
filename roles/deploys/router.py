"""The gateway deploy: the SGLang hosts of an inventory group put behind SGLang's
gateway (smg). Its order of steps: docs/deploys.md. Called by deploy/router.py, or by a
pyinfra project's own deploy file.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger

from gpuserve.errors import InputError
from gpuserve.facts.host import InstallTarget
from gpuserve.launch.interpreter import GATEWAY
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.plans.router import is_router_host, plan_router
from gpuserve.roles import router as router_role
from gpuserve.roles.base import interpreter as interpreter_role
from gpuserve.roles.base import planned
from gpuserve.roles.base.inventory import group_members, inventory_source, packaged_deploy
from gpuserve.roles.base.prefetch import fact, prefetch
from gpuserve.roles.base.preview import print_planned_preview
from gpuserve.roles.base.run_context import run_context


@packaged_deploy
def sglang_gateway() -> None:
    """On a router host (host data ``router_workers_group`` names the inventory group
    of its workers): smg's locked venv, manifest, API key and unit, then its checks.
    Every other host is skipped with a line saying so; an inventory without a router
    host is refused. Keys and defaults: ``gpuserve.plans.router.DEFAULTS``. The
    workers are served by :func:`gpuserve.roles.deploys.serve_sglang`, not here. Under
    ``--dry`` it prints what the run would change (roles/base/preview.py)."""
    data = host.data.dict()
    if not is_router_host(data):
        if not any(is_router_host(h.data.dict()) for h in inventory):
            raise InputError(inventory_source(), "router_workers_group",
                             "no host of this inventory sets it: name, on the router host, "
                             "the inventory group whose hosts serve SGLang behind the gateway")
        logger.info(f"{host.name}: not a router host (no router_workers_group); skipped")
        return
    # validated before anything is read with them; the lock waits for the interpreter
    first = plan_router(data, inventory_source(), host_name=host.name,
                        group_members=group_members)
    home, user = first.home, first.user
    pythons = {lk.python for lk in first.locks}
    prefetch([*router_role.plan_reads(home, user),
              *interpreter_role.prepare_reads(home, pythons, first.python_wish)])
    target = fact(InstallTarget, path=home)
    if not target["python"]:  # the gateway's probe runs with it (roles/router)
        raise PreflightError(f"{host.name}: no python3 on the host (the gateway's probe "
                             "needs one); nothing on the host was changed")
    choice = interpreter_role.choose_on_host(pythons, home, first.python_wish, GATEWAY)
    plan = plan_router(data, inventory_source(), host_name=host.name,
                       group_members=group_members, python=choice.version,
                       glibc=target["glibc"], interpreter=choice)
    for line in plan.warnings:
        logger.warning(f"{host.name}: {line}")
    prefetch(router_role.reads(plan))
    router_role.install_router(plan=plan)
    router_role.configure_router(plan=plan)
    check = f"gateway answers on port {plan.port}, workers ready"
    planned.action(f"check: {check} (a read)", changes=False)
    router_role.check_router(name=check, plan=plan)
    run = run_context()
    if run.dry:  # what the real run would change (roles/base/preview.py); pyinfra stops after
        print_planned_preview(with_diff=run.diff, secrets=[plan.api_key])
