"""``gpuserve quality INVENTORY --limit HOST``: the output-quality check of the launch a
host serves now, on demand: the shipped prompt set against the checkpoint's reference,
judged and recorded under ``results_dir/quality/`` like the serve deploy's check
(docs/quality.md). Read through a deploy that changes nothing on the host
(roles/deploys/quality.py). Exit status 1 when the launch fails the check.
"""

from __future__ import annotations

import argparse
import json

from gpuserve.errors import InputError

DEPLOY = "gpuserve.roles.deploys.quality.quality_now"
SCHEMA = "gpuserve.quality-check/1"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quality",
        help="check the output quality of the launch one host serves, against its reference",
        description="Send the quality prompt set to the SGLang server of one host (greedy "
        "and teacher-forced logprobs), judge it against the checkpoint's quality reference "
        "and the profile's thresholds, and record it (docs/quality.md). Changes nothing on "
        "the host; exit status 1 when the check fails.",
    )
    p.add_argument("inventory", help="pyinfra inventory (e.g. inventory/gpu.py)")
    p.add_argument("--limit", help="the inventory's host (optional for one host)")
    p.add_argument("--reference", action="store_true",
                   help="make this run the checkpoint's reference when it passes")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="override host data, as pyinfra's --data (repeatable)")
    p.add_argument("--json", action="store_true", help="the verdict as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuserve.commands._readonly import host_data, read_document

    name, _ = host_data(args.inventory, args.limit, args.data)
    extra = ["quality_reference=true"] if args.reference else []
    doc = read_document(args.inventory, name, DEPLOY, [*args.data, *extra])
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(args.inventory, name, f"the check wrote no {SCHEMA} document")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join(report(doc)))
    return 0 if doc.get("passed") else 1


def report(doc: dict) -> list[str]:
    """The lines a person reads: verdict, reference, figures, what failed."""
    head = f"{doc.get('host')}: quality of profile {doc.get('profile')}: "
    if doc.get("error"):
        return [head + f"not measured: {doc['error']}"]
    ref = doc.get("reference") or "none (sanity only; a pass becomes the reference)"
    lines = [head + ("passed" if doc.get("passed") else "FAILED"), f"  reference: {ref}",
             f"  {doc.get('summary', '')}"]
    lines += [f"  failed: {line}" for line in doc.get("failures") or []]
    return lines
