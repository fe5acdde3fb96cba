"""Which CPython builds a locked venv (SGLang's, the gateway's), and why: decided before
any change.

A lock is for one Python minor, and a host's ``python3`` is whatever its distribution
ships: 3.10 on Ubuntu 22.04 (SGLang 0.5.23 needs 3.11+), 3.13 on Debian 13 (no
all-binary 0.5.23 stack: outlines-core 0.1.26 has no cp313 wheel). The choice, in order:
host data ``sglang_python`` (the gateway's: ``router_python``) when set; the system
``python3`` when a lock is for its minor; a distribution package ``python3.X`` when a
lock is for it and it is a release (Ubuntu 22.04's python3.11 is 3.11.0~rc1 in
universe: never); else a managed, hash-pinned CPython build (python-build-standalone's
install_only archive, as uv installs it) fetched from ``sglang_python_mirror``. The
interpreter builds the venvs only;
``python3`` is never replaced. Every choice brings the headers Triton's JIT compiles
against (Python.h): ``python3.X-dev`` for distribution interpreters, ``include/`` in the
managed archive. Sources: docs/hosts.md.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from urllib.parse import quote

from gpuserve import safeload
from gpuserve import versions as pep440
from gpuserve.errors import GpuserveError
from gpuserve.parsers.distro import AptCandidate

CATALOG = Path(__file__).resolve().parents[1] / "data" / "python" / "managed-cpython.json"
#: python-build-standalone's release download base; a mirror has the same layout below
#: it (``<base>/<build>/<filename>``, as uv's UV_PYTHON_INSTALL_MIRROR expects)
UPSTREAM = "https://github.com/astral-sh/python-build-standalone/releases/download"
#: host-data values of ``sglang_python`` besides an absolute interpreter path
AUTO, SYSTEM, MANAGED = "auto", "system", "managed"


@dataclass(frozen=True)
class VenvRole:
    """Whose venv an interpreter is chosen for: the host-data key that names it and the
    words the deploy's output and refusals use (docs/hosts.md)."""

    key: str = "sglang_python"
    purpose: str = "the SGLang venvs"
    label: str = "SGLang"  # "<label> interpreter: ..." in the deploy's output
    #: whether the venv needs the interpreter's headers: Triton's JIT compiles against
    #: Python.h (SGLang); smg is a prebuilt binary wheel and compiles nothing
    headers: bool = True

    def packages(self, *names: str) -> tuple[str, ...]:
        """The apt packages of a distribution interpreter, its ``-dev`` left out when
        the venv compiles nothing against it."""
        return tuple(n for n in names if self.headers or not n.endswith("-dev"))


SGLANG = VenvRole()
GATEWAY = VenvRole("router_python", "the gateway's (smg) venv", "gateway", headers=False)


class InterpreterError(GpuserveError):
    """No interpreter a lock exists for; nothing on the host has changed."""


@dataclass(frozen=True)
class ManagedBuild:
    """One python-build-standalone archive (tools/gen_python_catalog.py)."""

    version: str  # "3.12.14"
    python: str  # "3.12"
    arch: str  # "x86_64"
    build: str  # "20260814"
    filename: str
    url: str
    sha256: str
    size: int | None

    @property
    def dirname(self) -> str:
        return f"cpython-{self.version}+{self.build}"

    def url_from(self, mirror: str | None) -> str:
        """The archive's URL below ``mirror`` (the release layout), else upstream's."""
        if not mirror:
            return self.url
        return f"{mirror.rstrip('/')}/{self.build}/{quote(self.filename)}"


@cache
def managed_builds(path: Path = CATALOG) -> tuple[ManagedBuild, ...]:
    doc = safeload.load_json_file(path, safeload.CONFIG)  # sglang_python_builds: a user's
    builds = tuple(ManagedBuild(**b) for b in doc["builds"])
    for b in builds:  # they reach a shell command and a directory name
        if not (re.fullmatch(r"[0-9a-f]{64}", b.sha256) and re.fullmatch(r"3\.\d+\.\d+",
                b.version) and re.fullmatch(r"[0-9A-Za-z]{1,32}", b.build)
                and re.fullmatch(r"[A-Za-z0-9._+-]+", b.filename)):
            raise ValueError(f"{path}: build {b.filename!r:.80} is malformed")
    return builds


@dataclass(frozen=True)
class DistroFacts:
    """What the host says: os-release, ``python3``'s version, ``apt-cache policy`` of
    the interpreter packages, its machine; and the version of an explicit
    ``sglang_python`` path, when one is set (None: it does not run)."""

    os_release: dict[str, str]
    python3: str | None
    apt: dict[str, AptCandidate] = field(default_factory=dict)
    arch: str = "x86_64"
    explicit: str | None = None

    @property
    def name(self) -> str:
        r = self.os_release
        return r.get("PRETTY_NAME") or f"{r.get('ID', '?')} {r.get('VERSION_ID', '?')}"


DISTROS = Path(__file__).resolve().parents[1] / "data" / "distros"


def known_distributions() -> list[str]:
    return sorted(p.name for p in DISTROS.iterdir() if (p / "os-release").is_file())


def recorded_facts(name: str) -> DistroFacts:
    """A distribution's recorded answers (gpuserve/data/distros/NAME, sources in its
    SOURCES.md): what ``gpuserve check`` judges a host by without connecting to it."""
    from gpuserve.parsers.distro import parse_apt_policy, parse_os_release

    if name not in known_distributions():
        raise KeyError(name)
    d = DISTROS / name
    return DistroFacts(parse_os_release((d / "os-release").read_text()),
                       (d / "python3-version").read_text().strip(),
                       parse_apt_policy((d / "apt-policy").read_text()))


def facts_from(sections: dict[str, list[str]]) -> DistroFacts:
    """:class:`DistroFacts` from the SglangInterpreter fact's sections."""
    from gpuserve.parsers.distro import parse_apt_policy, parse_os_release

    def version(lines: list[str] | None) -> str | None:
        m = re.match(r"(?:Python )?(\d+\.\d+\.\d+)", (lines or [""])[0].strip())
        return m.group(1) if m else None

    arch = (sections.get("arch") or ["x86_64"])[0].strip() or "x86_64"
    return DistroFacts(parse_os_release("\n".join(sections.get("os-release") or [])),
                       version(sections.get("python3")),
                       parse_apt_policy("\n".join(sections.get("apt") or [])),
                       arch="aarch64" if arch in ("aarch64", "arm64") else arch,
                       explicit=version(sections.get("explicit")))


@dataclass(frozen=True)
class InterpreterChoice:
    """The interpreter that builds a role's venvs, what it needs, and why."""

    kind: str  # "system", "distribution", "managed", "explicit"
    python: str  # "3.12": the lock's Python
    version: str | None  # "3.12.14"
    path: str  # what runs ``-m venv`` on the host
    packages: tuple[str, ...]  # apt packages it needs (venv, headers)
    reason: str
    build: ManagedBuild | None = None
    url: str | None = None


def minor(version: str | None) -> str | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def upstream_version(deb_version: str) -> str:
    """``3.11.0~rc1-1~22.04`` -> ``3.11.0~rc1`` (epoch and Debian revision dropped)."""
    return deb_version.split(":", 1)[-1].rsplit("-", 1)[0]


def is_release(deb_version: str) -> bool:
    """Not an alpha, beta or release candidate (``3.11.0~rc1``, ``3.13.0b2``)."""
    return not re.search(r"(~|\d)(a|b|rc)\d*", upstream_version(deb_version))


def managed_path(home: str, build: ManagedBuild) -> str:
    return f"{home}/python/{build.dirname}/bin/python{build.python}"


def packages_read_for(pythons: Collection[str]) -> list[str]:
    """Every apt package a choice for these lock Pythons may name (read in the deploy's
    first batch, so a rerun needs no second one)."""
    return ["python3-venv", *(f"python{p}{s}" for p in pep440.ordered(pythons)
                              for s in ("", "-venv", "-dev"))]


def choose_interpreter(facts: DistroFacts, lock_pythons: Collection[str], *,
                       asked: str | None, mirror: str | None, home: str,
                       host: str, builds: tuple[ManagedBuild, ...] | None = None,
                       role: VenvRole = SGLANG) -> InterpreterChoice:
    """The interpreter for ``lock_pythons`` (the Python minors the wanted locks are for)
    of ``role``'s venv, ``asked`` its host-data value (None: auto), or an
    :class:`InterpreterError` naming what was looked for and the key that fixes it."""
    builds = managed_builds() if builds is None else builds
    wanted = pep440.ordered(set(lock_pythons))[::-1]
    asked = asked or AUTO
    if asked.startswith("/"):
        return _explicit(facts, wanted, asked, host, role)
    if asked not in (AUTO, SYSTEM, MANAGED):
        raise InterpreterError(f"{host}: {role.key}: {asked!r:.80} is not auto, system, "
                               "managed or an absolute interpreter path")
    notes: list[str] = []
    if asked != MANAGED:
        system = _system(facts, wanted, notes, role)
        if system is not None or asked == SYSTEM:
            return system or _refuse(facts, wanted, notes, host, asked, role)
        distro = _distribution(facts, wanted, notes, role)
        if distro is not None:
            return distro
    managed = _managed(facts, wanted, builds, mirror, home, notes, role)
    return managed or _refuse(facts, wanted, notes, host, asked, role)


def _system(facts: DistroFacts, wanted: list[str], notes: list[str], role: VenvRole
            ) -> InterpreterChoice | None:
    py = minor(facts.python3)
    if py in wanted:
        return InterpreterChoice(
            "system", py, facts.python3, "python3",
            role.packages("python3-venv", f"python{py}-dev"),
            f"{facts.name}'s python3 is {facts.python3}, and a lock is for Python {py}")
    notes.append(f"python3 is {facts.python3 or 'missing'} (no lock for "
                 f"{py or 'it'})")
    return None


def _distribution(facts: DistroFacts, wanted: list[str], notes: list[str], role: VenvRole
                  ) -> InterpreterChoice | None:
    for py in wanted:
        pkg = facts.apt.get(f"python{py}")
        if pkg is None or pkg.candidate is None:
            notes.append(f"no python{py} package")
            continue
        where = "/".join(pkg.components) or "the archive"
        if not is_release(pkg.candidate):
            notes.append(f"python{py} {pkg.candidate} ({where}) is a pre-release: not used")
            continue
        return InterpreterChoice(
            "distribution", py, upstream_version(pkg.candidate), f"/usr/bin/python{py}",
            role.packages(f"python{py}", f"python{py}-venv", f"python{py}-dev"),
            f"{facts.name}'s python3 is {facts.python3}, no lock for it; the "
            f"distribution's python{py} {pkg.candidate} ({where}) is a release a lock "
            "is for (installed beside python3, which stays)")
    return None


def _managed(facts: DistroFacts, wanted: list[str], builds: tuple[ManagedBuild, ...],
             mirror: str | None, home: str, notes: list[str], role: VenvRole
             ) -> InterpreterChoice | None:
    for py in wanted:
        build = next((b for b in builds if b.python == py and b.arch == facts.arch), None)
        if build is None:
            notes.append(f"no managed CPython {py} for {facts.arch}")
            continue
        url = build.url_from(mirror)
        return InterpreterChoice(
            "managed", py, build.version, managed_path(home, build), (),
            f"{'; '.join(notes) or role.key + '=managed'}; managed CPython "
            f"{build.version} (python-build-standalone {build.build}, sha256 "
            f"{build.sha256}) from {url}, for {role.purpose} only",
            build=build, url=url)
    return None


def _explicit(facts: DistroFacts, wanted: list[str], path: str, host: str, role: VenvRole
              ) -> InterpreterChoice:
    py = minor(facts.explicit)
    if py in wanted:
        return InterpreterChoice("explicit", py, facts.explicit, path, (),
                                 f"{role.key} names {path} (Python {facts.explicit})")
    found = f"Python {facts.explicit}" if facts.explicit else "does not run"
    raise InterpreterError(
        f"{host}: {role.key} {path} {found}, but the locks of {role.purpose} are for "
        f"Python {', '.join(wanted) or 'none'}; name an interpreter of one of those, or "
        f"{role.key}=managed for a managed CPython build")


def _refuse(facts: DistroFacts, wanted: list[str], notes: list[str], host: str,
            asked: str, role: VenvRole) -> InterpreterChoice:
    top = wanted[0] if wanted else "3.12"
    raise InterpreterError(
        f"{host} ({facts.name}): no interpreter for {role.purpose}: its locks are for Python "
        f"{', '.join(wanted) or 'none'} ({role.key}={asked}): {'; '.join(notes)}; set "
        f"{role.key}=managed (a managed CPython {top}, with sglang_python_mirror for "
        f"an air-gapped host) or {role.key}=/path/to/python{top}")
