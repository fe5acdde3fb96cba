"""SGLang flag catalogs: which launch flags a given SGLang version accepts.

Why: SGLang renames and removes flags between releases (``--cuda-graph-max-bs``
became ambiguous in 0.5.20+, ``--nsa-*-backend`` became ``--dsa-*-backend``), and a
wrong flag only shows up when the server fails to start on the GPU host. The
catalogs under ``gpuserve/data/flags/`` are generated from the real wheels by
``tools/gen_flag_catalog.py``; this module loads them and judges a command line
by rebuilding SGLang's own argparse parser (``gpuserve.launch.flagparser``), so prefix
abbreviations, ambiguity and type/choice errors are decided by argparse itself,
exactly as on the host.

Standard library only (plus gpuserve.errors): no side effects, no network.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gpuserve import safeload, versions
from gpuserve.errors import InputError
from gpuserve.launch.flagparser import build_parser
from gpuserve.paths import DATA_DIR

_CATALOG_RE = re.compile(r"^sglang-(?P<version>.+)\.json$")


def _catalog_dir() -> Path:
    return DATA_DIR / "flags"


def base_version(version: str) -> str:
    """``0.5.23+cu130`` -> ``0.5.23``; also tolerates a leading ``v`` or ``sglang==``."""
    v = version.strip()
    v = v.removeprefix("sglang==").removeprefix("v")
    return v.split("+", 1)[0]


def available_versions() -> list[str]:
    """Versions with a committed catalog, oldest first."""
    found = []
    for path in _catalog_dir().glob("sglang-*.json"):
        m = _CATALOG_RE.match(path.name)
        if m:
            found.append(m.group("version"))
    return versions.ordered(found)


@dataclass(frozen=True)
class FlagOption:
    """One argparse action of SGLang's launch parser, as recorded in the catalog."""

    dest: str
    flags: tuple[str, ...]
    action: str
    type: str | None
    nargs: Any
    choices: tuple | None
    default: Any
    required: bool
    help: str | None
    const: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The primary spelling (what gpuserve renders)."""
        return self.flags[0]

    @property
    def takes_value(self) -> bool:
        return self.nargs != 0 and self.action not in (
            "store_true", "store_false", "store_const", "append_const", "count",
            "boolean_optional")


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """argparse reports via error() -> exit(2); we need the message as an exception.

    (``exit_on_error=False`` is not enough on Python 3.11: unrecognized and
    ambiguous options still call error().)
    """

    def error(self, message: str):  # type: ignore[override]
        raise _ParseError(message)

    def print_help(self, file=None) -> None:
        """-h/--help in a launch line would print help and exit; never from gpuserve."""

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise _ParseError("-h/--help prints the help text and exits: not a launch option")


class FlagCatalog:
    """The launch flags of one SGLang version."""

    def __init__(self, data: dict, path: Path | None = None) -> None:
        self.data = data
        self.path = path
        self.version: str = data["version"]
        self.source: str = data.get("source", "")
        self.prog: str = data.get("prog", "sglang serve")
        self.options: tuple[FlagOption, ...] = tuple(
            FlagOption(
                dest=o["dest"], flags=tuple(o["flags"]), action=o["action"], type=o["type"],
                nargs=o["nargs"],
                choices=tuple(o["choices"]) if o.get("choices") is not None else None,
                default=o.get("default"), required=bool(o.get("required")),
                help=o.get("help"), const=o.get("const"), extra=dict(o.get("extra") or {}),
            )
            for o in data["options"]
        )
        self._by_flag = {f: o for o in self.options for f in o.flags}
        self._parsers: dict[bool, argparse.ArgumentParser] = {}

    def __repr__(self) -> str:
        return f"<FlagCatalog sglang {self.version}: {len(self.options)} options>"

    # ---- lookups ---------------------------------------------------------

    @property
    def flags(self) -> frozenset[str]:
        """Every registered option string, aliases included (no abbreviations)."""
        return frozenset(self._by_flag)

    def has_flag(self, flag: str) -> bool:
        """True if ``flag`` is a registered spelling (not merely an abbreviation)."""
        return flag in self._by_flag

    def option(self, flag: str) -> FlagOption | None:
        """The option registered under exactly this spelling, or None."""
        return self._by_flag.get(flag)

    def by_dest(self, dest: str) -> list[FlagOption]:
        return [o for o in self.options if o.dest == dest]

    def resolve(self, flag: str) -> FlagOption:
        """Resolve ``flag`` like argparse: exact spelling, else a unique prefix.

        Raises InputError for unknown or ambiguous spellings.
        """
        flag = flag.split("=", 1)[0]
        if flag in self._by_flag:
            return self._by_flag[flag]
        hits: list[str] = []
        if flag.startswith("--") and self.data.get("allow_abbrev", True):
            # argparse also matches the -h/--help every parser has.
            hits = [f for f in ("--help", *self._by_flag) if f.startswith(flag)]
        if hits == ["--help"]:
            raise InputError(None, flag, f"{flag} abbreviates --help, not a launch option")
        if len(hits) == 1:
            return self._by_flag[hits[0]]
        if len(hits) > 1:
            raise InputError(None, flag, f"SGLang {self.version}: ambiguous option: {flag} "
                             f"could match {', '.join(hits)}")
        raise InputError(None, flag, f"SGLang {self.version} has no option {flag}")

    # ---- validation ------------------------------------------------------

    def parser(self, complete: bool = True) -> argparse.ArgumentParser:
        """SGLang's parser rebuilt from the catalog; error() raises instead of exiting.

        ``complete=False`` drops required-ness, for judging a fragment of a command
        line (e.g. a profile's ``extra_args``) on its own.
        """
        if complete not in self._parsers:
            data = self.data
            if not complete:
                data = dict(data, options=[dict(o, required=False) for o in data["options"]])
            self._parsers[complete] = build_parser(data, parser_class=_RaisingParser)
        return self._parsers[complete]

    def parse(self, args: list[str], *, complete: bool = True) -> argparse.Namespace:
        """Parse like SGLang; raises ValueError with argparse's own message."""
        try:
            return self.parser(complete).parse_args(list(args))
        except _ParseError as e:
            raise ValueError(str(e)) from None

    def validate(
        self,
        args: list[str],
        source: str | Path | None = None,
        field: str | None = "args",
        line: int | None = None,
        *,
        complete: bool = False,
    ) -> argparse.Namespace:
        """Judge ``args`` (the argv after ``python -m sglang.launch_server``) as SGLang would.

        Raises ``InputError(source, field, "SGLang X: <argparse message>", line)`` for
        unknown flags, ambiguous prefixes, bad choices, bad values and missing
        values; with ``complete=True`` also for missing required options
        (``--model-path``). Returns the parsed namespace otherwise.
        """
        bad = [a for a in args if not isinstance(a, str)]
        if bad:
            raise InputError(source, field, f"arguments must be strings, got {bad[0]!r}", line)
        if len(args) > DEDUPE_ABOVE:
            args = without_repeated_segments(args)
            options = sum(1 for a in args if _is_long_option(a))
            if options > MAX_OPTIONS:
                raise InputError(source, field, f"too many options ({options} distinct; "
                                 f"at most {MAX_OPTIONS}): not a real SGLang command line",
                                 line)
        try:
            return self.parse(args, complete=complete)
        except ValueError as e:
            raise InputError(source, field, f"SGLang {self.version}: {e}", line) from None


#: argparse (CPython 3.11-3.12, ``_parse_known_args``) scans every remaining option index
#: for each option it consumes: quadratic in the number of options (a 2 MB extra_args
#: list took minutes). Validation therefore drops repeated segments (linear, below) and
#: refuses more distinct options than any real command line has (SGLang has ~400 flags;
#: list-valued ones repeat a few times). Small argvs (every real one) go to argparse as
#: they are, so the returned namespace is exactly SGLang's.
DEDUPE_ABOVE = 512
MAX_OPTIONS = 2048


def _is_long_option(arg: str) -> bool:
    """True when argparse always classifies ``arg`` as an option string ('O'): it starts
    with ``--``, is not ``--`` itself and has no space (argparse's _parse_optional)."""
    return arg.startswith("--") and arg != "--" and " " not in arg


def without_repeated_segments(args: list[str]) -> list[str]:
    """``args`` with each repeat of an identical segment (a ``--long`` option and the
    tokens up to the next one) removed, in one pass.

    Validation-equivalent because an optional consumes only tokens before the next
    option string, so a segment parses the same wherever it stands, and parsing the
    same segment again sets the same values and sees no new action (mutually exclusive
    groups and required options look at the set of actions seen). Everything from a
    ``--`` on, and anything before the first option, is kept as it is; a parser with
    positionals would break the argument, and SGLang's has none."""
    head: list[str] = []
    out: list[str] = []
    seen: set[tuple[str, ...]] = set()
    segment: list[str] = []
    for index, arg in enumerate(args):
        if arg == "--":
            tail = args[index:]
            break
        if _is_long_option(arg) and segment:
            key = tuple(segment)
            if key not in seen:
                seen.add(key)
                out.extend(segment)
            segment = []
        (segment if segment or _is_long_option(arg) else head).append(arg)
    else:
        tail = []
    if segment and tuple(segment) not in seen:
        out.extend(segment)
    return head + out + tail


@cache
def _load(version: str) -> FlagCatalog:
    path = _catalog_dir() / f"sglang-{version}.json"
    return FlagCatalog(safeload.load_json_file(path), path)


def load_catalog(version: str) -> FlagCatalog:
    """The catalog for ``version`` (a local part such as ``+cu130`` is ignored).

    Raises InputError naming the available versions when there is none.
    """
    base = base_version(version)
    if base not in available_versions():
        raise InputError(
            None, "sglang_version",
            f"no flag catalog for SGLang {version!r}; available: "
            f"{', '.join(available_versions())} (add one with tools/gen_flag_catalog.py)",
        )
    return _load(base)
