"""The command blocks of the user-facing docs, and which of them the lab runs.

Why: docs that run as written. tests/lab/test_docs_run.py runs every ``sh`` block of
:data:`DOCS` on one lab host, in document order; a block that cannot run there carries
a visible marker on the line right above its fence, which this reads:

- ``*On a real GPU host:*``: listed and skipped (it names ``inventory/gpu.py`` or
  another real host);
- ``*Run by PATH ...:*``: run by that test (PATH exists), so not again here;
- ``*Not run by the docs test: REASON:*``: listed with its reason.

Blocks in other languages (``python``, ``yaml``, output without a language) are text,
not commands. Pure: file texts in, blocks out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = ("README.md", "docs/getting-started.md", "docs/metrics.md", "docs/deploys.md")
COMMAND_LANGS = ("sh", "bash", "shell")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\*(?:(?P<gpu>On a real GPU host)|Run by (?P<by>\S+)(?P<how>[^*]*)|"
                     r"Not run by the docs test: (?P<why>[^*]+?)):?\*$")


@dataclass(frozen=True)
class Block:
    """One fenced command block: where it is, its text, and how the lab treats it."""

    doc: str
    line: int  # the fence's line, 1-based
    text: str
    kind: str  # "run", "gpu", "run_by", "not_run"
    note: str = ""  # run_by: the test's path; not_run: the reason

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def commands(self) -> list[str]:
        """The block's command lines, comments and blank lines left out."""
        return [line for line in self.text.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def _marker(lines: list[str], fence: int) -> tuple[str, str]:
    """(kind, note) from the last non-blank line above the fence at index ``fence``."""
    for line in reversed(lines[:fence]):
        if line.strip():
            found = _MARKER.match(line.strip())
            if found is None:
                return "run", ""
            if found["gpu"]:
                return "gpu", ""
            if found["by"]:
                return "run_by", found["by"]
            return "not_run", found["why"].strip()
    return "run", ""


def blocks_of(doc: str, text: str) -> list[Block]:
    """Every fenced command block of one document (``doc``: its name in messages)."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"),
                   len(lines))
        if fence[2] in COMMAND_LANGS:
            kind, note = _marker(lines, i)
            indent = len(fence[1])
            body = "\n".join(line[indent:] for line in lines[i + 1:end])
            out.append(Block(doc, i + 1, body, kind, note))
        i = end + 1
    return out


def doc_blocks(root: Path, docs: tuple[str, ...] = DOCS) -> list[Block]:
    """The blocks of ``docs`` under the repository ``root``, in order."""
    return [b for doc in docs for b in blocks_of(doc, (root / doc).read_text())]
