"""The interpreter a locked venv is built with (SGLang's and the gateway's): chosen on
the host (gpuserve/launch/interpreter.py decides which and why), its apt packages, and
the managed CPython where no system or distribution interpreter has a lock.

One python-build-standalone ``install_only`` archive per build, fetched from the URL the
choice names (the inventory's ``sglang_python_mirror`` or upstream), checked against the
catalog's sha256 before it is unpacked, unpacked beside the venvs under
``<home>/python/<cpython-VERSION+BUILD>`` (the role's own home: ``sglang_home``,
``router_home``) and stamped with that sha256. It never replaces ``python3`` and
nothing but the role's venvs uses it.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from gpuserve.facts.host import SglangInterpreter
from gpuserve.host.proven import proven_on_host
from gpuserve.launch.interpreter import (
    SGLANG,
    InterpreterChoice,
    ManagedBuild,
    VenvRole,
    choose_interpreter,
    facts_from,
    managed_path,
    packages_read_for,
)
from gpuserve.roles.base import managed
from gpuserve.roles.base.prefetch import Read, fact
from gpuserve.serve.install import PythonWish

STAMP = ".gpuserve-archive-sha256"


class ManagedPythonStamp(FactBase):
    """The sha256 a managed CPython directory was unpacked from (None: not there)."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(f'{path}/{STAMP}')} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output and output[0].strip() else None


def install_dir(choice: InterpreterChoice) -> str:
    """``<home>/python/cpython-3.12.14+20260814``: the directory holding bin/ and include/."""
    return choice.path.rsplit("/bin/", 1)[0]


def reads(choice: InterpreterChoice | None) -> list[Read]:
    if choice is None or choice.build is None:
        return []
    return [Read.of(ManagedPythonStamp, path=install_dir(choice))]


def choice_read(pythons: Collection[str], explicit: str = "") -> Read:
    """The interpreter facts for these lock Pythons and host data's interpreter path
    (``explicit``; read in the deploy's first batch; apt only where python3 has no lock)."""
    return Read.of(SglangInterpreter, pythons=" ".join(sorted(set(pythons))),
                   explicit=explicit)


def choose_on_host(pythons: Collection[str], home: str, wish: PythonWish,
                   role: VenvRole = SGLANG) -> InterpreterChoice:
    """The interpreter ``role``'s venvs are built with (gpuserve/launch/interpreter.py),
    from the plan's ``wish``, said in the deploy's output with why; an InterpreterError
    before any change (the gateway's deploy; the serve deploy's plan chooses from the
    same facts)."""
    read = choice_read(pythons, wish.explicit_path)
    facts = facts_from(fact(read.cls, **dict(read.kwargs)))
    choice = choose_interpreter(facts, pythons, asked=wish.asked, mirror=wish.mirror,
                                home=home, host=host.name, builds=wish.builds, role=role)
    logger.info(f"{host.name}: {role.label} interpreter: {choice.kind} Python "
                f"{choice.version} ({choice.path}): {choice.reason}")
    # how this path is proven on the host's distribution (docs/hosts.md's matrix as data)
    path = "serve" if role is SGLANG else "gateway"
    logger.info(f"{host.name}: {proven_on_host(facts.os_release, path)}")
    return choice


def prepare_reads(home: str, pythons: Collection[str], wish: PythonWish) -> list[Read]:
    """Everything a choice for these lock Pythons reads or may install, for the deploy's
    first prefetch: the choice's facts, the apt packages and managed builds' stamps."""
    ordered = sorted(set(pythons))
    builds = tuple(b for b in wish.builds if b.python in ordered)
    return [choice_read(ordered, wish.explicit_path), *package_reads(ordered),
            *stamp_reads(home, builds)]


def candidate_paths(home: str, python: str, explicit: str,
                    builds: Collection[ManagedBuild]) -> tuple[str, ...]:
    """The interpreters a choice for this lock Python may name besides python3: the
    distribution's, the managed ``builds``' and host data's ``explicit`` path."""
    return (f"/usr/bin/python{python}",
            *(managed_path(home, b) for b in builds if b.python == python),
            *([explicit] if explicit else []))


def stamp_reads(home: str, builds: Collection[ManagedBuild]) -> list[Read]:
    """The stamp of every catalog build a choice may name (deploy prefetch: the choice is
    made after the first batch, a rerun needs no second)."""
    return [Read.of(ManagedPythonStamp, path=f"{home}/python/{b.dirname}") for b in builds]


def package_reads(pythons: list[str]) -> list[Read]:
    """The packages any choice for these lock Pythons may install (deploy prefetch)."""
    return [managed.read_package(p) for p in packages_read_for(pythons)]


def install_interpreter(choice: InterpreterChoice | None, purpose: str) -> None:
    """The choice's apt packages (``-venv``, and ``-dev`` for Python.h, which Triton's JIT
    compiles against; Debian splits both out of python3) and, for a managed build, its
    archive; None: python3 with python3-venv. A rerun with everything there adds no
    operation (roles/base/managed.py)."""
    packages = list(choice.packages) if choice else ["python3-venv"]
    if packages:
        managed.packages(name=f"{', '.join(packages)} for {purpose}", packages=packages,
                         update=True)
    if choice is not None and choice.build is not None:
        managed_python(name=f"managed CPython {choice.version} for {purpose} "
                            f"(sha256 {choice.build.sha256[:12]}...)", choice=choice)


@operation()
def managed_python(choice: InterpreterChoice):
    """Fetch, check and unpack the choice's archive unless its stamp says it is there."""
    build, target = choice.build, install_dir(choice)
    if build is None or choice.url is None:
        return
    if fact(ManagedPythonStamp, path=target) == build.sha256:
        host.noop(f"{target} is CPython {build.version} from sha256 {build.sha256[:12]}")
        return
    q = shlex.quote
    parent = target.rsplit("/", 1)[0]
    headers = f"$t/python/include/python{build.python}/Python.h"
    yield StringCommand("sh", "-c", QuoteString(
        f"set -e; mkdir -p {q(parent)}; t=$(mktemp -d {q(parent)}/.fetch.XXXXXX); "
        "trap 'rm -rf \"$t\"' EXIT; "
        f"curl -fsSL --retry 3 --max-time 900 -o \"$t/archive\" {q(choice.url)}; "
        f"echo \"{build.sha256}  $t/archive\" | sha256sum -c --quiet - || "
        f"{{ echo gpuserve: {q(choice.url)}: sha256 is not the catalog\\'s "
        f"{build.sha256} >&2; exit 1; }}; "
        "tar -xzf \"$t/archive\" -C \"$t\"; "
        f"[ -x \"$t/python/bin/python{build.python}\" ] && [ -f \"{headers}\" ] || "
        f"{{ echo \"gpuserve: {build.filename} lacks bin/python{build.python} or "
        f"Python.h\" >&2; exit 1; }}; "
        f"rm -rf {q(target)}; mv \"$t/python\" {q(target)}; "
        f"printf '%s\\n' {q(build.sha256)} > {q(target + '/' + STAMP)}"))
