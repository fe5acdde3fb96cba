"""The NVIDIA userspace driver on a container host, matched to its host's kernel module.

install: the same repository, keyring and source as a VM or bare-metal host
(roles/nvidia_driver), an apt pin to the module's exact version, then the compute-only
userspace package of that version. Nothing of the kernel's (gpuserve/host/container.py
says why). Refusals happen at prepare time, before anything changes: no module in sight,
or a repository without the module's version.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import FactBase, deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt

from gpuserve.host import container, driver, fabric
from gpuserve.roles import fabric_manager
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.inventory import inventory_source
from gpuserve.roles.base.prefetch import Read, fact, prefetch
from gpuserve.roles.nvidia_driver import DebVersion, add_repository, repository


def _host_facts():
    from gpuserve.facts import host as host_facts

    return host_facts


class RepoIndex(FactBase):
    """The ``Package:`` and ``Version:`` lines of a flat apt repository's Packages.gz, read
    from the host (the repository may be a mirror only the host reaches); None when it
    cannot be read."""

    def command(self, url: str) -> str:
        index = shlex.quote(f"{url}Packages.gz")
        return (f"if out=$(curl -fsSL --max-time 60 {index} | gzip -dc); then "
                "printf '%s\\n' \"$out\" | grep -E '^(Package|Version): '; "
                "echo '# index read'; fi; true")

    def process(self, output: list[str]) -> list[str] | None:
        return output if "# index read" in output else None


def plan_userspace(repo_url: str, container_kind: str) -> container.UserspacePlan:
    """Read the module's version and the repository's index; refuse before any change."""
    module = fact(_host_facts().NvidiaModuleVersion)
    available = None
    if module is not None:
        lines = fact(RepoIndex, url=repo_url)
        available = (None if lines is None else
                     container.parse_index_versions(lines, container.USERSPACE_PACKAGE))
    return container.userspace_plan(module, available, container=container_kind,
                                    repo_url=repo_url, source=inventory_source(),
                                    host=host.name)


def prepare(repo_url: str | None, container_kind: str,
            keyring_sha256: str | None = None) -> tuple[container.UserspacePlan, str, str]:
    """(plan, repository URL, keyring sha256) for :func:`install_userspace_driver`;
    refuses (raises) before anything changes."""
    distribution_refusal(container_kind)
    url, sha256 = repository(repo_url, keyring_sha256)
    return plan_userspace(url, container_kind), url, sha256


def distribution_refusal(container_kind: str) -> None:
    """Refuse a kernel module whose branch NVIDIA's repository for this distribution
    lacks (Debian 13: no R580), saying why: the module is the container's host's, so
    the fix is there, not in this host's data."""
    module = fact(_host_facts().NvidiaModuleVersion)
    meta = (fact(LinuxDistribution) or {}).get("release_meta") or {}
    rule = driver.repository_min_branch(meta.get("ID"), meta.get("VERSION_ID"))
    if module is None or rule is None or int(module.split(".")[0]) >= rule[1]:
        return
    distro, min_branch, why = rule
    raise driver.HostRefusal(
        f"{host.name}: container host ({container_kind}): its kernel module {module} is its "
        f"host's, and no userspace driver of branch {module.split('.')[0]} can be installed "
        f"on {distro}: {why}; load a driver of branch {min_branch} or later on the "
        "container's host; nothing was changed")


@deploy("NVIDIA userspace driver (container host)")
def install_userspace_driver(plan: container.UserspacePlan, url: str, sha256: str,
                             container_kind: str, contrib: bool = True,
                             fm: fabric.FabricPlan | None = None):
    """Install the userspace driver of exactly the container host's kernel module version
    (``plan``, from :func:`prepare`); ``fm``: Fabric Manager in the same apt transaction,
    at that version, both held (roles/fabric_manager)."""
    logger.info(f"{host.name}: container host ({container_kind}): kernel module "
                f"{plan.module_version} is its host's; userspace {plan.package_spec} from "
                f"{url}")
    for line in container.skipped_lines(host.name, container_kind):
        logger.info(line)
    list_name = driver.repo_list_name(url)
    prefetch([managed.read(container.PIN_FILE),
              managed.read(f"/etc/apt/sources.list.d/{list_name}.list"),
              *(managed.read_package(p) for p in ("ca-certificates", "curl")),
              Read.of(DebVersion, package=container.USERSPACE_PACKAGE),
              *fabric_manager.path_reads(fm)])
    changes = add_repository(url, contrib, sha256)
    changes.append(managed.put(
        name=f"apt pin: NVIDIA userspace {plan.deb_version} only ({container.PIN_FILE})",
        text=plan.pin_text(), dest=container.PIN_FILE, user="root", group="root",
        mode="644"))
    apt.update(name="apt-get update after repository changes",
               _if=[lambda: managed.changed(*changes)])
    driver_stale = fact(DebVersion, package=container.USERSPACE_PACKAGE) != plan.deb_version
    if fm is not None and (driver_stale or fabric_manager.stale(fm, plan.deb_version)):
        held = [container.USERSPACE_PACKAGE, *fm.held]
        planned.action(f"apt-get install {plan.package_spec} "
                       f"{' '.join(fm.specs(plan.deb_version))}, then apt-mark hold "
                       f"{' '.join(held)}", would=f"install and hold {plan.package_spec} with "
                       f"Fabric Manager {', '.join(fm.specs(plan.deb_version))}")
        managed.apt_script(name=f"NVIDIA userspace driver {plan.package_spec} and Fabric "
                                f"Manager ({', '.join(fm.versioned)}) in one transaction, held",
                           script=fabric.transaction([plan.package_spec,
                                                      *fm.specs(plan.deb_version)], held),
                           label=f"apt {plan.package_spec} with Fabric Manager")
    elif driver_stale:
        planned.action(f"apt-get install --no-install-recommends {plan.package_spec}",
                       would=f"install {plan.package_spec} (pinned to {plan.deb_version} by "
                             f"{container.PIN_FILE}; no kernel module)")
        managed.apt_install(name=f"NVIDIA userspace driver {plan.package_spec} (no kernel "
                                 "module)", packages=[plan.package_spec], no_recommends=True)

