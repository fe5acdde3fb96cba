"""Text for a terminal: control and format characters escaped, for every command.

Why one module: records, facts documents, inventories and profiles are files anyone can
edit, and host facts come from the hosts themselves. ESC[2J, a carriage return or a bidi
override printed raw clears or rewrites the reader's terminal and can hide or fake
lines. ``compare`` escaped its rows, but ``check`` printed host names,
``doctor`` a host's own hostname and every error message a profile's unknown key raw.
``gpuserve.cli.main`` now routes all output through :class:`EscapingWriter`, so no
command can forget; ``--json`` is unaffected (``json.dumps`` escapes them already).
The writer keeps ``\n`` (the commands' own line breaks), so a value that may hold one
(a host or file name) is escaped with :func:`printable` where it is formatted: check's
report, compare's notes and skipped files, doctor's host line, every error message.
Every other line break (CR, VT, FF, NEL, U+2028, U+2029) is escaped by the writer.
"""

from __future__ import annotations

import unicodedata
from typing import TextIO

_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def printable(text: str) -> str:
    """``text`` with control and format characters escaped as Python writes them (\\x1b,
    \\r, \\u202e); a newline too (callers keep their own line breaks, see
    :class:`EscapingWriter`)."""
    if text.isprintable():
        return text
    return "".join(
        c if c == " " or unicodedata.category(c) not in _UNPRINTABLE
        else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


class EscapingWriter:
    """A text stream that writes everything :func:`printable`, line breaks kept."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write("\n".join(printable(part) for part in text.split("\n")))
        return len(text)

    def __getattr__(self, name: str):  # flush, isatty, encoding, fileno ...
        return getattr(self.stream, name)


def escaped_key(text: str) -> str:
    """``text`` with every character that is not printable ASCII escaped (``m\\u043edel``).

    Why: a key with a lookalike letter (``mоdel``, Cyrillic о) printed raw reads as
    ``model`` in "unknown key", which sends the reader looking for the wrong mistake."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if c.isascii() and c.isprintable()
                   else c.encode("unicode_escape").decode("ascii") for c in text)


def non_ascii_note(text: str, most: int = 3) -> str:
    """``": it has U+043E CYRILLIC SMALL LETTER O, not ASCII"`` for a key with characters
    outside printable ASCII, else ``""`` (the names say which letter only looks right)."""
    odd = list(dict.fromkeys(c for c in text if not (c.isascii() and c.isprintable())))
    if not odd:
        return ""
    named = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in odd[:most])
    more = f" and {len(odd) - most} more" if len(odd) > most else ""
    return f": it has {named}{more}, not ASCII"


def signed_term(value: float, fmt: str = ".2f") -> str:
    """``value`` as a term after another in arithmetic shown to a reader: ``- 13.47`` for
    13.47, ``+ 13.47`` for -13.47, never ``- -13.47``."""
    return f"{'-' if value >= 0 else '+'} {abs(value):{fmt}}"
