"""NVIDIA driver from NVIDIA's CUDA apt repository, pinned to a branch, open modules.

install: Debian contrib, the cuda-keyring package (sha256-checked before dpkg sees it:
roles/nvidia_driver/keyring.py) and a deb822 source for the
repository (base URL from host data so a local mirror works), the branch pin and the
flavour meta-package. configure: nouveau blacklisted (initramfs rebuilt), persistence
daemon in persistence mode. activate: nvidia-persistenced enabled and running.

Refusals happen at prepare time, before anything changes: Secure Boot without an
enrolled MOK, and the proprietary flavour on Blackwell-or-later GPUs.
Source for every step: NVIDIA Driver Installation Guide
(https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/).
"""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Arch, Command, KernelVersion, LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from gpuserve.errors import InputError
from gpuserve.host import driver, passthrough
from roles.inventory import inventory_source
from roles.nvidia_driver import keyring

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
KEYRING_VERSION = "1.1-1"
KEYRING_PATH = "/usr/share/keyrings/cuda-archive-keyring.gpg"

DEFAULTS = {
    # Base URL of NVIDIA's CUDA repository for this distribution (the directory holding
    # Packages and cuda-keyring_1.1-1_all.deb). None: NVIDIA's own,
    # https://developer.download.nvidia.com/compute/cuda/repos/<distro>/<arch>/.
    "nvidia_repo_url": None,
    # sha256 of cuda-keyring_1.1-1_all.deb as that repository serves it. None: the value
    # published for the host's distribution (gpuserve/data/host/nvidia.yaml); a mirror
    # that builds its own keyring, or a distribution the table lacks, must set it.
    "nvidia_keyring_sha256": None,
    # URL prefixes (e.g. "http://10.0.2.2:8000/") whose plain-http URLs host data may
    # use; every other URL must be https (roles/nvidia_driver/mirrors.py).
    "trusted_mirrors": [],
    # Driver branch to lock (580: versioned metas; 590+: nvidia-driver-pinning-<branch>).
    "nvidia_driver_branch": 580,
    # Kernel-module flavour: "open" (required on Blackwell) or "proprietary".
    "nvidia_driver_flavour": "open",
    # Secure Boot is on and a MOK is enrolled, so signed DKMS modules will load.
    "nvidia_secure_boot_mok_enrolled": False,
    # Install linux-headers for the running kernel (DKMS builds the modules against them).
    "nvidia_install_headers": True,
    # On Debian, add the contrib component to the distribution's sources.
    "nvidia_debian_contrib": True,
    # Run nvidia-persistenced in persistence mode.
    "nvidia_persistenced": True,
}


def _gpu_facts():
    from gpuserve.facts import gpu as gpu_facts

    return gpu_facts


def _host_facts():
    from gpuserve.facts import host as host_facts

    return host_facts


def default_repo_url() -> str:
    distro = host.get_fact(LinuxDistribution) or {}
    meta = distro.get("release_meta") or {}
    return driver.repo_url_for(meta.get("ID"), meta.get("VERSION_ID"), host.get_fact(Arch))


def nvidia_pci_devices() -> list[dict[str, str]]:
    """NVIDIA functions from sysfs (works before any driver is installed)."""
    output = host.get_fact(Command, command=passthrough.SYSFS_PCI_COMMAND) or ""
    return [
        {"address": f.address, "vendor": f.vendor, "device": f.device}
        for f in passthrough.parse_sysfs_pci(output)
        if f.is_gpu
    ]


def preflight(flavour: str, mok_enrolled: bool) -> None:
    """Prepare-time refusals: raise before any operation is added."""
    driver.check_secure_boot(host.get_fact(_host_facts().SecureBoot), mok_enrolled, host.name)
    driver.check_flavour(flavour, host.get_fact(_gpu_facts().NvidiaGpus), nvidia_pci_devices())


@operation()
def cuda_keyring(repo_url: str, sha256: str):
    """Install cuda-keyring 1.1-1 from the repository unless it is installed.

    Downloaded to a temp dir and checked against ``sha256`` before dpkg installs it
    (apt.deb has no checksum; it would also fetch again whenever /tmp was cleaned).
    """
    if KEYRING_VERSION in (host.get_fact(DebPackages) or {}).get("cuda-keyring", []):
        host.noop(f"cuda-keyring {KEYRING_VERSION} is installed")
        return
    yield keyring.install_command(f"{repo_url}{KEYRING_DEB}", sha256)


@operation()
def debian_contrib():
    """Add contrib next to main in Debian's own sources (one-line and deb822 files)."""
    changed = False
    for path in ("/etc/apt/sources.list", "/etc/apt/sources.list.d/debian.sources"):
        lines = host.get_fact(FileContents, path=path)
        if not lines:
            continue
        current = "\n".join(lines) + "\n"
        new = driver.with_contrib(current)
        if new != current:
            changed = True
            yield from files.put._inner(src=StringIO(new), dest=path, mode="644")
    if not changed:
        host.noop("Debian sources already enable contrib (or have no main component)")


def install(repo_url: str, plan: driver.DriverPlan, install_headers: bool, contrib: bool,
            keyring_sha256: str):
    """Repository, keyring (checked against ``keyring_sha256``), branch pin and
    flavour meta-package."""
    changes = []
    distro = (host.get_fact(LinuxDistribution) or {}).get("name") or ""
    if contrib and distro.lower().startswith("debian"):
        changes.append(debian_contrib(name="Enable Debian contrib"))
    # the keyring is fetched with curl; minimal images have neither it nor the CA bundle.
    apt.packages(name="Tools to fetch the repository keyring", packages=["ca-certificates", "curl"])
    changes.append(cuda_keyring(name=f"Install cuda-keyring (sha256 {keyring_sha256[:12]}...)",
                                repo_url=repo_url, sha256=keyring_sha256))
    list_name = driver.repo_list_name(repo_url)
    # cuda-keyring ships its own one-line entry pointing at NVIDIA's servers; the deb822
    # source below replaces it so the configured base URL (a mirror) is the only one.
    changes.append(
        files.file(
            name="Remove cuda-keyring's own sources.list entry (replaced by deb822 source)",
            path=f"/etc/apt/sources.list.d/{list_name}.list",
            present=False,
        )
    )
    changes.append(
        apt.sources_file(
            name=f"NVIDIA CUDA repository {repo_url}",
            filename=list_name,
            uris=[repo_url],
            suites=["/"],
            signed_by=KEYRING_PATH,
        )
    )
    apt.update(
        name="apt-get update after repository changes",
        _if=[lambda: any(op.did_change() for op in changes)],
    )
    if install_headers:
        apt.packages(
            name="Kernel headers for DKMS",
            packages=[f"linux-headers-{host.get_fact(KernelVersion)}"],
        )
    if plan.pinning_package:
        apt.packages(
            name=f"Lock driver branch {plan.branch} ({plan.pinning_package})",
            packages=[plan.pinning_package],
        )
    apt.packages(
        name=f"NVIDIA driver {plan.flavour} flavour, branch {plan.branch}",
        packages=[p for p in plan.packages if p != plan.pinning_package]
        + ["nvidia-persistenced"],
    )


def configure(persistence: bool):
    """nouveau off (initramfs rebuilt when the blacklist changes), persistence mode on."""
    blacklist = files.template(
        name="Blacklist nouveau",
        src=str(TEMPLATES / "nvidia-blacklist-nouveau.conf.j2"),
        dest="/etc/modprobe.d/blacklist-nouveau.conf",
        mode="644",
    )
    server.shell(
        name="Rebuild the initramfs without nouveau",
        commands=["update-initramfs -u"],
        _if=blacklist.did_change,
    )
    server.modprobe(name="Unload nouveau if loaded", module="nouveau", present=False)
    if not persistence:
        return None
    return files.template(
        name="nvidia-persistenced in persistence mode",
        src=str(TEMPLATES / "nvidia-persistenced-override.conf.j2"),
        dest="/etc/systemd/system/nvidia-persistenced.service.d/override.conf",
        mode="644",
        # NVIDIA/ansible-role-nvidia-driver runs the daemon as root in the same drop-in.
        daemon_user="root",
    )


def activate(dropin) -> None:
    """Enable the persistence daemon; start it unless nouveau still holds the GPUs."""
    if dropin is None:
        return
    systemd.daemon_reload(
        name="systemd daemon-reload (persistenced drop-in)", _if=dropin.did_change
    )
    systemd.service(name="Enable nvidia-persistenced", service="nvidia-persistenced", enabled=True,
                    running=None)
    systemd.service(
        name="Restart nvidia-persistenced (drop-in changed)",
        service="nvidia-persistenced",
        running=None,
        restarted=True,
        _if=[dropin.did_change, lambda: not host.get_fact(_host_facts().NouveauLoaded)],
    )
    systemd.service(
        name="Start nvidia-persistenced",
        service="nvidia-persistenced",
        running=True,
        # With nouveau bound the NVIDIA module cannot load: the daemon starts after the
        # reboot the kernel role reports or performs.
        _if=lambda: not host.get_fact(_host_facts().NouveauLoaded),
    )


@deploy("NVIDIA driver")
def install_nvidia_driver(
    repo_url: str | None,
    branch: int,
    flavour: str = "open",
    mok_enrolled: bool = False,
    install_headers: bool = True,
    contrib: bool = True,
    persistence: bool = True,
    keyring_sha256: str | None = None,
):
    """Install the pinned NVIDIA driver; refuses (raises) before changing anything.

    ``keyring_sha256`` None: host data ``nvidia_keyring_sha256``, else the digest
    published for the host's distribution; none known is an InputError."""
    preflight(flavour, mok_enrolled)
    plan = driver.driver_plan(branch, flavour)
    source = inventory_source()
    given = keyring.validate_sha256(
        keyring_sha256 or host.data.get("nvidia_keyring_sha256"), source)
    # the distribution is read only when needed (a mirror with its own digest needs none)
    try:
        nvidia_default = "" if repo_url and given else default_repo_url()
    except ValueError as exc:
        raise InputError(source, keyring.FIELD, f"{exc}: the published cuda-keyring "
                         "sha256 is chosen by distribution; set nvidia_keyring_sha256 (and "
                         "nvidia_repo_url) for this host") from None
    sha256 = given or keyring.expected_sha256(None, nvidia_default, source)
    url = repo_url or nvidia_default
    logger.info(
        f"{host.name}: NVIDIA driver {flavour} {branch} from {url}: {', '.join(plan.packages)}"
    )
    install(url, plan, install_headers, contrib, sha256)
    activate(configure(persistence))
