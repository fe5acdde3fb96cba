"""The metrics exporters of a GPU host: Debian's node exporter, NVIDIA's DCGM exporter.

Why packages and drop-ins: both come from an apt repository (Debian's archive; the CUDA
repository the driver role configures) with their own units, so a rerun is a dpkg
query and two file compares; only a changed file restarts its exporter. Decisions:
gpuserve/monitor/exporters.py. How: docs/metrics.md.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt

from gpuserve.monitor import exporters as ex
from gpuserve.monitor.exporters import ExportersPlan
from gpuserve.monitor.targets import EXPORTER_DEFAULTS
from gpuserve.roles.base import managed
from gpuserve.roles.base.prefetch import Read, fact
from gpuserve.roles.nvidia_driver import DebVersion
from gpuserve.roles.service import activation_steps

DEFAULTS = EXPORTER_DEFAULTS

__all__ = ["DEFAULTS", "install_exporters", "missing_packages", "package_reads", "reads"]


def package_reads(specs: tuple[str, ...] | list[str]) -> list[Read]:
    return [Read.of(DebVersion, package=spec.partition("=")[0]) for spec in specs]


def missing_packages(specs: tuple[str, ...] | list[str]) -> list[str]:
    """The ``name`` or ``name=VERSION`` specs not installed at that version (a pinned
    package at another version is one; an unpinned installed one is not)."""
    out = []
    for spec in specs:
        name, _, version = spec.partition("=")
        have = fact(DebVersion, package=name)
        if have is None or (version and have != version):
            out.append(spec)
    return out


def reads(plan: ExportersPlan) -> list[Read]:
    """Everything the role reads, for the deploy's prefetch."""
    out = [managed.read_package(ex.NODE_PACKAGE), managed.read(ex.NODE_DEFAULTS_PATH),
           managed.read_unit(ex.NODE_UNIT, (ex.NODE_DEFAULTS_PATH,))]
    if plan.dcgm:
        out += [*package_reads(plan.dcgm_packages),
                managed.read(ex.COUNTERS_PATH), managed.read(ex.DCGM_DROPIN),
                managed.read("/etc/dcgm-exporter"),
                managed.read(f"/etc/systemd/system/{ex.DCGM_UNIT}.d"),
                managed.read_unit(ex.DCGM_UNIT, (ex.COUNTERS_PATH, ex.DCGM_DROPIN))]
    return out


def _activate(unit: str, paths: tuple[str, ...], changed: bool, unit_changed: bool) -> None:
    steps = activation_steps(managed.unit_state(unit, paths), changed, unit_changed)
    if steps:
        managed.systemctl(name=f"Activate {unit}", unit=unit, steps=tuple(steps))


@deploy("Metrics exporters")
def install_exporters(plan: ExportersPlan) -> None:
    """Install, configure and (re)start the exporters ``plan`` switches on."""
    if plan.node:
        installed = managed.packages(name="Install prometheus-node-exporter",
                                     packages=[ex.NODE_PACKAGE], update=True)
        args = managed.put(name="Node exporter arguments", dest=ex.NODE_DEFAULTS_PATH,
                           text=plan.node_args, user="root", group="root", mode="644")
        _activate(ex.NODE_UNIT, (ex.NODE_DEFAULTS_PATH,), args is not None or
                  installed is not None, False)
    if plan.dcgm:
        # pinned packages are reinstalled by apt only when the version differs
        missing = missing_packages(plan.dcgm_packages)
        installed = apt.packages(name="Install DCGM and dcgm-exporter", packages=missing,
                                 update=True) if missing else None
        for path in ("/etc/dcgm-exporter", f"/etc/systemd/system/{ex.DCGM_UNIT}.d"):
            managed.directory(name=f"Directory {path}", path=path, user="root",
                              group="root", mode="755")
        counters = managed.put(name="dcgm-exporter counters", dest=ex.COUNTERS_PATH,
                               text=plan.counters, user="root", group="root", mode="644")
        dropin = managed.put(name="dcgm-exporter unit drop-in", dest=ex.DCGM_DROPIN,
                             text=plan.dcgm_dropin, user="root", group="root", mode="644")
        _activate(ex.DCGM_UNIT, (ex.COUNTERS_PATH, ex.DCGM_DROPIN),
                  any(op is not None for op in (installed, counters, dropin)),
                  dropin is not None)
