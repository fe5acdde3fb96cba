"""Lab locks: hash-pinned SGLang stacks of the mirror's stand-in wheels, by the real tool.

The serve deploy installs SGLang only from a lock (``sglang-<V>-cu<major>-py<XY>.json``,
tools/gen_lock.py). For the lab's stand-ins there is no PyPI lock, so ``publish``
runs the same tool over the mirror's wheels, offline, for the guest's Python and glibc
(Debian 12: 3.11, 2.36), once per SGLang stand-in, and writes the locks to
``mirror_root/locks`` on the controller; inventory/lab.py points ``sglang_locks_dir``
at that directory. Nothing is regenerated while the wheels, the tool and this module
are unchanged (a stamp file holds their digest).

The tool resolves with ``--find-links <mirror>/wheels`` and ``--index-url`` set to the
same directory, which holds no project pages: pip finds every candidate through
find-links and never reaches PyPI. The lock's ``url`` fields are those controller
paths (file://); what the deploy installs is pinned by name, version and sha256.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lab import sglang_standin

REPO_ROOT = Path(__file__).resolve().parent.parent
GEN_LOCK = REPO_ROOT / "tools" / "gen_lock.py"
SUBDIR = "locks"
STAMP = ".gpuserve-inputs"
# The guest: Debian 12's python3 and glibc (lab/recipe.yaml installs Debian packages only).
GUEST_PYTHON = "3.11"
GUEST_GLIBC = "2.36"


def locks_dir(mirror_root: Path | str) -> Path:
    """Where the lab locks of an instance's mirror live (controller path)."""
    return Path(mirror_root) / SUBDIR


def lock_name(sglang_version: str, cuda_major: int = 13, python: str = GUEST_PYTHON) -> str:
    """The file name gen_lock.py gives a lock: ``sglang-0.5.23+lab-cu13-py311.json``."""
    return f"sglang-{sglang_version}-cu{cuda_major}-py{python.replace('.', '')}.json"


def _inputs_digest(wheels: Path, versions: list[str]) -> str:
    h = hashlib.sha256()
    for part in (GEN_LOCK.read_bytes(), Path(__file__).read_bytes(),
                 f"{GUEST_PYTHON} {GUEST_GLIBC} {' '.join(versions)}".encode()):
        h.update(hashlib.sha256(part).digest())
    for wheel in sorted(wheels.glob("*.whl")):
        h.update(wheel.name.encode() + b"\0" + hashlib.sha256(wheel.read_bytes()).digest())
    return h.hexdigest()


def generate(wheels: Path, version: str, out_dir: Path, python: str = sys.executable) -> Path:
    """Run tools/gen_lock.py for ``sglang==version`` over ``wheels``; return the lock path."""
    if not GEN_LOCK.exists():
        raise RuntimeError(f"{GEN_LOCK} does not exist: the lab's locks are made by it")
    wheels = wheels.resolve()
    cmd = [python, str(GEN_LOCK), version, "--python", GUEST_PYTHON, "--glibc", GUEST_GLIBC,
           "--find-links", str(wheels), "--index-url", wheels.as_uri(),
           "--out-dir", str(out_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"tools/gen_lock.py {version} over {wheels} failed "
                           f"(exit {proc.returncode}):\n{proc.stderr.strip()[-3000:]}")
    found = sorted(out_dir.glob(f"sglang-{version}-cu*-py{GUEST_PYTHON.replace('.', '')}.json"))
    if len(found) != 1:
        raise RuntimeError(f"tools/gen_lock.py {version} wrote {[p.name for p in found]} "
                           f"into {out_dir}, expected one lock")
    return found[0]


def publish(mirror_root: Path) -> None:
    """Write a lock per SGLang stand-in into ``mirror_root/locks`` (after the wheels)."""
    wheels = Path(mirror_root) / "wheels"
    out = locks_dir(mirror_root)
    if not GEN_LOCK.exists():
        print(f"lab: warning: {GEN_LOCK} does not exist; no lab locks written, so the "
              "serve deploy will find no lock for the stand-ins", file=sys.stderr)
        return
    versions = sglang_standin.standin_versions()
    digest = _inputs_digest(wheels, versions)
    stamp = out / STAMP
    if stamp.exists() and stamp.read_text().strip() == digest:
        return
    with tempfile.TemporaryDirectory(prefix="gpuserve-lab-locks-") as tmp:
        fresh = Path(tmp) / "locks"
        fresh.mkdir()
        for version in versions:
            generate(wheels, version, fresh)
        (fresh / STAMP).write_text(digest + "\n")
        staging = out.with_name(f".{SUBDIR}.new")
        if staging.exists():
            shutil.rmtree(staging)
        shutil.copytree(fresh, staging)
    if out.exists():
        shutil.rmtree(out)
    staging.replace(out)
