"""NVIDIA driver from NVIDIA's CUDA apt repository, pinned to a branch, open modules.

install: Debian contrib, the cuda-keyring package (sha256-checked before dpkg sees it:
gpuserve/host/keyring.py) and a deb822 source for the
repository (base URL from host data so a local mirror works), the branch pin and the
flavour meta-package. configure: nouveau blacklisted (initramfs rebuilt), persistence
daemon in persistence mode. activate: nvidia-persistenced enabled and running.

Refusals happen at prepare time, before anything changes: Secure Boot without an
enrolled MOK, and the proprietary flavour on Blackwell-or-later GPUs.
Source for every step: NVIDIA Driver Installation Guide
(https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FactBase, deploy, operation
from pyinfra.facts.apt import AptSources, AptSourcesFile
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Arch, Command, KernelVersion, LinuxDistribution
from pyinfra.operations import apt, files, server

from gpuserve.errors import InputError
from gpuserve.host import boot, driver, fabric, keyring, passthrough
from gpuserve.host import defaults as host_defaults
from gpuserve.host.unit_state import LiveUnit
from gpuserve.paths import TEMPLATES_DIR
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.inventory import inventory_source
from gpuserve.roles.base.prefetch import Read, fact, prefetch

TEMPLATES = TEMPLATES_DIR  # templates/ of the checkout, or gpuserve/templates installed
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
KEYRING_VERSION = "1.1-1"
KEYRING_PATH = "/usr/share/keyrings/cuda-archive-keyring.gpg"

DEFAULTS = host_defaults.NVIDIA_DRIVER


def _gpu_facts():
    from gpuserve.facts import gpu as gpu_facts

    return gpu_facts


def _host_facts():
    from gpuserve.facts import host as host_facts

    return host_facts


BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
PERSISTENCED = "nvidia-persistenced.service"
DROPIN_DIR = "/etc/systemd/system/nvidia-persistenced.service.d"
DROPIN = f"{DROPIN_DIR}/override.conf"
DEBIAN_SOURCES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d/debian.sources")


def fact_reads() -> list[Read]:
    """What this role reads before it knows the repository (the deploy's first
    prefetch, roles/base/prefetch.py)."""
    return [Read.of(LinuxDistribution), Read.of(Arch), Read.of(KernelVersion),
            Read.of(Command, command=passthrough.SYSFS_PCI_COMMAND),
            Read.of(_host_facts().SecureBoot), Read.of(_gpu_facts().NvidiaGpus),
            Read.of(_host_facts().NouveauLoaded), Read.of(DebVersion, package="cuda-keyring"),
            Read.of(_host_facts().Container), Read.of(_host_facts().NvidiaModuleVersion),
            *(Read.of(DebVersion, package=driver.flavour_meta(f)) for f in driver.FLAVOURS),
            Read.of(AptSources), *(Read.of(FileContents, path=p) for p in DEBIAN_SOURCES)]


def path_reads(repo_url: str, plan: driver.DriverPlan, headers: bool) -> list[Read]:
    """The files, packages and unit this role manages (the second prefetch)."""
    list_name = driver.repo_list_name(repo_url)
    packages = ["ca-certificates", "curl", "nvidia-persistenced", *plan.packages]
    if headers:
        packages.append(f"linux-headers-{fact(KernelVersion)}")
    return [*(managed.read(p) for p in (BLACKLIST, DROPIN_DIR, DROPIN,
                                        f"/etc/apt/sources.list.d/{list_name}.list")),
            *(managed.read_package(p) for p in packages), managed.read_unit(PERSISTENCED)]


class DebVersion(FactBase):
    """The installed version of a Debian package, or None."""

    def command(self, package: str) -> str:
        return (f"dpkg-query -W -f='${{Status}}|${{Version}}\\n' {shlex.quote(package)} "
                "2>/dev/null || true")

    def process(self, output: list[str]) -> str | None:
        for line in output:
            status, _, version = line.partition("|")
            if status in ("install ok installed", "hold ok installed") and version:
                return version
        return None


def default_repo_url() -> str:
    distro = fact(LinuxDistribution) or {}
    meta = distro.get("release_meta") or {}
    return driver.repo_url_for(meta.get("ID"), meta.get("VERSION_ID"), fact(Arch))


def nvidia_pci_devices() -> list[dict[str, str]]:
    """NVIDIA functions from sysfs (works before any driver is installed)."""
    output = fact(Command, command=passthrough.SYSFS_PCI_COMMAND) or ""
    return [
        {"address": f.address, "vendor": f.vendor, "device": f.device}
        for f in passthrough.parse_sysfs_pci(output)
        if f.is_gpu
    ]


def preflight(flavour: str, mok_enrolled: bool) -> None:
    """Prepare-time refusals: raise before any operation is added."""
    driver.check_secure_boot(fact(_host_facts().SecureBoot), mok_enrolled, host.name)
    driver.check_flavour(flavour, fact(_gpu_facts().NvidiaGpus), nvidia_pci_devices())


@operation()
def cuda_keyring(repo_url: str, sha256: str):
    """Install cuda-keyring 1.1-1 from the repository unless it is installed.

    Downloaded to a temp dir and checked against ``sha256`` before dpkg installs it
    (apt.deb has no checksum; it would also fetch again whenever /tmp was cleaned).
    """
    if fact(DebVersion, package="cuda-keyring") == KEYRING_VERSION:
        host.noop(f"cuda-keyring {KEYRING_VERSION} is installed")
        return
    yield keyring.install_command(f"{repo_url}{KEYRING_DEB}", sha256)


def contrib_sources() -> dict[str, str]:
    """Debian's own sources files that lack contrib next to main: path -> new text."""
    changed = {}
    for path in DEBIAN_SOURCES:
        lines = fact(FileContents, path=path)
        if not lines:
            continue
        current = "\n".join(lines) + "\n"
        new = driver.with_contrib(current)
        if new != current:
            changed[path] = new
    return changed


@operation()
def debian_contrib():
    """Add contrib next to main in Debian's own sources (one-line and deb822 files)."""
    changed = contrib_sources()
    for path, new in changed.items():
        yield from files.put._inner(src=StringIO(new), dest=path, mode="644")
    if not changed:
        host.noop("Debian sources already enable contrib (or have no main component)")


def add_repository(repo_url: str, contrib: bool, keyring_sha256: str) -> list:
    """Debian contrib, the keyring (checked against ``keyring_sha256``) and the deb822
    source of the repository; returns the operations whose change needs an apt update."""
    changes = []
    distro = (fact(LinuxDistribution) or {}).get("name") or ""
    debian = contrib and distro.lower().startswith("debian")
    sources = contrib_sources() if debian else {}
    if debian:
        for path, new in sources.items():
            planned.file(path, new)
        changes.append(debian_contrib(name="Enable Debian contrib"))
    # the keyring is fetched with curl; minimal images have neither it nor the CA bundle.
    managed.packages(name="Tools to fetch the repository keyring",
                     packages=["ca-certificates", "curl"])
    keyring_missing = fact(DebVersion, package="cuda-keyring") != KEYRING_VERSION
    if keyring_missing:
        planned.action(f"install cuda-keyring {KEYRING_VERSION} from {repo_url} (sha256 "
                       "checked before dpkg)", would=f"install cuda-keyring {KEYRING_VERSION}")
    changes.append(cuda_keyring(name=f"Install cuda-keyring (sha256 {keyring_sha256[:12]}...)",
                                repo_url=repo_url, sha256=keyring_sha256))
    list_name = driver.repo_list_name(repo_url)
    # cuda-keyring ships its own one-line entry pointing at NVIDIA's servers; the deb822
    # source below replaces it so the configured base URL (a mirror) is the only one.
    changes.append(
        managed.absent(
            name="Remove cuda-keyring's own sources.list entry (replaced by deb822 source)",
            path=f"/etc/apt/sources.list.d/{list_name}.list",
        )
    )
    configured = _source_configured(repo_url)
    if not configured:
        planned.action(f"add the apt source {list_name} (deb822: {repo_url}, signed by "
                       f"{KEYRING_PATH})")
    if sources or keyring_missing or not configured:
        planned.action("apt-get update (the repository's sources change)")
    if not configured:
        changes.append(
            apt.sources_file(
                name=f"NVIDIA CUDA repository {repo_url}",
                filename=list_name,
                uris=[repo_url],
                suites=["/"],
                signed_by=KEYRING_PATH,
            )
        )
    return changes


def install(repo_url: str, plan: driver.DriverPlan, install_headers: bool, contrib: bool,
            keyring_sha256: str, fm: fabric.FabricPlan | None = None):
    """Repository, keyring (checked against ``keyring_sha256``), branch pin and
    flavour meta-package; ``fm``: Fabric Manager in the meta-package's transaction, at
    the version apt resolves the driver to, both held (roles/fabric_manager)."""
    changes = add_repository(repo_url, contrib, keyring_sha256)
    apt.update(
        name="apt-get update after repository changes",
        _if=[lambda: managed.changed(*changes)],
    )
    if install_headers:
        managed.packages(
            name="Kernel headers for DKMS",
            packages=[f"linux-headers-{fact(KernelVersion)}"],
        )
    if plan.pinning_package:
        managed.packages(
            name=f"Lock driver branch {plan.branch} ({plan.pinning_package})",
            packages=[plan.pinning_package],
        )
    metas = [p for p in plan.packages if p != plan.pinning_package]
    change = installed_change(plan)
    if change.branch_change or fabric_moves(change, fm):
        moved = (f"branch {change.from_branch} -> {plan.branch}" if change.branch_change
                 else str(plan.branch))
        with_fm = " and Fabric Manager in one transaction, held" if fm else ""
        preview_transaction(change, metas, fm, f"driver {plan.flavour} {moved}{with_fm}")
        managed.apt_script(
            name=f"NVIDIA driver {plan.flavour} {moved}{with_fm}",
            script=fabric.meta_transaction(
                metas, ["nvidia-persistenced"], fm, remove=change.leftovers,
                branch=plan.branch if change.branch_change else None),
            label=f"apt driver {plan.branch}{' with Fabric Manager' if fm else ''}")
        return
    managed.packages(
        name=f"NVIDIA driver {plan.flavour} flavour, branch {plan.branch}",
        packages=[*metas, "nvidia-persistenced"],
    )


def preview_transaction(change: driver.KernelDriverChange, metas: list[str],
                        fm: fabric.FabricPlan | None, what: str) -> None:
    """The dry run's line for the driver's apt transaction (with Fabric Manager, held)."""
    fm_packages = list(fm.versioned) if fm else []
    steps = [f"apt-get remove {' '.join(change.leftovers)}"] if change.leftovers else []
    steps.append(f"apt-get install {' '.join([*metas, 'nvidia-persistenced', *fm_packages])}")
    if fm:
        steps.append(f"apt-mark hold {' '.join([*metas, *fm.held])}")
    planned.action(", then ".join(steps),
                   would=f"install{' and hold' if fm else ''} "
                         f"{', '.join([*metas, *fm_packages])} ({what})")


def installed_change(plan: driver.DriverPlan) -> driver.KernelDriverChange:
    """The installed driver (its flavour meta's version, read in the first batch) against
    ``plan``: whether this run moves it to another branch."""
    return driver.KernelDriverChange(
        plan, fact(DebVersion, package=driver.flavour_meta(plan.flavour)))


def fabric_moves(change: driver.KernelDriverChange, fm: fabric.FabricPlan | None) -> bool:
    """Whether this run installs or moves Fabric Manager on a host with its own kernel:
    a package of it or of the driver's metas missing, a driver branch change, or Fabric
    Manager at another version than the installed driver (Fabric Manager is then
    restarted after the reboot that loads the new module: roles/fabric_manager)."""
    if fm is None:
        return False
    metas = [p for p in change.plan.packages if p != change.plan.pinning_package]
    return (change.branch_change or change.installed is None
            or not all(fact(managed.DebInstalled, package=p) for p in (*metas, *fm.versioned))
            or any(fact(DebVersion, package=p) != change.installed for p in fm.versioned))


def _source_configured(repo_url: str) -> bool:
    """Whether the host's apt sources already hold the repository exactly as
    ``apt.sources_file`` below would write it (its own idempotency check, made on the
    prefetched ``AptSources`` so that a rerun reads nothing more)."""
    entry = AptSourcesFile(types=["deb"], uris=[repo_url], suites=["/"], components=[],
                           architectures=None, signed_by=[KEYRING_PATH])
    existing = fact(AptSources) or []
    wanted = entry.expand_to_repos()
    return bool(wanted) and all(repo in existing for repo in wanted)


def configure(persistence: bool) -> bool | None:
    """nouveau off (each initramfs that holds nouveau rebuilt when the blacklist
    changes), persistence mode on.
    Returns whether the persistenced drop-in changes (None: persistence off)."""
    blacklist = managed.put(
        name="Blacklist nouveau",
        text=managed.render(TEMPLATES / "nvidia-blacklist-nouveau.conf.j2"),
        dest=BLACKLIST, user="root", group="root", mode="644",
    )
    if blacklist is not None:
        planned.action("update-initramfs -u (the initramfs without nouveau) where an "
                       "initramfs holds nouveau")
        server.shell(
            name="Rebuild the initramfs without nouveau",
            commands=[boot.rebuild_initramfs_holding("nouveau")],
            _if=blacklist.did_change,
        )
    if fact(_host_facts().NouveauLoaded):
        planned.action("modprobe -r nouveau (loaded now)")
        server.modprobe(name="Unload nouveau if loaded", module="nouveau", present=False)
    if not persistence:
        return None
    managed.directory(name=f"{DROPIN_DIR} (root, 755)", path=DROPIN_DIR, user="root",
                      group="root", mode="755")
    dropin = managed.put(
        name="nvidia-persistenced in persistence mode",
        # NVIDIA/ansible-role-nvidia-driver runs the daemon as root in the same drop-in.
        text=managed.render(TEMPLATES / "nvidia-persistenced-override.conf.j2",
                            daemon_user="root"),
        dest=DROPIN, user="root", group="root", mode="644",
    )
    return dropin is not None


def persistenced_steps(live: LiveUnit, dropin_changed: bool, nouveau: bool) -> list[str]:
    """systemctl steps for the persistence daemon: reload for a new drop-in, enable,
    and (re)start, except while nouveau still holds the GPUs: with nouveau bound the
    NVIDIA module cannot load, and the daemon starts after the reboot the kernel role
    reports or performs."""
    steps = []
    if dropin_changed or live.need_reload:
        steps.append("daemon-reload")
    if not nouveau:
        if live.active in ("active", "activating", "reloading"):
            if dropin_changed:
                steps.append("restart")
        else:
            steps.append("start")
    if live.enabled not in ("enabled", "static", "alias", "indirect", "generated"):
        steps.append("enable")
    return steps


def activate(dropin_changed: bool | None) -> None:
    """Enable the persistence daemon; start it unless nouveau still holds the GPUs."""
    if dropin_changed is None:
        return
    steps = persistenced_steps(managed.unit_state(PERSISTENCED), dropin_changed,
                               bool(fact(_host_facts().NouveauLoaded)))
    if steps:
        managed.systemctl(name=f"nvidia-persistenced: {', '.join(steps)}", unit=PERSISTENCED,
                          steps=tuple(steps))


def repository(repo_url: str | None, keyring_sha256: str | None) -> tuple[str, str]:
    """(base URL, cuda-keyring sha256): as given, else NVIDIA's for the host's
    distribution. ``keyring_sha256`` (the host plan's ``nvidia_keyring_sha256``) None:
    the digest published for the distribution; none known is an InputError."""
    source = inventory_source()
    given = keyring.validate_sha256(keyring_sha256, source)
    # the distribution is read only when needed (a mirror with its own digest needs none)
    try:
        nvidia_default = "" if repo_url and given else default_repo_url()
    except ValueError as exc:
        raise InputError(source, keyring.FIELD, f"{exc}: the published cuda-keyring "
                         "sha256 is chosen by distribution; set nvidia_keyring_sha256 (and "
                         "nvidia_repo_url) for this host") from None
    sha256 = given or keyring.expected_sha256(None, nvidia_default, source)
    return repo_url or nvidia_default, sha256


@dataclass(frozen=True)
class DriverRequest:
    """The driver the host data asks for: the repository (``keyring_sha256``: see
    :func:`repository`), the branch and flavour, whether the module's signing key is
    enrolled, the kernel headers, Debian's contrib component, the persistence daemon."""

    repo_url: str | None
    branch: int
    flavour: str = "open"
    mok_enrolled: bool = False
    install_headers: bool = True
    contrib: bool = True
    persistence: bool = True
    keyring_sha256: str | None = None


@deploy("NVIDIA driver")
def install_nvidia_driver(want: DriverRequest, fm: fabric.FabricPlan | None = None):
    """Install the pinned NVIDIA driver ``want`` (with Fabric Manager: ``fm``); refuses
    (raises) before changing anything."""
    repo_url, branch, flavour = want.repo_url, want.branch, want.flavour
    install_headers, contrib = want.install_headers, want.contrib
    mok_enrolled, persistence, keyring_sha256 = (want.mok_enrolled, want.persistence,
                                                 want.keyring_sha256)
    preflight(flavour, mok_enrolled)
    meta = (fact(LinuxDistribution) or {}).get("release_meta") or {}
    problem = driver.repository_branch_problem(meta.get("ID"), meta.get("VERSION_ID"), branch)
    if problem:
        raise driver.HostRefusal(f"{host.name}: {problem}; nothing was changed")
    plan = driver.driver_plan(branch, flavour)
    url, sha256 = repository(repo_url, keyring_sha256)
    logger.info(
        f"{host.name}: NVIDIA driver {flavour} {branch} from {url}: {', '.join(plan.packages)}"
    )
    prefetch(path_reads(url, plan, install_headers)
             + [managed.read_package(p) for p in (fm.versioned if fm else ())])
    install(url, plan, install_headers, contrib, sha256, fm)
    activate(configure(persistence))
