"""Put the SGLang hosts of an inventory group behind SGLang's gateway (smg).

    pyinfra -y inventory/gpu.py deploy/router.py --dry
    pyinfra -y inventory/gpu.py deploy/router.py

Acts on the hosts whose data sets ``router_workers_group`` (the router hosts); every
other host of the inventory is left alone. Order: (1) validate the router host's data
and every host of its workers group (gpuserve/fleet/router_plan.py: addresses, ports, keys,
profiles; ``InputError`` naming the inventory file and field, before any change; the
same code ``gpuserve check`` runs), choose the smg lock for the host's Python and glibc,
(2) the service account and smg's hash-checked, verified venv, (3) the manifest, the
root-only API key, the launcher and the hardened unit; the unit is restarted only when
the unit, the key or the launcher changed, never for the worker list (smg rereads its
manifest), (4) wait for ``/liveness`` and for the workers to be ready (a worker still
loading is a warning: smg keeps retrying it).

Host data keys and defaults: ``gpuserve/fleet/router_plan.DEFAULTS``. Workers are served by
deploy/serve.py; this deploy does not touch them.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger

from gpuserve.errors import InputError
from gpuserve.facts.host import InstallTarget
from gpuserve.fleet.router_plan import DEFAULTS, is_router_host, plan_router
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.roles import router as router_role
from gpuserve.roles.inventory import group_members, inventory_source, run_deploy
from gpuserve.roles.prefetch import fact, prefetch


def main() -> None:
    data = host.data.dict()
    if not is_router_host(data):
        if not any(is_router_host(h.data.dict()) for h in inventory):
            raise InputError(inventory_source(), "router_workers_group",
                             "no host of this inventory sets it: name, on the router host, "
                             "the inventory group whose hosts serve SGLang behind the gateway")
        logger.info(f"{host.name}: not a router host (no router_workers_group); skipped")
        return
    home = data.get("router_home", DEFAULTS["router_home"])
    user = data.get("router_user", DEFAULTS["router_user"])
    # the plan validates both before anything is read with them
    plan_router(data, inventory_source(), host_name=host.name, group_members=group_members)
    prefetch(router_role.plan_reads(home, user))
    target = fact(InstallTarget, path=home)
    if not target["python"]:
        raise PreflightError(f"{host.name}: no python3 on the host (smg's venv needs one); "
                             "nothing on the host was changed")
    plan = plan_router(data, inventory_source(), host_name=host.name,
                       group_members=group_members, python=target["python"],
                       glibc=target["glibc"])
    for line in plan.warnings:
        logger.warning(f"{host.name}: {line}")
    prefetch(router_role.reads(plan))
    router_role.install_router(plan=plan)
    router_role.configure_router(plan=plan)
    router_role.check_router(name=f"gateway answers on port {plan.port}, workers ready",
                             plan=plan)


run_deploy(main)
