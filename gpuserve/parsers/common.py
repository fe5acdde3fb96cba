"""Helpers shared by the parsers: line splitting and an error that names the line."""

from __future__ import annotations

import re
from collections.abc import Iterable

# nvidia-smi prints these in place of a value it cannot report.
NA_VALUES = frozenset({"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""})


class ParseError(ValueError):
    """Text that is not the tool's output; names the 1-based line and quotes it."""

    def __init__(self, message: str, line_no: int | None = None, line: str | None = None) -> None:
        self.line_no = line_no
        self.line = line
        where = f"line {line_no}: " if line_no is not None else ""
        quoted = f": {line!r}" if line is not None else ""
        super().__init__(f"{where}{message}{quoted}")


def as_lines(text: str | Iterable[str]) -> list[str]:
    """Accept a whole output string or pyinfra's list of stdout lines."""
    if isinstance(text, str):
        return text.splitlines()
    return [line.rstrip("\n") for line in text]


# SGR escapes (``ESC [ ... m``): nvidia-smi 580.159 underlines the header row of
# ``topo -m`` and ``topo -p2p`` even when its output is not a terminal.
_SGR_RE = re.compile(r"\x1b\[[0-9;]*m")


def strip_sgr(line: str) -> str:
    """The line without terminal colour/underline escapes."""
    return _SGR_RE.sub("", line)


def na_to_none(value: str) -> str | None:
    """Map nvidia-smi's "[N/A]" / "[Not Supported]" placeholders to None."""
    value = value.strip()
    return None if value in NA_VALUES else value
