"""``gpuserve doctor``: check a profile against a host-facts document before deploying.

Exit status: 0 when no error-severity rule fires, 1 when one does (2 for bad input, as
for every command), so CI and deploy scripts can gate on it.
"""

from __future__ import annotations

import argparse
import json

from gpuserve.doctor.rules import diagnose, format_table, has_errors, resolve_version
from gpuserve.errors import InputError
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.catalog import load_catalog
from gpuserve.launch.profiles import load_profile
from gpuserve.terminal import printable


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check a profile against a host's facts (known failure modes)",
        description="Run the doctor rules over a launch profile, its rendered SGLang "
        "command line and a host-facts document.",
    )
    parser.add_argument("--profile", required=True, help="profile name or path")
    parser.add_argument(
        "--facts", required=True,
        help="host-facts JSON document, or the output of `pyinfra --json INVENTORY fact "
             "gpuserve.facts.document.HostFactsDocument`",
    )
    parser.add_argument("--host", help="which host, when --facts holds several")
    parser.add_argument("--sglang-version", dest="sglang_version",
                        help="target SGLang version (default: the host's, else the "
                        "newest the profile targets)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sglang_version:
        # an explicit version without a flag catalog is bad input (exit 2), not a finding
        try:
            load_catalog(args.sglang_version)
        except InputError as exc:
            raise InputError("--sglang-version", exc.field, exc.message) from None
    profile = load_profile(args.profile)
    facts = HostFacts.from_file(args.facts, args.host)
    version = resolve_version(profile, facts, args.sglang_version)
    findings = diagnose(profile, facts, version)
    if args.json:
        print(json.dumps({
            "profile": profile.name, "facts": args.facts, "sglang_version": version,
            "ok": not has_errors(findings), "unknown": facts.unknown(),
            "findings": [f.to_dict() for f in findings],
        }, indent=2))
    else:
        host = printable(str(facts.hostname or args.facts))  # one line, whatever the host says
        print(f"# doctor: profile {profile.name}, host {host}, "
              f"SGLang {version}")
        print(format_table(findings))
        print(unknown_line(facts, args.facts))
    return 1 if has_errors(findings) else 0


def unknown_line(facts: HostFacts, file: str) -> str:
    """What the facts left out, said after the findings. Why: ``{}`` (or a document
    whose keys are all misspelt or null) printed "doctor: no findings" and exited 0,
    which reads as a healthy host; the rules that need a missing fact cannot fire."""
    unknown = facts.unknown()
    if not unknown:
        return "# every area of the host facts is known"
    if len(unknown) == len(HostFacts().unknown()):
        return (f"# unknown: {file} holds no host facts at all ({', '.join(unknown)}); only "
                "rules about the profile itself were checked. Gather them with `pyinfra "
                "INVENTORY fact gpuserve.facts.document.HostFactsDocument`")
    return (f"# unknown (not in {file}): {', '.join(unknown)}; the rules that need them "
            "were not checked")
