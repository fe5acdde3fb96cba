"""``gpuserve render``: show the exact SGLang command line and env a profile becomes.

Why a command: the flag spelling depends on the SGLang version (gpuserve.launch.dialect), and
seeing the rendered argv before deploying is the quickest review of a profile.
"""

from __future__ import annotations

import argparse
import shlex

from gpuserve.launch.catalog import load_catalog
from gpuserve.launch.dialect import group_args, render_launch, target_version
from gpuserve.launch.profiles import load_profile
from gpuserve.launch.secrets import MASK, is_secret_env_name, redact_args

LAUNCHER = "python -m sglang.launch_server"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "render",
        help="print the SGLang argv and env a profile renders to",
        description="Render a launch profile for one SGLang version; the argv is validated "
        "against that version's flag catalog.",
    )
    parser.add_argument("--profile", required=True, help="profile name or path")
    parser.add_argument("--sglang-version", dest="sglang_version",
                        help="target SGLang version (default: newest the profile targets)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    version = args.sglang_version or target_version(profile)
    launch = render_launch(profile, version)
    print(f"# profile {profile.name} ({profile.source}) for SGLang {version}")
    print("# env")
    for key, value in sorted(launch.env.items()):
        shown = MASK if is_secret_env_name(key) else value
        print(f"{key}={shlex.quote(shown)}")
    print("# argv")
    # load_profile refuses secrets already; a terminal and a CI log are still no place
    # for one, so a secret option (resolved like SGLang's parser: --api-k) is masked
    print(format_argv(redact_args(launch.args, load_catalog(launch.version))))
    return 0


def format_argv(args: list[str]) -> str:
    """Shell-quoted, one flag (with its values) per line, continued with backslashes."""
    lines = [LAUNCHER] + ["  " + shlex.join(group) for group in group_args(args)]
    return " \\\n".join(lines)
