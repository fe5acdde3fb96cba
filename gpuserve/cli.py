"""The ``gpuserve`` command line: ``gpuserve plan|doctor|render|compare|check|wheelhouse
...`` and ``gpuserve fleet status``.

Subcommands live in ``gpuserve.commands`` (one module each, ``fleet`` with verbs of its
own) and are discovered here, so adding one never means editing a central list.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from gpuserve import __version__, commands
from gpuserve.errors import GpuserveError
from gpuserve.terminal import EscapingWriter, printable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuserve",
        description="Plan, check and compare SGLang deployments on GPU hosts.",
    )
    parser.add_argument("--version", action="version", version=f"gpuserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # shared by commands (_readonly), no verb of its own
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; every line it prints (argparse's errors included) goes out with
    control characters escaped (gpuserve.terminal: inputs and host facts may hold
    ESC sequences)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingWriter(out), EscapingWriter(err)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GpuserveError as exc:
        # one line: a line break in a file name or value must not forge more lines
        print(f"gpuserve: error: {printable(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
