"""Lab locks: hash-pinned SGLang stacks of the mirror's stand-in wheels, by the real tool.

The serve deploy installs SGLang only from a lock (``sglang-<V>-cu<major>-py<XY>.json``,
tools/gen_lock.py). For the lab's stand-ins there is no PyPI lock, so ``publish``
runs the same tool over the mirror's wheels, offline, for the guest's Python and glibc
(Debian 12: 3.11, 2.36), once per SGLang stand-in, and writes the locks to
``mirror_root/locks`` on the controller; inventory/lab.py points ``sglang_locks_dir``
at that directory. Nothing is regenerated while the wheels, the tool and this module
are unchanged (a stamp file holds their digest).

Real PyPI wheels (``pypi/``): SGLang's gateway (smg) is not stood in for. Its committed
lock (``gpuserve/data/locks/smg-<V>-py311.json``, generated from PyPI by the same tool)
names every wheel with its https URL and sha256; :func:`publish_pypi` downloads them on
this controller (once: kept under ``~/.cache/gpuserve/lab/pypi``), checks each sha256
against the lock before it is kept, and puts them in ``<mirror>/pypi/``, which the lab
inventory gives the router deploy as its find-links. The guest never reaches PyPI.

The Hub client (``wheels/``): real SGLang depends on huggingface_hub, and the weights step
runs its download with the SGLang venv's python. :func:`publish_hub_client` takes
``huggingface-hub`` and its dependency closure for the guest (Requires-Dist of each
wheel, markers evaluated for Debian 12's CPython 3.11 on x86_64) at the versions the real
lock ``gpuserve/data/locks/sglang-0.5.23-cu13-py311.json`` pins, downloads them once into
the same cache (sha256-checked against that lock) and puts them beside the stand-ins in
``<mirror>/wheels``, so the lab locks below include the real client.

uv (``wheels/`` and ``pypi/``): every locked venv is built by the pinned uv
(gpuserve/serve/uv.py), which the host installs from the lock's own find-links.
:func:`publish_uv` downloads the pin's x86_64 wheel once into the same cache (sha256
against ``gpuserve/data/tools/uv.json``) and puts it into both directories, so the lab
serves through uv-built venvs with no other network than the mirror.

The tool resolves with ``--find-links <mirror>/wheels`` and ``--index-url`` set to the
same directory, which holds no project pages: pip finds every candidate through
find-links and never reaches PyPI. The lock's ``url`` fields are those controller
paths (file://); what the deploy installs is pinned by name, version and sha256.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from lab import sglang_standin

REPO_ROOT = Path(__file__).resolve().parent.parent
GEN_LOCK = REPO_ROOT / "tools" / "gen_lock.py"
SUBDIR = "locks"
STAMP = ".gpuserve-inputs"
# The guest: Debian 12's python3 and glibc (lab/recipe.yaml installs Debian packages only).
GUEST_PYTHON = "3.11"
GUEST_GLIBC = "2.36"
PYPI_SUBDIR = "pypi"
#: Packages published from PyPI for real (their committed locks, for the guest's Python).
PYPI_PACKAGES = ("smg",)
#: The real SGLang lock whose huggingface-hub closure goes into wheels/ (the guest's Python).
HUB_CLIENT_LOCK = "sglang-0.5.23-cu13-py311.json"
HUB_CLIENT = "huggingface-hub"
#: The guest's marker environment (Debian 12: CPython 3.11.2 on x86_64 Linux).
GUEST_MARKERS = {"python_version": GUEST_PYTHON, "python_full_version": "3.11.2",
                 "platform_machine": "x86_64", "sys_platform": "linux",
                 "platform_system": "Linux", "os_name": "posix",
                 "implementation_name": "cpython", "platform_python_implementation": "CPython",
                 "extra": ""}


def locks_dir(mirror_root: Path | str) -> Path:
    """Where the lab locks of an instance's mirror live (controller path)."""
    return Path(mirror_root) / SUBDIR


#: A PD fleet's locks: the newest stand-in with the Mooncake stand-in resolved in
#: (gen_lock.py --with), in a directory of their own (inventory/lab_pd.py's locks dir).
PD_SUBDIR = "locks-pd"
PD_EXTRA = ("mooncake-transfer-engine",)


def pd_locks_dir(mirror_root: Path | str) -> Path:
    return Path(mirror_root) / PD_SUBDIR


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


def generate(wheels: Path, version: str, out_dir: Path, python: str = sys.executable,
             extra: tuple[str, ...] = ()) -> Path:
    """Run tools/gen_lock.py for ``sglang==version`` (and ``extra`` requirements) over
    ``wheels``; return the lock path."""
    if not GEN_LOCK.exists():
        raise RuntimeError(f"{GEN_LOCK} does not exist: the lab's locks are made by it")
    wheels = wheels.resolve()
    cmd = [python, str(GEN_LOCK), version, "--python", GUEST_PYTHON, "--glibc", GUEST_GLIBC,
           "--find-links", str(wheels), "--index-url", wheels.as_uri(),
           "--out-dir", str(out_dir), *(f"--with={r}" for r in extra)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"tools/gen_lock.py {version} over {wheels} failed "
                           f"(exit {proc.returncode}):\n{proc.stderr.strip()[-3000:]}")
    found = sorted(out_dir.glob(f"sglang-{version}-cu*-py{GUEST_PYTHON.replace('.', '')}.json"))
    if len(found) != 1:
        raise RuntimeError(f"tools/gen_lock.py {version} wrote {[p.name for p in found]} "
                           f"into {out_dir}, expected one lock")
    return found[0]


def pypi_cache() -> Path:
    from lab.state import lab_home

    return lab_home() / "pypi"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_wheel(url: str, sha256: str, dest: Path, timeout: float = 300) -> Path:
    """``url`` at ``dest`` once its sha256 is the lock's (a cached file is checked too;
    a download whose digest differs is deleted and refused)."""
    if dest.exists() and _sha256(dest) == sha256:
        return dest
    if not url.startswith("https://"):
        raise RuntimeError(f"{dest.name}: refusing to download over {url.split(':')[0]}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    req = urllib.request.Request(url, headers={"User-Agent": "gpuserve-lab/1"})
    with urllib.request.urlopen(req, timeout=timeout) as resp, tmp.open("wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    got = _sha256(tmp)
    if got != sha256:
        tmp.unlink()
        raise RuntimeError(f"{dest.name}: downloaded sha256 {got}, the lock says {sha256}")
    tmp.replace(dest)
    return dest


def publish_pypi(mirror_root: Path, locks_dir: Path | None = None) -> list[str]:
    """Every wheel of the committed locks of :data:`PYPI_PACKAGES` for the guest's Python
    into ``mirror_root/pypi`` (downloaded once into the cache, sha256-checked against the
    lock); returns the file names."""
    from gpuserve.launch.locks import app_locks

    out = Path(mirror_root) / PYPI_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for package in PYPI_PACKAGES:
        for lock in app_locks(package, locks_dir):
            if lock.supports(GUEST_PYTHON, GUEST_GLIBC) is not None:
                continue
            for pkg in lock.packages:
                cached = fetch_wheel(pkg.url, pkg.sha256, pypi_cache() / pkg.filename)
                target = out / pkg.filename
                if not (target.exists() and _sha256(target) == pkg.sha256):
                    tmp = target.with_name(f".{target.name}.new")
                    shutil.copyfile(cached, tmp)
                    tmp.replace(target)
                names.append(pkg.filename)
    return names


def _publish_file(cached: Path, target: Path, sha256: str) -> None:
    """``cached`` at ``target`` unless a file of that sha256 is there (renamed into place)."""
    if not (target.exists() and _sha256(target) == sha256):
        tmp = target.with_name(f".{target.name}.new")
        shutil.copyfile(cached, tmp)
        tmp.replace(target)


def publish_uv(mirror_root: Path) -> list[str]:
    """The pinned uv wheel for the guest (x86_64) into ``wheels/`` and ``pypi/``, the
    find-links of the SGLang and the gateway deploys; returns the file names."""
    from gpuserve.serve.uv import pin

    names = []
    for wheel in pin().wheels_for(GUEST_MARKERS["platform_machine"]):
        cached = fetch_wheel(wheel.url, wheel.sha256, pypi_cache() / wheel.filename)
        for sub in ("wheels", PYPI_SUBDIR):
            (Path(mirror_root) / sub).mkdir(parents=True, exist_ok=True)
            _publish_file(cached, Path(mirror_root) / sub / wheel.filename, wheel.sha256)
        names.append(wheel.filename)
    return names


def _wheel_requires(path: Path) -> list[str]:
    """The names a wheel requires on the guest (Requires-Dist, markers evaluated)."""
    import zipfile

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate(GUEST_MARKERS):
            out.append(canonicalize_name(req.name))
    return out


def hub_client_wheels(lock_path: Path | None = None) -> list[tuple[Path, str]]:
    """(cached wheel, sha256) of huggingface-hub and its closure, pinned by the real lock;
    downloaded once (sha256-checked)."""
    import json

    from packaging.utils import canonicalize_name

    from gpuserve.paths import PACKAGE_DIR

    lock_path = lock_path or PACKAGE_DIR / "data" / "locks" / HUB_CLIENT_LOCK
    packages = {canonicalize_name(p["name"]): p
                for p in json.loads(lock_path.read_text())["packages"]}
    todo, seen, out = [HUB_CLIENT], set(), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        pkg = packages.get(name)
        if pkg is None:
            raise RuntimeError(f"{lock_path.name}: no {name}, which the {HUB_CLIENT} closure "
                               "needs on the guest")
        cached = fetch_wheel(pkg["url"], pkg["sha256"], pypi_cache() / pkg["filename"])
        out.append((cached, pkg["sha256"]))
        todo.extend(_wheel_requires(cached))
    return sorted(out)


def publish_hub_client(mirror_root: Path) -> list[str]:
    """Put the real huggingface-hub wheel and its closure into ``mirror_root/wheels``
    (before the lab locks are generated); returns the file names."""
    out = Path(mirror_root) / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for cached, sha256 in hub_client_wheels():
        target = out / cached.name
        if not (target.exists() and _sha256(target) == sha256):
            tmp = target.with_name(f".{target.name}.new")
            shutil.copyfile(cached, tmp)
            tmp.replace(target)
        names.append(cached.name)
    return names


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
        fresh_pd = Path(tmp) / PD_SUBDIR
        fresh_pd.mkdir()
        generate(wheels, versions[-1], fresh_pd, extra=PD_EXTRA)
        for made, final in ((fresh_pd, pd_locks_dir(mirror_root)), (fresh, out)):
            staging = final.with_name(f".{final.name}.new")
            if staging.exists():
                shutil.rmtree(staging)
            shutil.copytree(made, staging)
            if final.exists():
                shutil.rmtree(final)
            staging.replace(final)
