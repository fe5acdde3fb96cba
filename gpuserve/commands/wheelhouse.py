"""``gpuserve wheelhouse``: download exactly a lock's wheels, hash-checked, for an air-gapped host.

Why a command: an air-gapped host installs with ``pip_find_links`` (``--no-index``) from
a directory someone filled while online. Filling it with ``pip download`` would resolve
again (today's floating versions, no hashes); this takes the lock's own URLs and
sha256s, so the wheelhouse holds the set the deploy will install and nothing else.
Wheels already present with the right hash are kept (reruns are cheap), a download is
written under a temporary name and renamed only once its hash matches, and a pinned
package that PyPI has only as a placeholder (cuda-tile 1.6.0rc5) is named with where
its real wheel must come from instead of being fetched.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import urllib.request
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import GpuserveError, InputError
from gpuserve.launch.lock_choice import public_version
from gpuserve.launch.locks import AppLock, Lock, available_locks, load_app_lock, load_lock
from gpuserve.launch.profiles import load_profile

CHUNK = 1 << 20
#: Above this many bytes to fetch, ``--yes`` is required: one lock is 4-5 GiB, a
#: profile's every version and Python was 8.27 GiB, started without a word.
CONFIRM_BYTES = 6 * 1024**3


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "wheelhouse",
        help="download a lock's wheels (hash-checked) into a directory for pip_find_links",
        description="Download exactly the wheels of a lock, checking each sha256, into DIR, "
        "with the pinned uv wheel that installs them. Point the host's pip_find_links at "
        "DIR (served over https, or a trusted mirror).",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--lock", help="a lock file (gpuserve/data/locks/*.json, SGLang's or "
                       "the gateway's smg-*.json, or your own)")
    which.add_argument("--profile", help="every committed lock the profile renders for")
    which.add_argument("--python-builds", dest="python_builds", action="store_true",
                       help="the managed CPython archives of gpuserve's catalog instead, "
                       "into DIR/<build>/<archive> (a mirror for sglang_python_mirror)")
    parser.add_argument("--python", help="only locks for this Python minor (e.g. 3.11)")
    parser.add_argument("--version", help="only locks of this SGLang version (e.g. 0.5.23)")
    parser.add_argument("--yes", action="store_true",
                        help=f"fetch although it is more than {CONFIRM_BYTES / 1024**3:.0f} "
                        "GiB (the plan is printed first either way)")
    parser.add_argument("--dry-run", dest="dry_run", action="store_true",
                        help="print what would be fetched and its size, fetch nothing")
    parser.add_argument("--check", action="store_true",
                        help="download nothing: verify DIR holds every wheel with its hash")
    parser.add_argument("dir", metavar="DIR", help="the wheelhouse directory")
    parser.set_defaults(func=run)


def select_locks(args: argparse.Namespace) -> list[Lock]:
    if args.python is not None and not re.fullmatch(r"3\.\d{1,2}", args.python):
        raise InputError("--python", "python", f"must be a Python minor such as 3.12, got "
                         f"{args.python!r:.40}")
    version = getattr(args, "version", None)
    if args.lock:
        lock = lock_file(Path(args.lock))
        released = lock.version if isinstance(lock, AppLock) else public_version(lock.sglang)
        for flag, want, have in (("--python", args.python, lock.python),
                                 ("--version", version, released)):
            if want is not None and want != have:
                raise InputError(flag, flag[2:], f"{args.lock} is for {have}, not {want}")
        return [lock]
    profile = load_profile(args.profile)
    wanted = set(profile.sglang_versions or [])
    if version is not None and wanted and version not in wanted:
        raise InputError("--version", "version", f"profile {profile.name} renders for "
                         f"SGLang {', '.join(sorted(wanted))}, not {version!r:.40}")
    locks = [lk for lk in available_locks()
             if (not wanted or public_version(lk.sglang) in wanted)
             and (version is None or public_version(lk.sglang) == version)
             and (args.python is None or lk.python == args.python)]
    if not locks:
        raise GpuserveError(f"no committed lock for profile {profile.name} "
                            f"(SGLang {version or ', '.join(sorted(wanted)) or 'any'}"
                            f"{', Python ' + args.python if args.python else ''})")
    return locks


def lock_file(path: Path) -> Lock | AppLock:
    """An SGLang lock, or the lock of another package (smg, the gateway: its document
    names its ``package``), each validated by its own loader."""
    doc = safeload.load_json_file(path)  # a FIFO, a device, a directory: refused here
    if isinstance(doc, dict) and "package" in doc:
        return load_app_lock(path)
    return load_lock(path)


def fetch_plan(locks: list[Lock], target: Path) -> tuple[int, int, int]:
    """(wheels, bytes) still to fetch, and bytes already there, over the locks' distinct
    files; a file of the right size counts as there (its hash is checked before use)."""
    files = {pkg.filename: pkg for lock in locks for pkg in lock.packages if not pkg.external}
    have = [p for p in files.values()
            if (target / p.filename).is_file() and (target / p.filename).stat().st_size == p.size]
    there = sum(p.size or 0 for p in have)
    return len(files) - len(have), sum(p.size or 0 for p in files.values()) - there, there


def confirmed(locks: list[Lock], target: Path, args: argparse.Namespace) -> bool:
    """Print what will be fetched and its size; False when it should not start (a dry
    run, or more than CONFIRM_BYTES without ``--yes``)."""
    for lock in locks:
        print(f"lock {lock.name}: {len(lock.packages)} wheels, "
              f"{lock.download_bytes / 1024**3:.2f} GiB")
    count, size, there = fetch_plan(locks, target)
    print(f"to fetch: {count} wheels, {size / 1024**3:.2f} GiB into {target} "
          f"({there / 1024**3:.2f} GiB already there)", flush=True)
    if getattr(args, "dry_run", False):
        return False
    if size > CONFIRM_BYTES and not getattr(args, "yes", False):
        print(f"gpuserve: wheelhouse: {size / 1024**3:.2f} GiB is more than "
              f"{CONFIRM_BYTES / 1024**3:.0f} GiB: add --yes to fetch it, or narrow it with "
              "--version/--python", file=sys.stderr)
        return False
    return True


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch(url: str, dest: Path, sha256: str, what: str = "the lock's") -> None:
    """Download to ``dest`` through a temporary name; keep it only if the hash matches."""
    tmp = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, tmp.open("wb") as out:
            while block := response.read(CHUNK):
                digest.update(block)
                out.write(block)
    except OSError as e:  # URLError, timeouts, a full disk: never a half-written wheel
        tmp.unlink(missing_ok=True)
        raise GpuserveError(f"{url}: download failed: {getattr(e, 'reason', e)}") from None
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise GpuserveError(f"{url}: sha256 {digest.hexdigest()} is not {what} {sha256}")
    tmp.replace(dest)


def prepare_dir(target: Path, create: bool) -> None:
    """Refuse a DIR that is a file or lies below one, then create it (unless ``create``
    is false: ``--check`` only reads).

    Why: ``mkdir`` raised FileExistsError/NotADirectoryError tracebacks, and it ran
    before the arguments were validated, so a bad ``--lock`` still left DIR behind."""
    for path in (target, *target.parents):
        if path.exists() and not path.is_dir():
            what = "exists" if path == target else f"lies below {path}, which exists"
            raise InputError(str(target), "DIR", f"{what} and is not a directory")
    if create:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(str(target), "DIR", f"cannot create: "
                             f"{exc.strerror or exc}") from None


def run_python_builds(args: argparse.Namespace, target: Path) -> int:
    """The catalog's managed CPython archives (``--python`` narrows them) for the host's
    ``sglang_python_mirror``, in python-build-standalone's release layout, each checked
    against its sha256; kept when already there with that hash."""
    from gpuserve.launch.interpreter import managed_builds

    if args.python is not None and not re.fullmatch(r"3\.\d{1,2}", args.python):
        raise InputError("--python", "python", f"must be a Python minor such as 3.12, got "
                         f"{args.python!r:.40}")
    builds = [b for b in managed_builds() if args.python in (None, b.python)]
    if not builds:
        raise GpuserveError(f"no managed CPython {args.python} in the catalog")
    todo = [b for b in builds if not (target / b.build / b.filename).is_file()
            or sha256_of(target / b.build / b.filename) != b.sha256]
    print(f"to fetch: {len(todo)} managed CPython archives into {target} (sizes unknown "
          "until fetched: the catalog's source, uv's table, has none)")
    missing = 0
    for b in todo:
        print(f"  {b.build}/{b.filename}", flush=True)
        if args.check or getattr(args, "dry_run", False):
            missing += 1
            continue
        (target / b.build).mkdir(parents=True, exist_ok=True)
        fetch(b.url, target / b.build / b.filename, b.sha256, "the catalog's")
    if args.check and missing:
        print(f"gpuserve: wheelhouse: {missing} archives missing or with another sha256",
              file=sys.stderr)
        return 1
    return 0


def uv_wheels(locks: list[Lock], target: Path, check: bool, missing: list[str]) -> int:
    """The pinned uv wheel for each lock's platform (gpuserve/data/tools/uv.json): the
    deploy installs uv from the same find-links before the venv, so an air-gapped host
    needs it beside the lock's wheels. Returns the bytes fetched; with ``check``, adds
    what is missing to ``missing``."""
    from gpuserve.serve.uv import pin

    uv = pin()
    arches = {"aarch64" if lock.platform.endswith("aarch64") else "x86_64" for lock in locks}
    fetched = 0
    for wheel in (w for w in uv.wheels if w.arch in arches):
        dest = target / wheel.filename
        if dest.is_file() and sha256_of(dest) == wheel.sha256:
            continue
        if check:
            missing.append(f"uv {uv.version} (the venvs' installer): {dest} is missing or "
                           "its sha256 differs")
            continue
        print(f"  uv {uv.version}: {wheel.filename} ({wheel.size / 1024**2:.1f} MiB)",
              flush=True)
        fetch(wheel.url, dest, wheel.sha256, "the uv pin's")
        fetched += wheel.size
    return fetched


def run(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    if getattr(args, "python_builds", False):
        prepare_dir(target, create=not (args.check or getattr(args, "dry_run", False)))
        return run_python_builds(args, target)
    locks = select_locks(args)  # every argument checked before DIR is created
    prepare_dir(target, create=not (args.check or getattr(args, "dry_run", False)))
    if not args.check and not confirmed(locks, target, args):
        return 0 if getattr(args, "dry_run", False) else 1
    missing: list[str] = []
    total = 0
    for lock in locks:
        if args.check:
            print(f"lock {lock.name}: {len(lock.packages)} wheels, "
                  f"{lock.download_bytes / 1024**3:.2f} GiB")
        for index, pkg in enumerate(lock.packages, 1):
            where = f"{lock.name}: {pkg.name}=={pkg.version}"
            if pkg.external:
                ext = next((e for e in lock.external if e.name == pkg.name), None)
                index = ext.index if ext and ext.index else "its vendor's index"
                missing.append(f"{where}: PyPI has only a placeholder; its real wheel must come "
                               f"from {index} (pip download --no-deps --extra-index-url "
                               f"{index} {pkg.name}=={pkg.version} -d {target})")
                continue
            dest = target / pkg.filename
            if dest.is_file() and sha256_of(dest) == pkg.sha256:
                continue
            if args.check:
                missing.append(f"{where}: {dest} is missing or its sha256 differs")
                continue
            print(f"  [{index}/{len(lock.packages)}] {pkg.filename} "
                  f"({pkg.size / 1024**2:.1f} MiB)", flush=True)
            fetch(pkg.url, dest, pkg.sha256)
            total += pkg.size
    total += uv_wheels(locks, target, args.check, missing)
    for line in missing:
        print(f"gpuserve: wheelhouse: {line}", file=sys.stderr)
    if not args.check:
        print(f"downloaded {total / 1024**3:.2f} GiB into {target}")
    return 1 if missing else 0
