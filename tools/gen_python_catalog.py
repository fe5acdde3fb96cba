"""Write gpuserve/data/python/managed-cpython.json: the managed CPython builds the serve
deploy may install (python-build-standalone's ``install_only_stripped`` archives, as uv
installs them), each with its URL and sha256.

Source: uv's own table of python-build-standalone releases,
``crates/uv-python/download-metadata.json`` in astral-sh/uv (the file ``uv python install``
resolves from), given as a path with the commit it was read at:

    python tools/gen_python_catalog.py UV_CHECKOUT/crates/uv-python/download-metadata.json \
        --source-commit 26a9dd4b2125bc271b47855e1fa0c49af3365db5

The newest release of each wanted minor for Linux glibc x86_64 and aarch64 is kept. uv's
table carries no sizes: ``size`` stays null and ``gpuserve wheelhouse`` reports the size
once the archive is fetched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "gpuserve" / "data" / "python" / "managed-cpython.json"
MINORS = (11, 12, 13)
ARCHES = ("x86_64", "aarch64")


def pick(metadata: dict) -> list[dict]:
    """The newest stable install_only_stripped build per (minor, arch), Linux glibc."""
    best: dict[tuple[int, str], dict] = {}
    for entry in metadata.values():
        arch = entry["arch"]["family"] if isinstance(entry["arch"], dict) else entry["arch"]
        if (entry["name"] != "cpython" or entry["os"] != "linux" or entry["libc"] != "gnu"
                or entry.get("variant") or entry.get("prerelease") or arch not in ARCHES
                or entry["major"] != 3 or entry["minor"] not in MINORS
                or not entry["url"].endswith("-install_only_stripped.tar.gz")
                or (isinstance(entry["arch"], dict) and entry["arch"].get("variant"))):
            continue
        key = (entry["minor"], arch)
        if key not in best or entry["patch"] > best[key]["patch"]:
            best[key] = dict(entry, arch=arch)
    return [{"version": f"3.{e['minor']}.{e['patch']}", "python": f"3.{e['minor']}",
             "arch": e["arch"], "build": e.get("build") or e["url"].split("/")[-2],
             "filename": e["url"].rsplit("/", 1)[1].replace("%2B", "+"),
             "url": e["url"], "sha256": e["sha256"], "size": None}
            for _, e in sorted(best.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metadata", help="uv's crates/uv-python/download-metadata.json")
    parser.add_argument("--source-commit", required=True, help="the astral-sh/uv commit")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    builds = pick(json.loads(Path(args.metadata).read_text()))
    doc = {"catalog_format": 1,
           "source": {"repository": "astral-sh/uv",
                      "path": "crates/uv-python/download-metadata.json",
                      "commit": args.source_commit,
                      "upstream": "https://github.com/astral-sh/python-build-standalone/releases"},
           "builds": builds}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{len(builds)} builds -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
