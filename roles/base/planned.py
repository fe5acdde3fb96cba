"""What a deploy would change on this host, noted at prepare time under ``--dry``.

Why: pyinfra's ``--dry`` stops before executing, and many operations of the host and
gateway deploys decide only then (a file rendered from facts the driver install changes,
a venv, a reboot), so their dry run looked like a no-op. Each role notes here, where it
adds an operation, what that operation would do as decided from the state read before any
change; roles/base/managed.py notes its files, packages, directories and systemctl steps
itself. roles/base/preview.py prints the notes (diffs against the live files, secrets
redacted). Without ``--dry`` nothing is noted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra import host

from gpuserve.roles.base.run_context import run_context


@dataclass(frozen=True)
class PlannedFile:
    text: str | None  # None: the file would be removed
    secret: bool  # the whole text is a secret (redacted in any diff)


@dataclass
class Planned:
    """One host's notes, in the order the deploy adds its operations."""

    files: dict[str, PlannedFile] = field(default_factory=dict)
    would: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    restarts: dict[str, str] = field(default_factory=dict)
    operations: list[str] = field(default_factory=list)
    acts: bool = False


def collecting() -> bool:
    """Whether this run is a dry run (the notes are taken only then)."""
    return run_context().dry


def notes() -> Planned:
    """This host's notes (made on first use)."""
    mine = run_context().host(host.name)
    if mine.planned is None:
        mine.planned = Planned()
    return mine.planned


def file(path: str, text: str | None, *, secret: bool = False) -> None:
    """``path`` would be written with ``text`` (None: removed)."""
    if not collecting():
        return
    mine = notes()
    mine.files[path] = PlannedFile(text, secret)
    mine.operations.append(f"write {path}" if text is not None else f"remove {path}")


def action(operation: str, would: str | None = None, changes: bool = True) -> None:
    """An operation that would run (``changes``: it changes the host; False: a read,
    such as a check); ``would``: the summary line (``install ...``, ``hold ...``)."""
    if not collecting():
        return
    mine = notes()
    mine.operations.append(operation)
    if would:
        mine.would.append(would)
    mine.acts |= changes


def systemctl(unit: str, steps: tuple[str, ...]) -> None:
    """``systemctl`` steps that would run for ``unit``."""
    if not collecting():
        return
    mine = notes()
    mine.operations.append(f"systemctl {', '.join(steps)} {unit}")
    mine.steps += [s for s in steps if s not in mine.steps]


def restart(subject: str, why: str) -> None:
    """Whether ``subject`` (the gateway, the host: a reboot) restarts, and why."""
    if collecting():
        notes().restarts[subject] = why
