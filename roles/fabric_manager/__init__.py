"""NVIDIA Fabric Manager on NVSwitch hosts: installed with the driver, running before CUDA.

decide: the evidence (gpuserve/host/fabric.py: NVSwitch PCI functions,
/proc/driver/nvidia-nvswitch, nvidia-smi's Fabric blocks and topology) and host data
``fabric_manager``. install: in the driver's own apt transaction, at exactly its version,
held with it (roles/nvidia_driver and its userspace path call :func:`specs`). activate:
the service enabled and (re)started, then a bounded wait until every GPU's fabric
registration is Completed/Success, failing with the state it saw. Why: docs/nvswitch.md.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.facts.server import Command

from gpuserve.host import defaults as host_defaults
from gpuserve.host import fabric, passthrough
from gpuserve.host.unit_state import LiveUnit
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.prefetch import Read, fact

DEFAULTS = host_defaults.FABRIC_MANAGER
WAIT_SCRIPT = "fabric_wait.py"


def _gpu_facts():
    from gpuserve.facts import gpu as gpu_facts

    return gpu_facts


def reads() -> list[Read]:
    """The evidence, read in the deploy's first batch (the sysfs PCI listing is the driver
    role's read already), with the state of R580+'s packages and unit, so that a rerun on
    an NVSwitch host needs no read of its own."""
    from gpuserve.roles.nvidia_driver import DebVersion

    g = _gpu_facts()
    names = fabric.fabric_plan(int(fabric.fm_data()["unbranched_since"])).versioned
    return [Read.of(g.NvidiaTopology), Read.of(g.NvidiaFabric), Read.of(g.NvswitchDevices),
            *(Read.of(DebVersion, package=p) for p in names),
            managed.read_unit(str(fabric.fm_data()["service"]))]


def evidence() -> fabric.Evidence:
    topology = fact(_gpu_facts().NvidiaTopology) or {}
    pci = passthrough.parse_sysfs_pci(fact(Command, command=passthrough.SYSFS_PCI_COMMAND)
                                      or "")
    return fabric.detect(links=topology.get("links"), fabric=fact(_gpu_facts().NvidiaFabric),
                         pci=pci, proc_devices=fact(_gpu_facts().NvswitchDevices))


def decide(settings: fabric.FabricSettings, branch: int) -> fabric.FabricPlan | None:
    """The Fabric Manager packages for this host, or None (saying why either way)."""
    found = evidence()
    why = "; ".join(found.reasons) or "no NVSwitch evidence"
    if not fabric.needed(settings, found):
        if settings.mode == "off" and found.nvswitch:
            logger.warning(f"{host.name}: fabric_manager=off on a host with NVSwitches ({why}):"
                           " CUDA fails with error 802 until Fabric Manager runs")
        else:
            logger.info(f"{host.name}: no Fabric Manager ({why})")
        return None
    gpus = fact(_gpu_facts().NvidiaGpus) or []
    plan = fabric.fabric_plan(branch, fabric.nvlink5(g.get("compute_cap") for g in gpus))
    because = why if settings.mode == "auto" else "host data fabric_manager=on"
    logger.info(f"{host.name}: NVSwitch host ({because}): Fabric Manager "
                f"{', '.join(plan.versioned)} at the driver's version, in the driver's apt "
                "transaction")
    return plan


def path_reads(plan: fabric.FabricPlan | None) -> list[Read]:
    if plan is None:
        return []
    from gpuserve.roles.nvidia_driver import DebVersion

    return [*(Read.of(DebVersion, package=p) for p in plan.versioned),
            managed.read_unit(plan.service)]


def stale(plan: fabric.FabricPlan | None, deb_version: str) -> bool:
    """Whether a Fabric Manager package is missing or at another version."""
    from gpuserve.roles.nvidia_driver import DebVersion

    return plan is not None and any(
        fact(DebVersion, package=p) != deb_version for p in plan.versioned)


def service_steps(live: LiveUnit, changed: bool) -> list[str]:
    """Restart after a package change (the old daemon is the old version), start when
    not running, enable when not enabled."""
    steps = ["daemon-reload"] if changed or live.need_reload else []
    if changed and live.active in ("active", "activating"):
        steps.append("restart")
    elif live.active != "active":
        steps += ["reset-failed", "start"] if live.active == "failed" else ["start"]
    if live.enabled != "enabled":
        steps.append("enable")
    return steps


@operation()
def wait_for_fabric(timeout: int):
    """Bounded wait on the host until every GPU's fabric registration is done."""
    script = (SCRIPTS_DIR / WAIT_SCRIPT).read_text(encoding="utf-8")
    marker = "GPUSERVE_FABRIC_WAIT_EOF"
    assert marker not in script
    yield (f"python3 - --timeout {int(timeout)} <<'{marker}'\n{script}\n{marker}")


def activate(plan: fabric.FabricPlan | None, changed: bool, timeout: int) -> None:
    """Enable and start Fabric Manager, then wait for the fabric (before any CUDA use)."""
    if plan is None:
        return
    steps = service_steps(managed.unit_state(plan.service), changed)
    if steps:
        managed.systemctl(name=f"{plan.service}: {', '.join(steps)}", unit=plan.service,
                          steps=tuple(steps))
    verdict = fabric.judge(fact(_gpu_facts().NvidiaFabric) or [])
    if steps or verdict.state != fabric.FabricState.READY:
        planned.action(f"wait for every GPU's fabric registration (up to {timeout} s; a "
                       "read)", changes=False)
        wait_for_fabric(name=f"Wait for NVLink fabric registration (up to {timeout} s)",
                        timeout=timeout)
