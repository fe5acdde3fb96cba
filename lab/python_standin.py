"""The lab's stand-in "managed CPython": an archive with python-build-standalone's
``install_only`` layout, built from the lab image's own Debian python3.11, published at
``python-builds/lab/`` of the lab mirror with a catalog of its own
(``python-builds/catalog.json``, the format of gpuserve/data/python/managed-cpython.json).

It is a stand-in, labelled as such in its catalog: not a python-build-standalone build.
What is real: the layout the serve deploy unpacks and checks (``python/bin/python3.11``,
``python/lib/python3.11/``, ``python/include/python3.11/Python.h``), the interpreter
(Debian's 3.11.2 binary and standard library from the image, which runs relocated: its
prefix follows the binary), and the headers (Debian's ``libpython3.11-dev`` of the same
version, downloaded from the image's Debian mirror and checked against that mirror's
Packages sha256). What differs: its ``-m venv`` bootstraps pip from the host's
``/usr/share/python-wheels`` (Debian's ensurepip), where a real build carries its own.
Lab only; product code never reads it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from pathlib import Path

FILENAME = "cpython-3.11.2+lab-x86_64-unknown-linux-gnu-install_only.tar.gz"
BUILD = "lab"


def _rootfs() -> Path | None:
    from lab.recipe import load_recipe
    from lab.state import images_dir

    root = images_dir() / f"rootfs-{load_recipe().rootfs_hash()[:16]}"
    return root if (root / ".gpuserve-rootfs-done").exists() else None


def _package(rootfs: Path, name: str) -> dict[str, str]:
    """The Packages stanza of ``name`` in the image's own apt lists."""
    for lists in sorted((rootfs / "var/lib/apt/lists").glob("*_main_binary-amd64_Packages")):
        for stanza in lists.read_text().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                          if ": " in line and not line.startswith(" "))
            if fields.get("Package") == name:
                return fields
    raise RuntimeError(f"{name} is not in the lab image's apt lists")


def _headers(rootfs: Path, work: Path, mirror: str) -> Path:
    """usr/include of Debian's libpython3.11-dev, of the image's python3.11 version."""
    deb = _package(rootfs, "libpython3.11-dev")
    data = urllib.request.urlopen(f"{mirror.rstrip('/')}/{deb['Filename']}", timeout=120).read()
    if hashlib.sha256(data).hexdigest() != deb["SHA256"]:
        raise RuntimeError(f"{deb['Filename']}: sha256 differs from the mirror's Packages")
    (work / "dev.deb").write_bytes(data)
    subprocess.run(["dpkg-deb", "-x", str(work / "dev.deb"), str(work / "dev")], check=True)
    return work / "dev" / "usr" / "include"


def _tree(rootfs: Path, include: Path, work: Path) -> Path:
    top = work / "python"
    (top / "bin").mkdir(parents=True)
    shutil.copy2(rootfs / "usr/bin/python3.11", top / "bin/python3.11")
    (top / "bin/python3").symlink_to("python3.11")
    shutil.copytree(rootfs / "usr/lib/python3.11", top / "lib/python3.11", symlinks=True)
    shutil.copytree(include / "python3.11", top / "include/python3.11", symlinks=True)
    # Debian's pyconfig.h only includes the multiarch one: put that one in its place
    (top / "include/python3.11/pyconfig.h").unlink()
    shutil.copy2(include / "x86_64-linux-gnu/python3.11/pyconfig.h",
                 top / "include/python3.11/pyconfig.h")
    return top


def _archive(top: Path, dest: Path) -> None:
    """A reproducible tar.gz (sorted names, zero times and owners): one sha256 per
    input, so republishing keeps the catalog's hash."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted([top, *top.rglob("*")]):
            info = tar.gettarinfo(str(path), str(path.relative_to(top.parent)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    with dest.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(buf.getvalue())


def publish(mirror_root: Path) -> None:
    rootfs = _rootfs()
    if rootfs is None:
        print("lab: warning: no lab image rootfs yet; the managed-CPython stand-in is "
              "not published")
        return
    from lab.recipe import load_recipe

    out = mirror_root / "python-builds"
    catalog = out / "catalog.json"
    source = f"lab image rootfs {rootfs.name}"
    if catalog.is_file() and json.loads(catalog.read_text()).get("source", {}).get(
            "built_from") == source and (out / BUILD / FILENAME).is_file():
        return
    (out / BUILD).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        top = _tree(rootfs, _headers(rootfs, work, load_recipe().mirror), work)
        _archive(top, out / BUILD / FILENAME)
    body = (out / BUILD / FILENAME).read_bytes()
    doc = {"catalog_format": 1,
           "source": {"stand_in": "lab only: Debian's python3.11 of the lab image in "
                                  "python-build-standalone's install_only layout, not a "
                                  "python-build-standalone build (lab/python_standin.py)",
                      "built_from": source},
           "builds": [{"version": "3.11.2", "python": "3.11", "arch": "x86_64",
                       "build": BUILD, "filename": FILENAME,
                       "url": f"https://lab.invalid/python-builds/{BUILD}/{FILENAME}",
                       "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}]}
    catalog.write_text(json.dumps(doc, indent=2) + "\n")
