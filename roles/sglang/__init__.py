"""Install SGLang for a dedicated service user: system user, venv, pip install.

The venv is owned by root and only read by the service (its unit has
``ProtectSystem=strict``), so a compromised server cannot rewrite its own code. The
package comes from host data so an air-gapped mirror works: ``pip_find_links`` alone
means "this mirror only" (``--no-index``); add ``pip_index_url`` to also use an index.
"""

from __future__ import annotations

import re
import shlex
from urllib.parse import urlparse

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files, pip, server

from gpuserve.errors import InputError
from gpuserve.host import driver

DEFAULTS = {
    # pip requirement; must pin a version (it selects the flag dialect). Default from
    # the CUDA lane (gpuserve.facts.gpu.CudaToolkit), see default_package().
    "sglang_package": None,
    # pip --index-url (None: pip's default, or no index at all when pip_find_links is set)
    "pip_index_url": None,
    # pip --find-links (a local wheel mirror, e.g. http://mirror/wheels/)
    "pip_find_links": None,
    # the system user and group the server runs as
    "sglang_user": "sglang",
    # root of everything gpuserve installs: venv/, cache/ (the service's HOME), bin/
    "sglang_home": "/opt/gpuserve",
}

# PEP 508 name, optional extras, then an exact "==" pin (PEP 440 public + local part).
_PIN = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*==\s*"
    r"(?P<public>[0-9]+(\.[0-9]+)*([a-z0-9.]*)?)(\+(?P<local>[A-Za-z0-9.]+))?\s*$"
)
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def default_package(cuda_toolkit: str | None, source: str) -> str:
    """Pick the SGLang release for the host's CUDA lane, or explain why we cannot.

    The lane table (and which SGLang release each lane gets) is data, shared with the
    host deploy: gpuserve/data/host/nvidia.yaml via ``gpuserve.host.driver``.
    """
    lanes = driver.lanes()
    choices = ", ".join(f"{lane} -> sglang=={spec['sglang']}" for lane, spec in lanes.items())
    if not cuda_toolkit:
        raise InputError(source, "sglang_package",
                         f"not set and no CUDA toolkit found on the host to choose one ({choices})")
    if cuda_toolkit not in lanes:
        raise InputError(source, "sglang_package",
                         f"not set and CUDA {cuda_toolkit} has no default SGLang release "
                         f"({choices}); pin one, e.g. sglang_package='sglang==0.5.23'")
    return f"sglang=={driver.sglang_release_for_lane(cuda_toolkit)}"


def pinned_version(requirement: str, source: str) -> str:
    """``sglang==0.5.23+cu130`` -> ``0.5.23``: the version whose flags we render.

    The local part (PEP 440 ``+...``) names a build of the same release, so it is
    stripped; anything but an exact pin is refused, because the flag dialect must be
    known before the host is touched.
    """
    if not isinstance(requirement, str):
        raise InputError(source, "sglang_package", "must be a pip requirement string")
    m = _PIN.match(requirement)
    if not m or m.group("name").lower().replace("_", "-") != "sglang":
        raise InputError(source, "sglang_package",
                         f"{requirement!r} must pin SGLang exactly, e.g. 'sglang==0.5.23'")
    return m.group("public")


def exact_version(requirement: str) -> tuple[str, str]:
    """``sglang[all]==0.5.23+cu130`` -> (``sglang``, ``0.5.23+cu130``): what pip must report."""
    m = _PIN.match(requirement)
    assert m, "validated by pinned_version() first"
    local = m.group("local")
    return m.group("name"), m.group("public") + (f"+{local}" if local else "")


class InstalledVersion(FactBase):
    """Version of a distribution in a venv (``importlib.metadata``), None if absent.

    pyinfra's ``PipPackages`` fact does not parse local versions (its regex stops at
    ``+``), so ``sglang==0.5.23+cu130`` would be reinstalled on every run.
    """

    def command(self, python: str, dist: str) -> str:
        code = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
        return (f"{shlex.quote(python)} -c {shlex.quote(code)} {shlex.quote(dist)} "
                "2>/dev/null || true")

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output and output[0].strip() else None


@operation()
def pip_install_pinned(venv: str, requirement: str, extra_args: str | None = None):
    """``pip install`` an exact pin into ``venv`` unless that exact version is there."""
    dist, version = exact_version(requirement)
    installed = host.get_fact(InstalledVersion, python=f"{venv}/bin/python", dist=dist)
    if installed is not None and installed.lower() == version.lower():
        host.noop(f"{dist} {installed} is installed in {venv}")
        return
    extra = [QuoteString(a) for a in shlex.split(extra_args or "")]
    yield StringCommand(QuoteString(f"{venv}/bin/pip"), "install", *extra,
                        QuoteString(requirement))


def validate_user(user: object, source: str) -> str:
    if not isinstance(user, str) or not _USER.match(user):
        raise InputError(source, "sglang_user", f"{user!r} is not a valid system user name")
    return user


def validate_home(home: object, source: str) -> str:
    if not isinstance(home, str) or not home.startswith("/") or home.rstrip("/") in ("", "/"):
        raise InputError(source, "sglang_home", f"{home!r} must be an absolute directory")
    if any(c in home for c in " \t\n'\"$%\\"):
        raise InputError(source, "sglang_home", f"{home!r} must not contain spaces or quotes")
    return home.rstrip("/")


def venv_dir(home: str) -> str:
    return f"{home}/venv"


def state_dir(home: str) -> str:
    """The service user's HOME and its only writable place (model/JIT caches)."""
    return f"{home}/cache"


def pip_args(index_url: str | None, find_links: str | None) -> str | None:
    args: list[str] = []
    if index_url:
        args += ["--index-url", index_url]
    elif find_links:
        args.append("--no-index")
    if find_links:
        args += ["--find-links", find_links]
    # pip ignores a plain-http index or find-links host unless it is trusted; a mirror
    # the inventory names explicitly is the one the user asked for, so trust that host.
    for url in (index_url, find_links):
        parsed = urlparse(url or "")
        if parsed.scheme == "http" and parsed.hostname and parsed.hostname not in args:
            args += ["--trusted-host", parsed.hostname]
    return " ".join(shlex.quote(a) for a in args) or None


@deploy("Install SGLang")
def install_sglang(user: str, home: str, package: str, index_url: str | None = None,
                   find_links: str | None = None) -> None:
    server.group(name=f"Service group {user}", group=user, system=True)
    server.user(
        name=f"Service user {user}",
        user=user,
        group=user,
        home=state_dir(home),
        shell="/usr/sbin/nologin",
        system=True,
        create_home=False,
        ensure_home=False,
        comment="gpuserve SGLang server",
    )
    files.directory(name=f"{home} (root-owned)", path=home, user="root", group="root",
                    mode="755")
    files.directory(name=f"{state_dir(home)} (service caches)", path=state_dir(home),
                    user=user, group=user, mode="750")
    # Debian splits venv/ensurepip out of python3; check at prepare so a rerun is a no-op.
    if "python3-venv" not in host.get_fact(DebPackages):
        apt.packages(name="python3-venv for the SGLang venv", packages=["python3-venv"],
                     update=True)
    pip.venv(name=f"venv {venv_dir(home)}", path=venv_dir(home), python="python3")
    pip_install_pinned(name=f"pip install {package}", venv=venv_dir(home),
                       requirement=package, extra_args=pip_args(index_url, find_links))
