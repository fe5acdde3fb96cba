"""Kernel command line for GPU hosts and hypervisors: IOMMU parameters and the reboot.

configure: merge the IOMMU parameters (per CPU vendor, from gpuserve.host.boot) into the
boot loader's configuration (GRUB: /etc/default/grub + update-grub; systemd-boot as
managed by proxmox-boot-tool: /etc/kernel/cmdline + ``proxmox-boot-tool refresh``).
activate: reboot when the *running* kernel lacks the parameters and ``allow_reboot``
is set; otherwise say plainly that a reboot is pending.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.files import File, FileContents
from pyinfra.operations import files, server

from gpuserve.host import boot
from gpuserve.host import defaults as host_defaults
from gpuserve.roles.base import planned
from gpuserve.roles.base.prefetch import Read, fact, fact_if_unchanged

DEFAULTS = host_defaults.KERNEL


def _host_facts():
    # Imported late: the facts package is the only pyinfra-importing part of gpuserve.
    from gpuserve.facts import host as host_facts

    return host_facts


ACPI_TABLES = ("DMAR", "IVRS")
REBOOT_REQUIRED = "/run/reboot-required"


def reads() -> list[Read]:
    """Everything this role reads, for the deploy's prefetch (roles/base/prefetch.py)."""
    facts = _host_facts()
    return [*(Read.of(File, path=f"/sys/firmware/acpi/tables/{t}") for t in ACPI_TABLES),
            Read.of(facts.CpuVendor), Read.of(facts.BootLoader), Read.of(facts.KernelCmdline),
            Read.of(facts.NouveauLoaded), Read.of(File, path=REBOOT_REQUIRED),
            *(Read.of(FileContents, path=boot.boot_loader_config(name)[0])
              for name in (None, "systemd-boot"))]


def platform() -> tuple[str | None, set[str]]:
    """(CPU vendor, ACPI tables naming the IOMMU) of the current host, for the params."""
    tables = {name for name in ACPI_TABLES
              if fact(File, path=f"/sys/firmware/acpi/tables/{name}")}
    return fact(_host_facts().CpuVendor), tables


def _text(lines: list[str] | None) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def boot_config(params: list[str], boot_loader: str | None) -> tuple[str, str, str, str]:
    """(path, current text, merged text, regenerate command) of the boot loader's
    command line with ``params`` merged in."""
    path, apply = boot.boot_loader_config(boot_loader)
    current = _text(fact(FileContents, path=path))
    if path == "/etc/kernel/cmdline":
        if not current.strip():
            # Seed from the running command line so root=/boot= survive; drop what the
            # boot loader adds itself (BOOT_IMAGE=, initrd=).
            running = boot.raw_cmdline(fact(_host_facts().KernelCmdline))
            current = " ".join(
                t for t in running.split() if not t.startswith(("BOOT_IMAGE=", "initrd="))
            )
        return path, current, boot.edit_kernel_cmdline_file(current, params), apply
    return path, current, boot.edit_grub_default(current, params), apply


@operation()
def boot_cmdline(params: list[str], boot_loader: str | None):
    """Merge ``params`` into the boot loader's command line and regenerate its config.

    Idempotent: the file is rewritten (and update-grub / proxmox-boot-tool run) only
    when the merged text differs from what is there.
    """
    path, current, new, apply = boot_config(params, boot_loader)
    if new == current:
        host.noop(f"{path} already has {' '.join(params) or 'no extra parameters'}")
        return
    yield from files.put._inner(src=StringIO(new), dest=path, mode="644")
    yield StringCommand(apply)


def reboot_reasons(params: list[str], driver_package: str | None = None) -> list[str]:
    """Why this host needs a reboot now (read at execute time inside the op: after the
    other roles' changes, unless the deploy changes nothing; roles/base/prefetch.py), the
    NVIDIA module loaded against ``driver_package``'s installed version included."""
    facts = _host_facts()
    reasons: list[str] = []
    if driver_package:
        from gpuserve.host.driver import module_mismatch
        from gpuserve.roles.nvidia_driver import DebVersion

        mismatch = module_mismatch(fact_if_unchanged(facts.NvidiaModuleVersion),
                                   fact_if_unchanged(DebVersion, package=driver_package))
        if mismatch:
            reasons.append(mismatch)
    missing = boot.missing_params(fact_if_unchanged(facts.KernelCmdline), params)
    if missing:
        reasons.append(f"the running kernel lacks {' '.join(missing)}")
    if fact_if_unchanged(facts.NouveauLoaded):
        reasons.append("nouveau is loaded (blacklisted; the NVIDIA module cannot bind)")
    if fact_if_unchanged(File, path=REBOOT_REQUIRED):
        reasons.append("/run/reboot-required exists")
    return reasons


def reboot_preview(params: list[str], allow_reboot: bool,
                   driver_package: str | None = None) -> str:
    """Whether a reboot would follow, and why, from the state read before any change
    (the dry run's preview; the driver's install may add a reason of its own)."""
    reasons = reboot_reasons(params, driver_package)
    if not reasons:
        return "none: the running kernel has the parameters"
    if not allow_reboot:
        return f"pending, not taken (allow_reboot is off): {'; '.join(reasons)}"
    planned.action("reboot the host and wait for it")
    return f"would follow: {'; '.join(reasons)}"


@operation(is_idempotent=True)
def reboot_if_pending(params: list[str], allow_reboot: bool, reboot_timeout: int = 900,
                      driver_package: str | None = None):
    """Reboot only when needed and allowed; otherwise report the pending reboot."""
    reasons = reboot_reasons(params, driver_package)
    if not reasons:
        host.noop("no reboot pending")
        return
    if not allow_reboot:
        message = (
            f"REBOOT PENDING on {host.name}: {'; '.join(reasons)}. Reboot the host, or set "
            "host data allow_reboot=True and re-run."
        )
        if host.state.is_executing:
            logger.warning(message)
        host.noop(message)
        return
    logger.info(f"{host.name}: rebooting: {'; '.join(reasons)}")
    yield from server.reboot._inner(delay=10, interval=2, reboot_timeout=reboot_timeout)


@deploy("Kernel command line")
def configure_kernel(params: list[str]):
    """configure step: the boot loader carries ``params`` (decided by gpuserve.host.boot)."""
    boot_loader = fact(_host_facts().BootLoader)
    if planned.collecting():  # decided when executing: noted for the dry run's preview
        path, current, new, apply = boot_config(params, boot_loader)
        if new != current:
            planned.file(path, new)
            planned.action(f"{apply} (the boot loader's configuration)")
    boot_cmdline(
        name=f"Kernel parameters {' '.join(params)} ({boot_loader or 'grub'})",
        params=params,
        boot_loader=boot_loader,
    )


@deploy("Reboot when pending")
def activate_kernel(params: list[str], allow_reboot: bool, reboot_timeout: int = 900,
                    driver_package: str | None = None):
    """activate step: run last, after every role that may need a reboot (the driver's
    too: ``driver_package``'s version against the loaded module)."""
    if planned.collecting():
        planned.restart("reboot", reboot_preview(params, allow_reboot, driver_package))
    reboot_if_pending(
        name="Reboot if the running kernel lacks the configuration",
        params=params,
        allow_reboot=allow_reboot,
        reboot_timeout=reboot_timeout,
        driver_package=driver_package,
    )
