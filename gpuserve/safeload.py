"""Bounded YAML and JSON loading: the one door every user- or host-provided document uses.

Why one module: a few hundred bytes of YAML aliases expand without bound ("billion
laughs"), a few kilobytes of ``[[[[`` exhaust Python's recursion, and ``json`` accepts
``NaN``/``Infinity``/``1e999``, which then reach the planner as tracebacks or silently
disable a timeout. The limits (:class:`Limits`) live here, and every refusal is an
:class:`InputError` naming the file (and the line when the parser knows it).

How: docs/security.md, "gpuserve.safeload: the limits and why each exists"
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent

from gpuserve.errors import InputError

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Bounds for one kind of document (why each exists: docs/security.md, safeload)."""

    max_bytes: int = 4 * MiB
    max_depth: int = 64
    max_nodes: int = 200_000
    max_aliases: int = 100
    finite: bool = True
    #: Python's ``json`` extensions ``NaN``/``Infinity``: only for catalogs generated
    #: from argparse defaults (``--request-rate`` defaults to ``inf``), never user input.
    json_constants: bool = False

    def but(self, **changes: Any) -> Limits:
        """A copy with some limits changed (``CONFIG.but(max_bytes=64 * MiB)``)."""
        return replace(self, **changes)


#: Hand-written configuration: profiles, host data, model records, gpus.yaml, rules.
CONFIG = Limits()
#: Machine-written documents: flag/bench catalogs, locks, facts, result records,
#: checkpoint scans. Larger (records accumulate), still shallow.
DATA = Limits(max_bytes=64 * MiB, max_nodes=2_000_000)
#: Text logs (startup logs, benchmark output) read whole.
LOG_MAX_BYTES = 64 * MiB


def not_regular(mode: int) -> str | None:
    """What a file of ``st_mode`` is when it is not a regular file (``a FIFO``,
    ``a directory``, ...), else None."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def file_version(path: str | Path) -> tuple[int, int, int] | None:
    """``(mtime_ns, size, inode)`` of ``path`` (symlinks followed), None when it cannot be
    stat'ed: the key under which a reader may keep what it parsed from one version of a
    file for the rest of the process (a tune reads the same profiles and model record for
    every candidate); the read itself still goes through this module's doors."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def regular_file(path: str | Path, field: str | None = None,
                 max_bytes: int | None = None) -> Path:
    """``path`` when it names a regular file (symlinks followed) of at most ``max_bytes``,
    else InputError naming it and what it is; checked with ``stat``, nothing is opened.
    For files another program reads (pyinfra's inventory loader), where
    :func:`read_bytes` cannot be the door."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(path, field, f"cannot read: {exc.strerror or exc}") from exc
    what = not_regular(st.st_mode)
    if what:
        raise InputError(path, field, f"is {what}, not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(path, field, f"file too large (over {_size(max_bytes)})")
    return Path(path)


def read_bytes(path: str | Path, max_bytes: int = CONFIG.max_bytes,
               field: str | None = None) -> bytes:
    """Read a regular file whole, refusing one larger than ``max_bytes`` without reading
    it all, and anything else (a FIFO, a device, a directory) without reading at all.

    Why: opening a FIFO that no process writes to waits forever (``gpuserve wheelhouse
    --lock fifo`` hung), ``/dev/zero`` never ends and ``/dev/urandom`` is not a document.
    Opened non-blocking (so the open of a FIFO cannot wait), then ``fstat`` on what was
    opened decides (no window between a check and the open). The size is checked on
    what was read too, so a file that grows while being read cannot slip past."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(path, field, f"cannot read: {exc.strerror or exc}") from exc
    what = not_regular(os.fstat(fd).st_mode)
    if what:
        os.close(fd)
        raise InputError(path, field, f"is {what}, not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            os.set_blocking(fd, True)
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise InputError(path, field, f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        raise InputError(path, field, f"file too large (over {_size(max_bytes)})")
    return data


def read_text(path: str | Path, max_bytes: int = CONFIG.max_bytes) -> str:
    """``read_bytes`` decoded as UTF-8, refusing other encodings with the file named."""
    return decode(read_bytes(path, max_bytes), path)


def decode(data: bytes | str, file: str | Path | None) -> str:
    """UTF-8 text from ``data``, or InputError naming the file and the line of the bad byte."""
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(file, None, f"not UTF-8 text: {exc.reason}", line) from exc


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


def _check_size(text: str | bytes, file: str | Path | None, limits: Limits) -> None:
    # Characters, not bytes, for str: a cheap upper-bound check that needs no encoding.
    if len(text) > limits.max_bytes:
        raise InputError(file, None, f"document too large (over {_size(limits.max_bytes)})")


# --------------------------------------------------------------------------- YAML


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts depth, expanded nodes and aliases while composing.

    Composition is where aliases are resolved and where PyYAML recurses, so the bounds
    are enforced before anything walks the tree. Heights and expanded sizes are kept per
    node (by id) so an alias is charged what it stands for."""

    def __init__(self, stream: str, file: str | Path | None, limits: Limits) -> None:
        super().__init__(stream)
        self.file = file
        self.limits = limits
        self._depth = 0
        self._nodes = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}
        self._heights: dict[int, int] = {}
        self._path: list[str | None] = []  # the dotted field being composed

    def _refuse(self, message: str, mark: Any) -> InputError:
        return InputError(self.file, None, message, mark.line + 1 if mark else None)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            self._aliases += 1
            if self._aliases > self.limits.max_aliases:
                raise self._refuse(
                    f"too many YAML aliases (more than {self.limits.max_aliases})",
                    event.start_mark,
                )
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise self._refuse(f"recursive YAML alias *{event.anchor}", event.start_mark)
            self._charge(self._sizes[id(node)], event.start_mark)
            if self._depth + self._heights[id(node)] > self.limits.max_depth:
                raise self._refuse(self._deep(), event.start_mark)
            return node
        event = self.peek_event()
        mark = event.start_mark
        self._depth += 1
        if self._depth > self.limits.max_depth:
            raise self._refuse(self._deep(), mark)
        self._path.append(_step(index))
        if getattr(event, "tag", None) is not None:
            raise self._tagged(event.tag, mark)
        before = self._nodes
        self._charge(1, mark)
        node = super().compose_node(parent, index)
        self._path.pop()
        self._depth -= 1
        self._sizes[id(node)] = self._nodes - before
        self._heights[id(node)] = 1 + max(
            (self._heights.get(id(child), 1) for child in _children(node)), default=0
        )
        return node

    def _tagged(self, tag: str, mark: Any) -> InputError:
        """Every explicit tag is refused, on scalars, mappings and lists alike.

        Why: on a scalar SafeLoader refused an unknown tag, but on a mapping or a list
        (``extra_args: !!python/object/apply:os.system [...]``) the profile reader, which
        walks nodes, silently dropped it. No format of ours needs a tag."""
        shown = tag.replace("tag:yaml.org,2002:", "!!")
        field = ".".join(p for p in self._path if p is not None).replace(".[", "[")
        return InputError(self.file, field or None, f"invalid YAML: tag {shown[:80]} is not "
                          "allowed (gpuserve's loader has no constructor for any tag: no "
                          "document of ours uses them)", mark.line + 1)

    def _charge(self, nodes: int, mark: Any) -> None:
        self._nodes += nodes
        if self._nodes > self.limits.max_nodes:
            raise self._refuse(
                f"document too large: more than {self.limits.max_nodes} YAML nodes "
                "(aliases count as what they expand to)",
                mark,
            )

    def _deep(self) -> str:
        return f"nested too deeply (more than {self.limits.max_depth} levels)"

    def construct_yaml_float(self, node: Any) -> float:
        value = super().construct_yaml_float(node)
        if self.limits.finite and not math.isfinite(value):
            raise InputError(
                self.file, None, f"{node.value!r} is not a finite number", node.start_mark.line + 1
            )
        return value


    def construct_yaml_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:  # more digits than Python converts (4300 by default)
            raise InputError(
                self.file, None, "integer too long", node.start_mark.line + 1
            ) from exc


BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def _step(index: Any) -> str | None:
    """One step of the dotted field: a mapping value's key, ``[i]`` in a list, or None
    for the root and for a key itself (``compose_node``'s ``index`` argument)."""
    if isinstance(index, yaml.ScalarNode):
        return str(index.value)[:80]
    if isinstance(index, int) and not isinstance(index, bool):
        return f"[{index}]"
    return None


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _yaml_error(exc: BaseException, file: str | Path | None, text: str) -> InputError:
    """An InputError for anything PyYAML raised, with the line when it is known."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return InputError(file, None, f"invalid YAML: {exc.problem or exc}", line)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text[: exc.position].count("\n") + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return InputError(
            file, None, f"invalid YAML: control character U+{code:04X} is not allowed", line
        )
    if isinstance(exc, RecursionError):
        return InputError(file, None, "nested too deeply")
    if isinstance(exc, ValueError | OverflowError):
        # e.g. an integer of more than 4300 digits (int-to-str conversion limit).
        return InputError(file, None, f"invalid value: {str(exc).split(':')[0]}")
    return InputError(file, None, f"invalid YAML: {exc}")


_YAML_FAILURES = (yaml.YAMLError, RecursionError, ValueError, OverflowError)


def compose_yaml(
    text: str | bytes, file: str | Path | None, limits: Limits = CONFIG
) -> tuple[BoundedLoader, yaml.Node | None]:
    """Compose one YAML document into nodes under ``limits``, for readers that need line
    numbers (profiles). Construct values with :func:`construct`; call
    ``loader.dispose()`` when done."""
    _check_size(text, file, limits)
    text = decode(text, file)
    try:
        loader = BoundedLoader(text, file, limits)  # the reader checks characters here
    except _YAML_FAILURES as exc:
        raise _yaml_error(exc, file, text) from exc
    try:
        return loader, loader.get_single_node()
    except _YAML_FAILURES as exc:
        loader.dispose()
        raise _yaml_error(exc, file, text) from exc


def construct(loader: BoundedLoader, node: yaml.Node) -> Any:
    """``loader.construct_object(node, deep=True)`` with every failure an InputError."""
    try:
        return loader.construct_object(node, deep=True)
    except _YAML_FAILURES as exc:
        raise _yaml_error(exc, loader.file, "") from exc


def load_yaml(text: str | bytes, file: str | Path | None, limits: Limits = CONFIG) -> Any:
    """``yaml.safe_load`` under ``limits``; an empty document is ``None``."""
    loader, node = compose_yaml(text, file, limits)
    try:
        return None if node is None else construct(loader, node)
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, limits: Limits = CONFIG) -> Any:
    """Read and load a YAML file under ``limits`` (size checked before reading it whole)."""
    return load_yaml(read_bytes(path, limits.max_bytes), path, limits)


# --------------------------------------------------------------------------- JSON

#: A JSON string (escapes included) or one bracket; strings are matched whole so a
#: bracket inside one is skipped, and the regex engine (C) does the per-character work.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', re.S)


def json_depth_exceeds(text: str, max_depth: int) -> int | None:
    """The 1-based line where nesting first exceeds ``max_depth``, else None.

    Iterative, so it cannot itself overflow; a quick ``count`` skips the scan for
    documents that do not even contain ``max_depth`` opening brackets."""
    if text.count("[") + text.count("{") <= max_depth:
        return None
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                return text.count("\n", 0, match.start()) + 1
        elif token in "]}":
            depth -= 1
    return None


def loads_json(
    text: str | bytes, file: str | Path | None, limits: Limits = DATA, line: int | None = None
) -> Any:
    """``json.loads`` under ``limits``: size, depth (checked before parsing), finite
    numbers; any failure is an InputError naming ``file`` (and ``line``: the caller's
    line for one JSON line of a larger file, else the parser's)."""
    _check_size(text, file, limits)
    text = decode(text, file)
    deep_at = json_depth_exceeds(text, limits.max_depth)
    if deep_at is not None:
        where = line if line is not None else deep_at
        raise InputError(
            file, None, f"nested too deeply (more than {limits.max_depth} levels)", where
        )
    # NaN/Infinity are not JSON (RFC 8259) and always refused; with ``finite=False`` an
    # overflowing literal (1e400 -> inf) is left to a reader that names the field.
    hooks: dict[str, Any] = {}
    if not limits.json_constants:
        hooks["parse_constant"] = _refuse_constant
    if limits.finite:
        hooks["parse_float"] = _finite_float
    try:
        return json.loads(text, **hooks)
    except _NonFinite as exc:
        where = line if line is not None else _line_of(text, exc.args[0])
        raise InputError(file, None, f"{exc.args[0]} is not a finite number", where) from exc
    except json.JSONDecodeError as exc:
        where = line if line is not None else exc.lineno
        raise InputError(file, None, f"invalid JSON: {exc.msg}", where) from exc
    except RecursionError as exc:
        raise InputError(file, None, "nested too deeply", line) from exc
    except ValueError as exc:  # e.g. an integer beyond the int-to-str digit limit
        reason = str(exc).split(":")[0]
        raise InputError(file, None, f"invalid JSON value: {reason}", line) from exc


def check_value(value: Any, file: str | Path | None, field: str | None,
                limits: Limits = CONFIG) -> None:
    """Refuse an in-memory value (host data from a Python inventory or ``--data``) deeper,
    larger or with more items than a document under ``limits`` could be.

    Why: host data never passes a parser of ours, so ``[[[...]]]`` 200,000 deep (two lines
    of Python) reached the checks, and the first ``{value!r}`` in an error message died
    in a RecursionError traceback; a 50 MB string went into the unit's env file. The walk
    is iterative (no recursion of its own) and stops at the first bound, so a cyclic
    list (``x.append(x)``) is refused by the item count."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = text = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > limits.max_depth:
            raise InputError(file, field, f"nested too deeply (more than {limits.max_depth} "
                             "levels)")
        if nodes > limits.max_nodes:
            raise InputError(file, field, f"too large (more than {limits.max_nodes:,} "
                             "items)")
        if isinstance(item, str | bytes):
            text += len(item)
            if text > limits.max_bytes:
                raise InputError(file, field, f"too large (more than "
                                 f"{_size(limits.max_bytes)} of text)")
        elif isinstance(item, dict):
            for key, sub in item.items():
                stack += [(key, depth + 1), (sub, depth + 1)]
        elif isinstance(item, list | tuple | set | frozenset):
            stack += [(sub, depth + 1) for sub in item]


def load_json_file(path: str | Path, limits: Limits = DATA) -> Any:
    """Read and parse a JSON file under ``limits``."""
    return loads_json(read_bytes(path, limits.max_bytes), path, limits)


def _line_of(text: str, literal: str) -> int | None:
    """The line of the first ``literal`` outside a JSON string (the json module's
    constant and float hooks get no position; a 90 kB lock needs one)."""
    scan = re.compile(r'"(?:[^"\\]|\\.)*"|' + re.escape(literal))
    hit = next((m for m in scan.finditer(text) if not m.group().startswith('"')), None)
    return text.count("\n", 0, hit.start()) + 1 if hit else None


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value
