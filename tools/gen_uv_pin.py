"""Write gpuserve/data/tools/uv.json: the uv release the deploy installs venvs with, each
Linux wheel of it with its URL, sha256 and size, read from PyPI's JSON API.

Source: ``https://pypi.org/pypi/uv/<VERSION>/json`` (the ``urls`` of that release), the
same API tools/gen_lock.py cross-checks lock files against:

    python tools/gen_uv_pin.py 0.13.9

Only the manylinux wheels for x86_64 and aarch64 are kept (the hosts gpuserve serves
on); pip on the host picks the one its platform takes and checks it against the pin.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "gpuserve" / "data" / "tools" / "uv.json"
PYPI_JSON = "https://pypi.org/pypi"
FILES = "https://files.pythonhosted.org/packages/"
ARCHES = ("x86_64", "aarch64")


def canonical_url(base: str, url: str) -> str:
    """The file's files.pythonhosted.org URL (a mirror of the JSON API may serve its own
    relative one: the blake2b path ``ab/cd/<60 hex>/<file>`` is the same)."""
    full = urllib.parse.urljoin(base, url)
    m = re.search(r"/([0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{60}/[^/]+)$", full)
    if m is None:
        raise SystemExit(f"{full}: not a PyPI file URL")
    return FILES + m.group(1)


def release_files(version: str) -> tuple[str, list[dict]]:
    """(the document's URL, the release's files): the release document, or the
    project's ``releases`` where a mirror serves only the project document."""
    try:
        base = f"{PYPI_JSON}/uv/{version}/json"
        with urllib.request.urlopen(base, timeout=60) as resp:
            return base, json.load(resp)["urls"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    base = f"{PYPI_JSON}/uv/json"
    with urllib.request.urlopen(base, timeout=60) as resp:
        files = json.load(resp)["releases"].get(version)
    if not files:
        raise SystemExit(f"uv {version}: no such release on PyPI")
    return base, files


def pick(files: list[dict], base: str) -> list[dict]:
    """The release's manylinux wheels for :data:`ARCHES`, by file name."""
    wheels = []
    for f in files:
        name = f["filename"]
        arch = next((a for a in ARCHES if "manylinux_2_" in name and a in name), None)
        if f["packagetype"] != "bdist_wheel" or arch is None:
            continue
        wheels.append({"filename": name, "arch": arch, "url": canonical_url(base, f["url"]),
                       "sha256": f["digests"]["sha256"], "size": int(f["size"])})
    return sorted(wheels, key=lambda w: w["filename"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the uv release, e.g. 0.13.9")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    base, files = release_files(args.version)
    wheels = pick(files, base)
    if {w["arch"] for w in wheels} != set(ARCHES):
        raise SystemExit(f"uv {args.version}: no manylinux wheel for every one of {ARCHES}")
    out = {"pin_format": 1, "package": "uv", "version": args.version,
           "source": {"api": base, "generator": "tools/gen_uv_pin.py",
                      "date": datetime.date.today().isoformat()},
           "wheels": wheels}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"uv {out['version']}: {len(wheels)} wheels -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
