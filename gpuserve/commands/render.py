"""``gpuserve render``: show the exact SGLang command line and env a profile becomes.

Why a command: the flag spelling depends on the SGLang version (gpuserve.launch.dialect), and
seeing the rendered argv before deploying is the quickest review of a profile.

Two forms. ``render INVENTORY --limit HOST``: what the serve deploy would run on that
host, from its host data and records (the models directory, the bind address, the NCCL
env and the flags the measured gates add), computed by the deploy's own plan in a
read-only run (roles/deploys/operate.py). ``render --profile P``: the profile alone,
host-free, and it says so.
"""

from __future__ import annotations

import argparse
import shlex

from gpuserve.errors import InputError
from gpuserve.launch.catalog import load_catalog
from gpuserve.launch.dialect import group_args, render_launch, target_version
from gpuserve.launch.profiles import load_profile
from gpuserve.launch.secrets import is_secret_env_name, redact_args
from gpuserve.redact import REDACTED

LAUNCHER = "python -m sglang.launch_server"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "render",
        help="print the SGLang argv and env a profile renders to",
        description="Render a launch profile for one SGLang version; the argv is validated "
        "against that version's flag catalog.",
    )
    parser.add_argument("inventory", nargs="?",
                        help="pyinfra inventory: render what the serve deploy would run on "
                        "--limit HOST (connects to read it; changes nothing)")
    parser.add_argument("--limit", help="the inventory's host (optional for one host)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override host data, as pyinfra's --data (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="with INVENTORY: the launch as JSON (argv, env with files)")
    parser.add_argument("--profile", help="profile name or path (the host-free form)")
    parser.add_argument("--sglang-version", dest="sglang_version",
                        help="target SGLang version (default: newest the profile targets)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "inventory", None):
        if args.profile or args.sglang_version:
            raise InputError("--profile", None, "give an INVENTORY (the host's launch) or "
                             "--profile (host-free), not both; the host's data names its "
                             "profile (--data profile=P to try another)")
        return run_host(args)
    if args.profile is None:
        raise InputError("--profile", None, "required without an INVENTORY")
    profile = load_profile(args.profile)
    version = args.sglang_version or target_version(profile)
    launch = render_launch(profile, version)
    print(f"# profile {profile.name} ({profile.source}) for SGLang {version}")
    print("# host-free: the profile alone. On a host the deploy uses its models "
          "directory, its bind address, its NCCL env and the flags its measured gates "
          "add: gpuserve render INVENTORY --limit HOST")
    print("# env")
    for key, value in sorted(launch.env.items()):
        shown = REDACTED if is_secret_env_name(key) else value
        print(f"{key}={shlex.quote(shown)}")
    print("# argv")
    # load_profile refuses secrets already; a terminal and a CI log are still no place
    # for one, so a secret option (resolved like SGLang's parser: --api-k) is masked
    print(format_argv(redact_args(launch.args, load_catalog(launch.version))))
    return 0


def format_argv(args: list[str], launcher: str = LAUNCHER) -> str:
    """Shell-quoted, one flag (with its values) per line, continued with backslashes."""
    lines = [launcher] + ["  " + shlex.join(group) for group in group_args(args)]
    return " \\\n".join(lines)


#: The read-only deploy that plans the host as the serve deploy does.
LAUNCH_DEPLOY = "gpuserve.roles.deploys.operate.serve_launch"


def run_host(args: argparse.Namespace) -> int:
    """The launch the serve deploy would run on one host of the inventory."""
    import json

    from gpuserve.commands._readonly import host_data, read_document
    from gpuserve.serve.launch_view import SCHEMA, view_of

    name, _ = host_data(args.inventory, args.limit, args.data)
    doc = read_document(args.inventory, name, LAUNCH_DEPLOY, args.data)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(args.inventory, name, f"the read-only run wrote no {SCHEMA} document")
    view = view_of(doc, f"{args.inventory} ({name})")
    if args.json:
        print(json.dumps({**view.to_dict(), "running": doc.get("running")}, indent=2))
        return 0
    print(f"# host {view.host} ({args.inventory}): profile {view.profile} for SGLang "
          f"{view.sglang_version}, lock {view.lock}; what the serve deploy runs there")
    print(running_line(doc.get("running"), view.profile))
    effective = view.effective_env()
    shown_from = {key: where for key, _, where in view.env}
    for where in dict.fromkeys(w for _, _, w in view.env):
        print(f"# env from {where}")
        for key, value in sorted(effective.items()):
            if shown_from[key] == where:
                print(f"{key}={shlex.quote(value)}")
    print("# argv")
    print(format_argv(list(view.args), launcher=shlex.join(view.launcher)))
    return 0


def running_line(doc: object, desired: str | None) -> str:
    """``# running: P since T (launch H)``, and the difference from what the host data
    names (gpuserve/serve/running.py); the host's record, read in the same run."""
    from gpuserve.serve.running import difference, from_dict

    running = from_dict(doc)
    if running is None:
        return "# running: nothing recorded on the host yet (no serve deploy has passed there)"
    diff = difference(running, desired)
    if diff is None:
        return f"# running: {running.short()}: the same profile"
    return f"# running: {running.short()}: DIFFERS: {diff}"
