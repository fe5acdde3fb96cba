"""The ``sglang`` console script: ``sglang serve|version`` like sglang/cli/main.py."""

import argparse

from sglang.version import __version__


def _serve(extra_argv: list[str]) -> None:
    from sglang._standin.main import run

    # sglang/cli/serve.py: drop --model-type, allow `sglang serve <model> ...`.
    argv, i = [], 0
    while i < len(extra_argv):
        if extra_argv[i] == "--model-type":
            i += 2
            continue
        if extra_argv[i].startswith("--model-type="):
            i += 1
            continue
        argv.append(extra_argv[i])
        i += 1
    if argv and not argv[0].startswith("-"):
        argv = ["--model-path", argv[0], *argv[1:]]
    run(argv)


def main() -> None:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="subcommand", required=True)
    subparsers.add_parser("serve", help="Launch an SGLang server.", add_help=False)
    subparsers.add_parser("version", help="Show the version information.")
    args, extra_argv = parser.parse_known_args()
    if args.subcommand == "serve":
        _serve(extra_argv)
    elif args.subcommand == "version":
        print(f"sglang version: {__version__}")
        print("git revision: standin")


if __name__ == "__main__":
    main()
