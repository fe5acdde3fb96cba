"""Files and directories a role manages, decided from one prefetched read.

Why: ``files.put``/``files.directory`` read two or three facts each, at prepare time and
again at execute time: on the lab host that was most of a no-op rerun's 57 remote
commands. Here a path that already matches adds no operation, and one that differs adds
one command with no fact read of its own.

How: docs/reruns.md, "gpuserve.roles.base.managed: one read, one command"
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra import state as run_state
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.apt import noninteractive_apt

from gpuserve.host.unit_state import LiveUnit, parse_unit_state
from gpuserve.launch.install_progress import APT_LINES, apt_progress
from gpuserve.roles.base import planned, progress
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.prefetch import Read, fact, fact_if_unchanged


@dataclass(frozen=True)
class PathInfo:
    """What is at a path: kind ``file``/``dir``/``link``/``other``/``absent``."""

    kind: str
    mode: int | None = None
    user: str | None = None
    group: str | None = None
    sha1: str | None = None


class PathState(FactBase):
    """Kind, mode, owner, group (and sha1 for a regular file) of one path.

    Many paths are read together by one ``stat`` and one ``sha1sum``
    (:meth:`group_command`, used by roles/base/prefetch.py): on a TCG lab guest every process
    costs tens of milliseconds, and a deploy reads some twenty paths."""

    @staticmethod
    def default() -> PathInfo:
        return PathInfo("other")  # unknown: never equal to a wanted state

    def command(self, path: str) -> str:
        return self.group_command([{"path": path}])

    def process(self, output: list[str]) -> PathInfo:
        return next(iter(parse_path_states(output).values()), PathInfo("absent"))

    @staticmethod
    def group_command(kwargs_list: list[dict]) -> str:
        paths = " ".join(shlex.quote(k["path"]) for k in kwargs_list)
        # %F: "directory", "regular file", "regular empty file", "symbolic link" ...
        return (f"stat -c 'stat %a %U %G %F|%n' -- {paths} 2>/dev/null; "
                f"for p in {paths}; do [ -f \"$p\" ] && [ ! -L \"$p\" ] && "
                f"printf '%s\\0' \"$p\"; done | xargs -0 -r sha1sum -- 2>/dev/null; true")

    @staticmethod
    def group_process(kwargs_list: list[dict], output: list[str]) -> list[PathInfo]:
        found = parse_path_states(output)
        return [found.get(k["path"], PathInfo("absent")) for k in kwargs_list]


_KINDS = {"directory": "dir", "regular file": "file", "regular empty file": "file",
          "symbolic link": "link"}


def parse_path_states(lines: list[str]) -> dict[str, PathInfo]:
    """``stat %a %U %G %F|%n`` lines and ``sha1sum`` lines -> path: PathInfo. A path
    stat does not list is absent; anything unreadable is ``other`` (never equal to a
    wanted state, so the operation runs and writes it again)."""
    stats: dict[str, PathInfo] = {}
    sums: dict[str, str] = {}
    for line in lines:
        if line.startswith("stat "):
            head, sep, path = line[5:].partition("|")
            parts = head.split(" ", 3)
            if not sep or len(parts) != 4:
                continue
            kind = _KINDS.get(parts[3], "other")
            try:
                mode = int(parts[0], 8)
            except ValueError:
                stats[path] = PathInfo("other")
                continue
            stats[path] = (PathInfo(kind) if kind in ("link", "other")
                           else PathInfo(kind, mode, parts[1], parts[2]))
        else:
            digest, sep, path = line.partition("  ")
            if sep and len(digest) == 40:
                sums[path] = digest
    for path, info in stats.items():
        if info.kind == "file":
            digest = sums.get(path)
            stats[path] = (PathInfo(info.kind, info.mode, info.user, info.group, digest)
                           if digest else PathInfo("other"))
    return stats


def read(path: str) -> Read:
    """The prefetch entry for ``path`` (for a role's ``reads()``)."""
    return Read.of(PathState, path=path)


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def write_command(dest: str, text: str, user: str, group: str, mode: str) -> StringCommand:
    """The one command :func:`put` runs (for operations that decide at execute time)."""
    return write_secret_command(dest, text, user, group, mode)


def write_secret_command(dest: str, contents: str, user: str = "root", group: str = "root",
                         mode: str = "600") -> StringCommand:
    """The command that writes ``contents`` to ``dest`` from stdin: ``umask 077`` into a
    temporary file beside it, chown, chmod, then rename, so the file is never readable
    by others and the contents are never on argv (nor in pyinfra's output)."""
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.gpuserve-new")
    script = (
        f"umask 077 && cat > {shlex.quote(tmp)}"
        f" && chown {shlex.quote(user + ':' + group)} {shlex.quote(tmp)}"
        f" && chmod {shlex.quote(mode)} {shlex.quote(tmp)}"
        f" && mv -f {shlex.quote(tmp)} {shlex.quote(dest)}"
    )
    return StringCommand("sh", "-c", QuoteString(script), _stdin=contents)


def write_changed(files: Iterable[tuple[str, str]], user: str = "root", group: str = "root",
                  mode: str = "644"):
    """Inside an operation (execute time): write each ``(path, text)`` whose file on the
    host differs, one command each; ``changed = yield from write_changed(...)``."""
    changed = False
    for path, text in files:
        if not matches(fact_if_unchanged(PathState, path=path), "file", user, group, mode,
                       sha1(text)):
            changed = True
            yield write_command(path, text, user, group, mode)
    return changed


def matches(info: PathInfo | None, kind: str, user: str, group: str, mode: str,
            sha1: str | None = None) -> bool:
    """Whether ``info`` is that kind, owner, group, mode (and content sha1)."""
    return _is(info or PathInfo("other"), kind, user, group, mode, sha1)


def _is(info: PathInfo, kind: str, user: str, group: str, mode: str,
        sha1: str | None = None) -> bool:
    return (info.kind == kind and info.user == user and info.group == group
            and info.mode == int(mode, 8) and (sha1 is None or info.sha1 == sha1))


@operation()
def _directory(path: str, user: str, group: str, mode: str):
    q = shlex.quote
    yield StringCommand("sh", "-c", QuoteString(
        f"mkdir -p {q(path)} && chown {q(user + ':' + group)} {q(path)} "
        f"&& chmod {q(mode)} {q(path)}"))


@operation()
def _file(dest: str, contents: Callable[[], str], user: str, group: str, mode: str):
    """Write ``contents()`` from stdin into a temporary file beside ``dest``, set owner
    and mode, then rename: never half-written (a full disk fails the write, not the
    old file), never readable by others in between, never on argv or in the output
    (pyinfra's ``--diff`` of files.put would print every line; this prints none)."""
    yield write_secret_command(dest, contents(), user, group, mode)


def directory(*, name: str, path: str, user: str, group: str,
              mode: str) -> OperationMeta | None:
    """Make ``path`` that directory unless it already is (then no operation)."""
    if _is(state(path), "dir", user, group, mode):
        return None
    planned.action(f"make directory {path} ({user}:{group}, {mode})")
    return _directory(name=name, path=path, user=user, group=group, mode=mode)


def put(*, name: str, dest: str, user: str, group: str, mode: str,
        src: str | None = None, text: str | None = None) -> OperationMeta | None:
    """Put a local file ``src`` or ``text`` at ``dest`` unless ``dest`` already holds
    those bytes with that owner and mode (then no operation)."""
    if (src is None) == (text is None):
        raise TypeError("managed.put takes src or text")
    data = Path(src).read_bytes().decode() if src is not None else str(text)
    return _write(name, dest, lambda: data, user, group, mode, shown=True)


def secret(*, name: str, dest: str, contents: Callable[[], str], user: str, group: str,
           mode: str) -> OperationMeta | None:
    """Like :func:`put` for contents that must never be shown: a function, so that
    pyinfra's logged operation arguments never hold the text."""
    if not callable(contents):
        raise TypeError("managed.secret(contents=...) takes a function returning the text")
    return _write(name, dest, contents, user, group, mode, shown=False)


def _write(name: str, dest: str, contents: Callable[[], str], user: str, group: str,
           mode: str, shown: bool) -> OperationMeta | None:
    """The write of :func:`put` (``shown``) and :func:`secret`, noted for a dry run's
    preview (roles/base/planned.py; a secret's whole text is redacted there)."""
    want = hashlib.sha1(contents().encode()).hexdigest()
    if _is(state(dest), "file", user, group, mode, want):
        return None
    planned.file(dest, contents(), secret=not shown)
    return _file(name=name, dest=dest, contents=contents, user=user, group=group, mode=mode)


def absent(*, name: str, path: str) -> OperationMeta:
    """Remove the file at ``path``. Decided inside the operation, at execute time: a
    package an earlier operation installs may create it (cuda-keyring ships the very
    sources.list entry the driver role removes)."""
    if planned.collecting() and state(path).kind != "absent":  # no read on a real run
        planned.file(path, None)
    return _absent(name=name, path=path)


@operation()
def _absent(path: str):
    if (fact_if_unchanged(PathState, path=path) or PathInfo("other")).kind == "absent":
        host.noop(f"{path} is absent")
        return
    yield StringCommand("rm", "-f", QuoteString(path))


def state(path: str) -> PathInfo:
    """What the prefetch read at ``path`` (read now when it was not prefetched)."""
    return fact(PathState, path=path) or PathInfo("other")


def changed(*ops: OperationMeta | None) -> bool:
    """Whether any of ``ops`` changed the host (a skipped one changed nothing)."""
    return any(op is not None and op.did_change() for op in ops)


class UnitState(FactBase):
    """The unit's systemd state, and which of its files are newer than its process.

    ``newer``: files written after the running server started. A deploy cut off between
    writing a file and restarting (an SSH drop) leaves the new file in place, so the
    rerun's file check finds nothing to do; this is how it still knows the server runs
    the old configuration and restarts it.
    """

    @staticmethod
    def default() -> LiveUnit:
        return LiveUnit()

    def command(self, unit: str, paths: tuple[str, ...]) -> str:
        # one systemctl and one stat: each process costs tens of milliseconds on a slow
        # host, and this runs on every rerun. systemd before v248 has no --timestamp=,
        # and v248-v250 accept it but ignore it for `show`: a start time that is not
        # "... HH:MM:SS.ffffff UTC" goes through date instead (to the second then).
        q = shlex.quote
        props = "-p ActiveState -p UnitFileState -p NeedDaemonReload -p ExecMainStartTimestamp"
        mtimes = (f"stat -c 'Mtime=%.9Y %n' -- {' '.join(q(p) for p in paths)} 2>/dev/null; "
                  if paths else "")
        return (f"_u=$(systemctl show --timestamp=us+utc {props} {q(unit)} 2>/dev/null) || "
                f"_u=$(systemctl show {props} {q(unit)} 2>/dev/null); "
                "printf '%s\\n' \"$_u\"; "
                "case \"$_u\" in *ExecMainStartTimestamp=*) "
                "_t=${_u#*ExecMainStartTimestamp=}; _n='\n'; _t=${_t%%\"$_n\"*}; "
                "case \"$_t\" in ''|*.[0-9][0-9][0-9][0-9][0-9][0-9]' UTC') ;; "
                "*) echo \"Started=$(date -d \"$_t\" +%s.%N 2>/dev/null)\" ;; esac ;; esac; "
                f"{mtimes}true")

    def process(self, output: list[str]) -> LiveUnit:
        return parse_unit_state(output)


def read_unit(unit: str, paths: tuple[str, ...] = ()) -> Read:
    """The prefetch entry for :func:`unit_state`."""
    return Read.of(UnitState, unit=unit, paths=paths)


def unit_state(unit: str, paths: tuple[str, ...] = ()) -> LiveUnit:
    """``unit``'s live state (and which of ``paths`` are newer than its process)."""
    return fact(UnitState, unit=unit, paths=paths) or LiveUnit()


#: dpkg ${Status} of an installed package; "hold": held (apt-mark hold), as the driver and
#: Fabric Manager are (roles/fabric_manager)
_INSTALLED = (["install ok installed"], ["hold ok installed"])


class DebInstalled(FactBase):
    """Whether a Debian package is installed (``dpkg-query``, not ``dpkg -l`` of all;
    many packages in one ``dpkg-query`` through the prefetch)."""

    @staticmethod
    def default() -> bool:
        return False

    def command(self, package: str) -> str:
        return self.group_command([{"package": package}])

    def process(self, output: list[str]) -> bool:
        return any(line.split(" ", 1)[1:] in _INSTALLED for line in output)

    @staticmethod
    def group_command(kwargs_list: list[dict]) -> str:
        names = " ".join(shlex.quote(k["package"]) for k in kwargs_list)
        return f"dpkg-query -W -f='${{Package}} ${{Status}}\\n' {names} 2>/dev/null; true"

    @staticmethod
    def group_process(kwargs_list: list[dict], output: list[str]) -> list[bool]:
        installed = {line.split(" ", 1)[0].split(":")[0] for line in output
                     if line.split(" ", 1)[1:] in _INSTALLED}
        return [k["package"] in installed for k in kwargs_list]


def read_package(package: str) -> Read:
    return Read.of(DebInstalled, package=package)


def packages(*, name: str, packages: list[str], update: bool = False) -> OperationMeta | None:
    """:func:`apt_install` unless every package is installed already (then no
    operation; pyinfra's ``apt.packages`` read ``dpkg -l`` of the whole host, twice)."""
    if all(fact(DebInstalled, package=p) for p in packages):
        return None
    if planned.collecting():  # the dry run's preview names the missing ones
        missing = [p for p in packages if not fact(DebInstalled, package=p)]
        planned.action(f"apt-get install {' '.join(packages)} ({name})",
                       would=f"install {', '.join(missing)} ({name})")
    return apt_install(name=name, packages=packages, update=update)


#: How long a detached apt-get may run before the host fails, and how long it waits for
#: dpkg's lock (an apt-get left running by an interrupted deploy, unattended-upgrades).
APT_TIMEOUT_S = 3 * 3600
APT_LOCK_TIMEOUT_S = 600


@operation()
def apt_install(packages: list[str], update: bool = False, no_recommends: bool = False):
    """``apt-get install`` (after ``apt-get update`` when asked), detached and polled with
    a progress line at least every 10 s (roles/base/progress.py): a driver or a CUDA toolkit
    is gigabytes of archives. A failure fails the host with apt's last lines."""
    lock = f"-o DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"
    steps = [noninteractive_apt(f"{lock} update")] if update else []
    steps.append(noninteractive_apt(f"{lock} install "
                                    + ("--no-install-recommends " if no_recommends else "")
                                    + " ".join(shlex.quote(p) for p in packages)))
    yield from _apt_job(" && ".join(steps), f"apt {' '.join(packages)}",
                        f"installing {' '.join(packages)}")


@operation()
def apt_script(script: str, label: str):
    """A shell script of apt-get steps (the driver and Fabric Manager in one transaction,
    then held: gpuserve/host/fabric.py), with :func:`apt_install`'s progress lines and
    failure report; ``label`` names it in both."""
    yield from _apt_job(script, label, label)


def _apt_job(script: str, label: str, what: str):
    """Run ``script`` detached, poll it with apt's progress (packages fetched and bytes,
    unpacked, set up), fail the host with its last lines when it fails."""
    run_dir = progress.fresh_dir("apt")
    yield progress.start_command(run_dir, script)
    if not run_state.is_executing:
        return
    job = progress.wait(run_dir, APT_LINES, apt_progress, label=label[:80],
                        timeout=APT_TIMEOUT_S)
    if job.rc != 0:
        yield fail_host(f"apt: {what} failed ({job.outcome(APT_TIMEOUT_S)}):", job.tail)
        return
    yield StringCommand("rm", "-rf", QuoteString(run_dir))


def systemctl(*, name: str, unit: str, steps: tuple[str, ...]) -> OperationMeta:
    """Run ``systemctl`` steps in order as one command (``daemon-reload``, then
    ``reset-failed``/``restart``/``start``/``enable`` of ``unit``)."""
    planned.systemctl(unit, steps)
    return _systemctl(name=name, unit=unit, steps=steps)


@operation()
def _systemctl(unit: str, steps: tuple[str, ...]):
    q = shlex.quote(unit)
    commands = {"daemon-reload": "systemctl daemon-reload",
                "reset-failed": f"systemctl reset-failed {q}",
                "restart": f"systemctl restart {q}", "start": f"systemctl start {q}",
                "enable": f"systemctl enable {q}"}
    yield StringCommand("sh", "-c", QuoteString(" && ".join(commands[s] for s in steps)))


def render(template: Path | str, **values: object) -> str:
    """A template of ``templates/`` rendered locally (what ``files.template`` would
    upload), so that :func:`put` can compare it with the host's file first."""
    import jinja2

    text = Path(template).read_text()
    return jinja2.Template(text, keep_trailing_newline=True,
                           undefined=jinja2.StrictUndefined).render(**values)
