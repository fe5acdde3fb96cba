"""Hash-pinned SGLang stacks: one lock per (SGLang version, CUDA major, Python minor).

A lock is generated from a real pip resolve by tools/gen_lock.py, never by hand, and
lives in gpuserve/data/locks/ (or a user's ``sglang_locks_dir``). It names every wheel
with its sha256, so ``pip install --require-hashes --no-deps`` installs exactly that
set, and carries the facts about the stack that pip never checks: which CUDA torch is
built for, the driver that CUDA needs, the Python and glibc the wheels need, the GPU
architectures its kernels carry, and its download size. Loading is strict: a lock is
input, and a broken one must fail naming file and package before any host changes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

LOCKS_DIR = DATA_DIR / "locks"
LOCK_FORMAT = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")
_MINOR = re.compile(r"^[0-9]+\.[0-9]+$")
# Bigger than any real lock (about 200 packages, 100 kB); a bound on what we parse.
MAX_LOCK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    filename: str | None
    url: str | None
    sha256: str | None  # None only for an external package
    size: int
    external: bool = False


@dataclass(frozen=True)
class ExternalPackage:
    """A pin PyPI serves only as a placeholder; its real wheel comes from ``index``."""

    name: str
    version: str
    why: str
    index: str | None


@dataclass(frozen=True, repr=False)
class Lock:
    path: Path
    sglang: str
    sglang_sha256: str
    python: str
    requires_python: str
    platform: str
    glibc_min: str
    torch: str
    torch_cuda: str
    cuda_major: int
    driver_min: str
    cuda_archs: tuple[str, ...]
    download_bytes: int
    packages: tuple[LockedPackage, ...]
    external: tuple[ExternalPackage, ...]

    @property
    def name(self) -> str:
        return self.path.stem

    def __repr__(self) -> str:
        # short: pyinfra logs operation arguments, and a lock has 200 packages
        return f"Lock({self.name})"

    def requirements_text(self) -> str:
        """The pip requirements file: ``name==version --hash=sha256:...``, sorted.

        An external package is pinned without a hash; pip's ``--require-hashes`` then
        refuses the file, so a lock with one installs only from a wheelhouse whose lock
        was regenerated with the vendor index (``gen_lock.py --extra-index-url``)."""
        lines = []
        for pkg in self.packages:
            pin = f"{pkg.name}=={pkg.version}"
            lines.append(pin if pkg.sha256 is None else f"{pin} --hash=sha256:{pkg.sha256}")
        return "".join(f"{line}\n" for line in lines)

    @property
    def hash(self) -> str:
        """12 hex digits of the requirements' sha256: names the lock's venv on a host."""
        return hashlib.sha256(self.requirements_text().encode()).hexdigest()[:12]

    def supports(self, python: str, glibc: str) -> str | None:
        """Why a host with this Python minor and glibc cannot use the lock (None: it can)."""
        if python != self.python:
            return f"lock {self.name} is for Python {self.python}, the host has {python}"
        if _tuple(glibc) < _tuple(self.glibc_min):
            return (f"glibc {glibc} is older than {self.glibc_min}, which the lock's "
                    f"wheels ({self.platform}) need")
        return None


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _field(data: dict, key: str, kind: type | tuple, path: Path, where: str = "") -> object:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InputError(path, f"{where}{key}",
                         f"must be a {name}, got {type(value).__name__}")
    return value


def _str(data: dict, key: str, path: Path, pattern: re.Pattern | None = None,
         where: str = "") -> str:
    value = _field(data, key, str, path, where)
    if pattern is not None and not pattern.match(value):
        raise InputError(path, f"{where}{key}", f"{value!r} is malformed")
    return value


def _size(data: dict, key: str, path: Path, where: str) -> int:
    value = _field(data, key, (int, float), path, where)
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise InputError(path, f"{where}{key}", f"must be a whole number >= 0, got {value!r}")
    return int(value)


def _package(item: object, index: int, path: Path) -> LockedPackage:
    if not isinstance(item, dict):
        raise InputError(path, f"packages[{index}]", "must be a mapping")
    name = _str(item, "name", path, _NAME, f"packages[{index}].")
    where = f"packages[{index}] ({name})."
    version = _str(item, "version", path, _VERSION, where)
    external = item.get("external", False) is True
    if external:
        return LockedPackage(name, version, item.get("filename"), item.get("url"), None, 0,
                             True)
    sha = item.get("sha256")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise InputError(path, f"{where}sha256",
                         f"{name}=={version} needs a sha256 of 64 lowercase hex digits, "
                         f"got {sha!r}")
    return LockedPackage(name, version, _str(item, "filename", path, None, where),
                         _str(item, "url", path, None, where), sha,
                         _size(item, "size", path, where))


def load_lock(path: Path) -> Lock:
    """Read and validate one lock file; every problem names the file and the field."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(path, None, f"cannot read the lock: {e.strerror or e}") from None
    if len(raw) > MAX_LOCK_BYTES:
        raise InputError(path, None, f"{len(raw)} bytes is too large for a lock")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InputError(path, None, f"not a JSON lock: {e}") from None
    if not isinstance(data, dict):
        raise InputError(path, None, "a lock is a JSON object")
    if data.get("lock_format") != LOCK_FORMAT:
        raise InputError(path, "lock_format", f"must be {LOCK_FORMAT}, got "
                                              f"{data.get('lock_format')!r}")
    items = _field(data, "packages", list, path)
    packages = [_package(item, i, path) for i, item in enumerate(items)]
    seen: set[str] = set()
    for pkg in packages:
        key = pkg.name.lower().replace("_", "-").replace(".", "-")
        if key in seen:
            raise InputError(path, "packages", f"{pkg.name} is listed twice")
        seen.add(key)
    externals = []
    for i, item in enumerate(_field(data, "external", list, path)):
        if not isinstance(item, dict):
            raise InputError(path, f"external[{i}]", "must be a mapping")
        externals.append(ExternalPackage(_str(item, "name", path, _NAME, f"external[{i}]."),
                                         _str(item, "version", path, _VERSION, f"external[{i}]."),
                                         str(item.get("why", "")), item.get("index")))
    sglang = _str(data, "sglang", path, _VERSION)
    pinned = next((p for p in packages if p.name.lower() == "sglang"), None)
    if pinned is None or pinned.version != sglang:
        raise InputError(path, "packages", f"has no sglang=={sglang}")
    sglang_sha = _str(data, "sglang_sha256", path, _SHA256)
    if pinned.sha256 != sglang_sha:
        raise InputError(path, "sglang_sha256", f"is not the sha256 of the locked sglang wheel "
                                                f"({pinned.sha256})")
    archs = _field(data, "cuda_archs", list, path)
    if not all(isinstance(a, str) and re.match(r"^sm_\d+[a-z]?$", a) for a in archs):
        raise InputError(path, "cuda_archs", "must be a list like ['sm_90', 'sm_120']")
    cuda_major = _field(data, "cuda_major", int, path)
    torch_cuda = _str(data, "torch_cuda", path, _MINOR)
    if torch_cuda.split(".")[0] != str(cuda_major):
        raise InputError(path, "cuda_major", f"{cuda_major} is not torch's CUDA {torch_cuda}")
    return Lock(
        path=path, sglang=sglang, sglang_sha256=sglang_sha,
        python=_str(data, "python", path, _MINOR),
        requires_python=_str(data, "requires_python", path),
        platform=_str(data, "platform", path),
        glibc_min=_str(data, "glibc_min", path, _MINOR),
        torch=_str(data, "torch", path, _VERSION), torch_cuda=torch_cuda,
        cuda_major=cuda_major,
        driver_min=_str(data, "driver_min", path, re.compile(r"^\d+(\.\d+)*$")),
        cuda_archs=tuple(archs), download_bytes=_size(data, "download_bytes", path, ""),
        packages=tuple(sorted(packages, key=lambda p: p.name.lower())),
        external=tuple(externals),
    )


def available_locks(locks_dir: Path | None = None) -> list[Lock]:
    """Every lock in ``locks_dir`` (default: the committed ones), sorted by file name."""
    directory = Path(locks_dir) if locks_dir is not None else LOCKS_DIR
    return [load_lock(p) for p in sorted(directory.glob("*.json"))]


def load_locks(user_dir: str | None, source: str, field: str) -> list[Lock]:
    """A user's locks (``sglang_locks_dir``) first, then the committed ones; a user's
    lock replaces a committed one of the same name."""
    locks: dict[str, Lock] = {}
    if user_dir is not None:
        directory = Path(user_dir).expanduser()
        if not directory.is_dir():
            raise InputError(source, field, f"{user_dir!r} is not a directory of locks")
        for lock in available_locks(directory):
            locks[lock.name] = lock
    for lock in available_locks():
        locks.setdefault(lock.name, lock)
    return list(locks.values())


def catalog_mismatch(lock: Lock, catalog_source: str) -> str | None:
    """The flag catalog's ``source`` names the wheel it was generated from and its sha256;
    a lock that installs that same wheel file must carry the same sha256."""
    pinned = next(p for p in lock.packages if p.name.lower() == "sglang")
    match = re.search(r"(\S+\.whl) .*sha256 ([0-9a-f]{64})", catalog_source)
    if not match or pinned.filename != match.group(1) or pinned.sha256 == match.group(2):
        return None
    return (f"sglang {lock.sglang}: the lock's {pinned.filename} has sha256 {pinned.sha256}, "
            f"the flag catalog was generated from the same file with sha256 {match.group(2)}")
