"""Files and directories a role manages, checked against one prefetched read first.

``files.put``/``files.directory`` read two or three facts each (``File``, ``Sha1File``,
the parent directory), at prepare time and again at execute time. The helpers here read
:class:`PathState` (type, mode, owner, group and sha1 in one command, usually from the
deploy's prefetch: roles/prefetch.py) and call pyinfra's operation only when the path
differs from what is wanted; a path that already matches adds no operation at all. When
it differs, the real operation decides and changes exactly as before, reading its own
facts (so a change costs what it always did; only "nothing to do" got cheaper).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra.api import FactBase
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from roles.prefetch import Read, fact


@dataclass(frozen=True)
class PathInfo:
    """What is at a path: kind ``file``/``dir``/``link``/``other``/``absent``."""

    kind: str
    mode: int | None = None
    user: str | None = None
    group: str | None = None
    sha1: str | None = None


class PathState(FactBase):
    """Kind, mode, owner, group (and sha1 for a regular file) of one path, one line."""

    @staticmethod
    def default() -> PathInfo:
        return PathInfo("other")  # unknown: never equal to a wanted state

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return (f"if [ -L {p} ]; then echo link; "
                f"elif [ -d {p} ]; then echo \"dir $(stat -c '%a %U %G' {p})\"; "
                f"elif [ -f {p} ]; then echo \"file $(stat -c '%a %U %G' {p}) "
                f"$(sha1sum < {p} | cut -c1-40)\"; "
                f"elif [ -e {p} ]; then echo other; else echo absent; fi")

    def process(self, output: list[str]) -> PathInfo:
        return parse_path_state(output[0] if output else "")


def parse_path_state(line: str) -> PathInfo:
    """``dir 755 root root`` / ``file 644 root root <sha1>`` / ``absent`` -> PathInfo.
    Anything else is ``other`` (never equal to a wanted state, so the real operation
    runs and decides)."""
    parts = line.split()
    if parts in (["absent"], ["link"]):
        return PathInfo(parts[0])
    try:
        if parts[0] == "dir" and len(parts) == 4:
            return PathInfo("dir", int(parts[1], 8), parts[2], parts[3])
        if parts[0] == "file" and len(parts) == 5:
            return PathInfo("file", int(parts[1], 8), parts[2], parts[3], parts[4])
    except (ValueError, IndexError):
        pass
    return PathInfo("other")


def read(path: str) -> Read:
    """The prefetch entry for ``path`` (for a role's ``reads()``)."""
    return Read.of(PathState, path=path)


def _is(info: PathInfo, kind: str, user: str, group: str, mode: str,
        sha1: str | None = None) -> bool:
    return (info.kind == kind and info.user == user and info.group == group
            and info.mode == int(mode, 8) and (sha1 is None or info.sha1 == sha1))


def directory(*, name: str, path: str, user: str, group: str,
              mode: str) -> OperationMeta | None:
    """``files.directory`` unless ``path`` already is that directory."""
    if _is((fact(PathState, path=path) or PathInfo("other")), "dir", user, group, mode):
        return None
    return files.directory(name=name, path=path, user=user, group=group, mode=mode)


def put(*, name: str, dest: str, user: str, group: str, mode: str,
        src: str | None = None, text: str | None = None) -> OperationMeta | None:
    """``files.put`` of a local file ``src`` or of ``text``, unless ``dest`` already
    holds those bytes with that owner and mode."""
    if (src is None) == (text is None):
        raise TypeError("managed.put takes src or text")
    data = Path(src).read_bytes() if src is not None else str(text).encode()
    if _is((fact(PathState, path=dest) or PathInfo("other")), "file", user, group, mode,
           hashlib.sha1(data).hexdigest()):
        return None
    return files.put(name=name, src=src if src is not None else StringIO(text),
                     dest=dest, user=user, group=group, mode=mode)


def secret(*, name: str, dest: str, contents: Callable[[], str], user: str, group: str,
           mode: str) -> OperationMeta | None:
    """``secret_file`` (contents never shown) unless ``dest`` already matches."""
    from roles.service.secret import secret_file  # roles.service imports this module

    want = hashlib.sha1(contents().encode()).hexdigest()
    if _is((fact(PathState, path=dest) or PathInfo("other")), "file", user, group, mode, want):
        return None
    return secret_file(name=name, dest=dest, contents=contents, user=user, group=group,
                       mode=mode)


def absent(*, name: str, path: str) -> OperationMeta | None:
    """``files.file(present=False)`` unless nothing is at ``path``."""
    if (fact(PathState, path=path) or PathInfo("other")).kind == "absent":
        return None
    return files.file(name=name, path=path, present=False)


def changed(*ops: OperationMeta | None) -> bool:
    """Whether any of ``ops`` changed the host (a skipped one changed nothing)."""
    return any(op is not None and op.did_change() for op in ops)
