"""``gpuserve weights``: fetch and verify a Hub revision for an air-gapped host.

Like ``gpuserve wheelhouse`` for the lock: run on a connected machine, it fills
``DIR/<org>--<name>/<commit>/`` with the very code the serve deploy runs on a host
(gpuserve/data/scripts/weights_fetch.py: resumable download, every file checked against
the Hub's sha256 or git sha1, the completion marker, read-only files). Copy the tree to
the host's models_dir (``rsync -a DIR/ host:/opt/gpuserve/models/``) and the serve
deploy finds the revision complete and fetches nothing; or point a profile's
``model.path`` at the copied directory. docs/weights.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from functools import cache
from types import ModuleType

from gpuserve.errors import GpuserveError, InputError
from gpuserve.launch.hf_source import parse_source, source_problem
from gpuserve.memory.remote import Where, hub_api, hub_errors, hub_module, resolve_commit
from gpuserve.paths import SCRIPTS_DIR


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "weights",
        help="fetch and verify a Hub revision into a directory, for an air-gapped host",
        description="Fetch org/name@revision into DIR/<org>--<name>/<commit>/, verify every "
        "file against the Hub's hashes and seal it (the layout of the host's models_dir). "
        "The token comes from $HF_TOKEN.",
    )
    parser.add_argument("--hf", required=True, help="org/name@<commit> (a branch is "
                        "resolved and the commit printed)")
    parser.add_argument("--hf-endpoint", dest="hf_endpoint",
                        help="the Hub or a mirror (default: $HF_ENDPOINT, else huggingface.co)")
    parser.add_argument("--timeout", type=float, default=86_400.0, metavar="S",
                        help="seconds the whole fetch may take (host data weights_timeout; "
                        "default 86400); the partial files stay and a rerun resumes them")
    parser.add_argument("--min-rate", dest="min_rate", type=float, default=None,
                        metavar="BYTES_S", help="bytes/s each download must average over "
                        "30 s (host data weights_min_rate; default 4096, 0: no floor)")
    parser.add_argument("--workers", type=int, default=8, metavar="N",
                        help="files downloaded at once (host data weights_workers; default 8)")
    parser.add_argument("dir", metavar="DIR", help="the models directory to fill")
    parser.set_defaults(func=run)


@cache
def fetch_module() -> ModuleType:
    """The host script, imported: the copy is made by the code the deploy runs."""
    spec = importlib.util.spec_from_file_location("gpuserve_weights_fetch",
                                                  SCRIPTS_DIR / "weights_fetch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_limits(args: argparse.Namespace) -> None:
    """The options' ranges (host data's), refused before any request."""
    if not 0 < args.timeout <= 30 * 86_400:
        raise InputError("--timeout", "timeout", "must be seconds in (0, 2592000], got "
                         f"{args.timeout:g}")
    if args.min_rate is not None and not 0 <= args.min_rate <= 1 << 30:
        raise InputError("--min-rate", "min_rate", "must be bytes/s in [0, 1073741824], "
                         f"got {args.min_rate:g}")
    if not 1 <= args.workers <= 64:
        raise InputError("--workers", "workers", f"must be in [1, 64], got {args.workers}")


def run(args: argparse.Namespace) -> int:
    problem = source_problem(args.hf, allow_floating=True)
    if problem:
        raise InputError("--hf", "hf", problem)
    source = parse_source(args.hf, True)
    _check_limits(args)
    endpoint = args.hf_endpoint or os.environ.get("HF_ENDPOINT") or None
    token = os.environ.get("HF_TOKEN") or None
    where = Where("--hf", "hf", "--hf-endpoint", "hf_endpoint", endpoint)
    deadline = time.monotonic() + args.timeout
    commit = resolve_commit(hub_api(endpoint, token, where), source, where)
    target = source.revision_dir(os.path.abspath(args.dir), commit)
    os.makedirs(source.repo_dir(os.path.abspath(args.dir)), exist_ok=True)
    module = fetch_module()

    def report(doc: dict) -> None:
        if doc.get("phase") in ("plan", "verify", "refetch"):
            print(f"weights: {doc.get('phase')}: {doc.get('bytes', 0):,} of "
                  f"{doc.get('total', 0):,} bytes present"
                  + (f"; fetched again: {', '.join(doc['bad'])}" if doc.get("bad") else ""))
        elif doc.get("phase") == "download":
            rate = float(doc.get("rate") or 0) / (1 << 20)
            print(f"weights: {doc['bytes']:,} of {doc['total']:,} bytes, {rate:.1f} MiB/s")

    try:
        with hub_errors(where, source):
            marker = module.fetch(source.repo_id, commit, target, endpoint=endpoint,
                                  token=token, report=report,
                                  options=module.FetchOptions(workers=args.workers,
                                                              min_rate=args.min_rate,
                                                              deadline=deadline))
    except module.Refused as e:
        raise GpuserveError(f"weights: {hub_module().one_line(e, (token,), 400)}") from None
    except OSError as e:  # the local directory (permissions, a full disk)
        raise GpuserveError(f"weights: {target}: {hub_module().one_line(e, (token,))}") \
            from None
    print(f"{source.repo_id}@{commit}: {len(marker['files'])} files, "
          f"{marker['total_bytes']:,} bytes, verified ({marker['verified']}): {target}")
    print(f"copy to the host: rsync -a {os.path.abspath(args.dir)}/ "
          "HOST:/opt/gpuserve/models/  (host data models_dir)")
    return 0
