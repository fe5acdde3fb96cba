"""Errors that carry enough context for a user to fix their input without reading code."""

from __future__ import annotations

from pathlib import Path


class GpuserveError(Exception):
    """Base of every error gpuserve raises on purpose; the CLI prints it and exits 2."""


class InputError(GpuserveError):
    """Bad user input (profile, inventory data, model record, log, facts document).

    The message always names the file and the field, and the line when it is known,
    so that ``profiles/tp8.yaml:12: memory.mem_fraction_static: must be in (0, 1)``
    is all a user needs to see.
    """

    def __init__(
        self, file: str | Path | None, field: str | None, message: str, line: int | None = None
    ) -> None:
        self.file = str(file) if file is not None else None
        self.field = field
        self.line = line
        self.message = message
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


def one_of(value: object, source: str | Path | None, key: str, choices: tuple[str, ...],
           default: str) -> str:
    """A host-data mode: ``default`` when unset or empty, ``"off"`` for False, else one
    of ``choices`` (InputError naming ``key`` otherwise)."""
    if value is None or value == "":
        return default
    if value is False and "off" in choices:
        return "off"
    if value not in choices:
        raise InputError(source, key, f"must be one of {', '.join(choices)}, got {value!r}")
    return str(value)
