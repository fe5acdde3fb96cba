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
    parser.add_argument(
        "--calibrate", metavar="FILE",
        help="the host's measured start of the same checkpoint and SGLang version: an "
        "SGLang startup log, or a start record the serve deploy kept "
        "(RESULTS/HOST/*-start-*.json); the memory rules judge the plan calibrated by it")
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
    measured = measured_start(args.calibrate, profile, version) if args.calibrate else None
    findings = diagnose(profile, facts, version, measured)
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


def measured_start(path: str, profile, version: str):
    """``--calibrate``: a start record (gpuserve.start/1) or a startup log as the
    calibration's measured start; one of another checkpoint or version is bad input."""
    from gpuserve import safeload
    from gpuserve.measure.starts import MAX_BYTES, parse_start, to_measured
    from gpuserve.memory.measured import MeasuredStart

    text = safeload.read_text(path, safeload.LOG_MAX_BYTES)
    if text.lstrip().startswith("{"):
        if len(text) > MAX_BYTES:
            raise InputError(path, None, f"a start record is at most {MAX_BYTES} bytes")
        measured = to_measured(parse_start(safeload.loads_json(text, path), path))
    else:
        measured = MeasuredStart.from_log(text, path)
    why = measured.mismatch(checkpoint=profile.model.path, sglang_version=version)
    if why:
        raise InputError(path, "--calibrate", f"cannot calibrate this launch: {why}")
    return measured


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
