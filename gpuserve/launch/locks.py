"""SGLang locks: one exact, hash-pinned package set per (SGLang, CUDA major, Python minor).

Why: ``pip install sglang==V`` pins SGLang's own requirements only; everything else
floats (CUDA 13.5 compiler wheels next to a 13.0 runtime, sglang-install.md §4.5), and
pip never checks the driver. A lock, generated from a real resolve by
``tools/gen_lock.py`` and committed under ``gpuserve/data/locks/``, fixes every wheel
by sha256 and states what a host needs before anything is downloaded: the driver for
torch's CUDA, the glibc of the wheels' manylinux tags, the Python minor.

This module only reads and judges lock files (no network, no pip, no pyinfra). It is
strict on purpose: a lock drives a multi-GiB install with ``--require-hashes``, so a
hand edit that drops a hash or duplicates a package must fail here, naming the file
and the package, not on the host halfway through a download.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuserve import safeload, versions
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

LOCK_FORMAT = 1
# Generated locks are ~90 KB; anything far larger is not a lock (bounded read).
MAX_LOCK_BYTES = 4 * 1024 * 1024

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# PEP 440 versions as pip reports them (a local part such as +lab is allowed).
_VERSION = re.compile(
    r"^(\d+!)?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$",
    re.IGNORECASE)
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")  # PEP 503 normalized
_MINOR = re.compile(r"^\d+\.\d+$")
_PYTHON = re.compile(r"^3\.\d+$")
_DRIVER = re.compile(r"^\d+(\.\d+)+$")
_ARCH = re.compile(r"^sm_\d+[a-z]?$")
_PLATFORM = re.compile(r"^manylinux_(\d+)_(\d+)_[a-z0-9_]+$")
# Where a wheel was resolved from (``url``) and an external package's ``index``: https,
# or file:// for a local mirror (lab/locks.py). Plain http (or ftp, or a bare host) is
# refused: a lock is provenance, and one resolved over an unauthenticated channel says
# its hashes could have come from anyone.
_URL = re.compile(r"^(https://[^\s/]+|file://)\S*$")
_URL_WHAT = "an https:// (or file://) URL"
_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


# The committed locks (a host may add its own: ``sglang_locks_dir``, see load_locks).
LOCKS_DIR = DATA_DIR / "locks"


@dataclass(frozen=True)
class LockedPackage:
    """One pinned distribution. External ones have no hash: they come from ``index``."""

    name: str
    version: str
    filename: str | None
    url: str | None
    sha256: str | None
    size: int | None
    external: bool = False
    index: str | None = None

    def requirement(self) -> str:
        """``name==version --hash=sha256:...`` (pip's hash-checking syntax)."""
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class ExternalPackage:
    """A pin PyPI serves only as a placeholder; its real wheel comes from ``index``."""

    name: str
    version: str
    why: str
    index: str


@dataclass(frozen=True, repr=False)
class Lock:
    """A loaded, validated lock file. Field names follow the JSON keys."""

    path: Path
    lock_format: int
    generator: str
    resolved: Mapping[str, Any] = field(hash=False)
    sglang: str
    sglang_sha256: str
    python: str
    requires_python: str | None
    platform: str
    glibc_min: str
    torch: str
    torch_cuda: str
    cuda_major: int
    cuda_runtime: Mapping[str, str] = field(hash=False)
    driver_min: str
    driver_source: str
    cuda_archs: tuple[str, ...]
    cuda_archs_source: str
    constraints: tuple[str, ...]
    download_bytes: int
    external: tuple[ExternalPackage, ...]
    packages: tuple[LockedPackage, ...]
    cuda_ptx: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The file's stem, e.g. ``sglang-0.5.23-cu13-py311``."""
        return self.path.stem

    def __repr__(self) -> str:
        # short: pyinfra logs operation arguments, and a lock has 200 packages
        return f"Lock({self.name})"

    def package(self, name: str) -> LockedPackage | None:
        key = _normalize(name)
        return next((p for p in self.packages if p.name == key), None)

    def requirements_text(self) -> str:
        """A pip requirements file for ``pip install --no-deps --require-hashes -r``.

        One ``name==version --hash=sha256:...`` line per hash-pinned package, sorted by
        name. External packages cannot carry a hash, so they are listed as trailing
        comments (pip ignores them; the caller installs them from their index or a
        wheelhouse first); they still count in :attr:`hash`.
        """
        pinned = sorted((p for p in self.packages if not p.external), key=lambda p: p.name)
        lines = [p.requirement() for p in pinned]
        lines += [f"# external, not hash-pinned: {p.name}=={p.version} from {p.index}"
                  for p in sorted(self.packages, key=lambda p: p.name) if p.external]
        return "".join(line + "\n" for line in lines)

    @property
    def hash(self) -> str:
        """12 hex digits of the requirements text's sha256: names venvs (same set, same name)."""
        return hashlib.sha256(self.requirements_text().encode()).hexdigest()[:12]

    def supports(self, python: str | None = None, glibc: str | None = None) -> str | None:
        """Why a host with this Python and glibc cannot install the lock; None when it can.

        ``python`` may be ``3.11`` or ``3.11.7`` and ``glibc`` ``2.36``; None means
        unknown and is not judged. The Python minor must match exactly: the lock pins
        cpXY wheels (torch, sglang) that no other minor installs.
        """
        if python is not None:
            minor = ".".join(str(python).split(".")[:2])
            if not _PYTHON.match(minor):
                raise ValueError(f"python: expected 3.N[.M], got {python!r}")
            if minor != self.python:
                return (f"Python {minor} cannot use lock {self.name}: its wheels are for "
                        f"Python {self.python}")
        if glibc is not None:
            if not _MINOR.match(str(glibc)):
                raise ValueError(f"glibc: expected N.M, got {glibc!r}")
            if versions.parse(glibc) < versions.parse(self.glibc_min):
                return (f"glibc {glibc} is older than {self.glibc_min}, which lock "
                        f"{self.name} needs ({self.platform} wheels)")
        return None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------


class _Doc:
    """Typed access to one JSON object, every failure an InputError naming the field."""

    def __init__(self, path: Path, data: Mapping[str, Any], where: str = "") -> None:
        self.path, self.data, self.where = path, data, where

    def error(self, key: str, message: str) -> InputError:
        return InputError(self.path, f"{self.where}{key}", message)

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise self.error(key, "missing")
        value = self.data[key]
        if value is None and optional:
            return None
        # bool is an int subclass; a lock never means True by 1
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple)
                                                     else (types,)):
            raise self.error(key, f"must be {_type_names(types)}, got a boolean")
        if not isinstance(value, types):
            raise self.error(key, f"must be {_type_names(types)}, got "
                                  f"{type(value).__name__} {value!r:.60}")
        return value

    def text(self, key: str, pattern: re.Pattern | None = None, what: str = "",
             *, optional: bool = False) -> str | None:
        value = self.get(key, str, optional=optional)
        if value is not None and pattern is not None and not pattern.match(value):
            raise self.error(key, f"must be {what}, got {value!r:.80}")
        return value

    def size(self, key: str, *, optional: bool = False) -> int | None:
        value = self.get(key, (int, float), optional=optional)
        if value is None:
            return None
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise self.error(key, f"must be a whole number of bytes, got {value!r}")
        if value < 0:
            raise self.error(key, f"must not be negative, got {value!r}")
        return int(value)


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "an object"}
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in seq)


def _read_json(path: Path) -> dict:
    # Size and depth bounded by the one loader (gpuserve/safeload.py); an overflowing
    # number (1e400) is left to the package checks, which name the field.
    limits = safeload.DATA.but(max_bytes=MAX_LOCK_BYTES, finite=False)
    data = safeload.load_json_file(path, limits)
    if not isinstance(data, dict):
        raise InputError(path, None, f"must be a JSON object, got {type(data).__name__}")
    return data


def _package(path: Path, index: int, raw: Any) -> LockedPackage:
    if not isinstance(raw, dict):
        raise InputError(path, f"packages[{index}]", "must be an object")
    label = raw.get("name") if isinstance(raw.get("name"), str) else "?"
    doc = _Doc(path, raw, f"packages[{index}] ({label}).")
    name = doc.text("name", _NAME, "a normalized project name (lowercase, '-')")
    version = doc.text("version", _VERSION, "a PEP 440 version")
    external = doc.get("external", bool, optional=True) or False
    if external:
        sha = doc.text("sha256", _SHA256, "null or 64 lowercase hex digits", optional=True)
        index_url = doc.text("index", _URL, _URL_WHAT, optional=True)  # else ``external``
        return LockedPackage(name, version, doc.text("filename", optional=True),
                       doc.text("url", _URL, _URL_WHAT, optional=True), sha,
                       doc.size("size", optional=True), True, index_url)
    sha = doc.text("sha256", _SHA256, f"64 lowercase hex digits for {name} {version} (only "
                                      "external packages may lack a hash)")
    filename = doc.text("filename")
    if not filename.endswith(".whl"):
        raise doc.error("filename", f"{name}: must be a wheel (.whl), got {filename!r:.80}")
    if not _FILENAME.match(filename):
        # ``gpuserve wheelhouse`` writes DIR/<filename>: "../../x.whl" would land elsewhere
        raise doc.error("filename", f"{name}: must be a plain file name (no '/', not "
                                    f"starting with '.'), got {filename!r:.80}")
    return LockedPackage(name, version, filename, doc.text("url", _URL, _URL_WHAT), sha,
                         doc.size("size"))


def _check_totals(doc: _Doc, lock: Lock | AppLock) -> None:
    """The header agrees with the packages: glibc floor and platform tag, download size."""
    m = _PLATFORM.match(lock.platform)
    if m and f"{m.group(1)}.{m.group(2)}" != lock.glibc_min:
        raise doc.error("glibc_min", f"{lock.glibc_min} does not match platform {lock.platform}")
    total = sum(p.size or 0 for p in lock.packages)
    if total != lock.download_bytes:
        raise doc.error("download_bytes", f"{lock.download_bytes}, but the package sizes add "
                                          f"up to {total}")


def _read_lock(path: Path, external_ok: bool) -> tuple[_Doc, int, tuple[LockedPackage, ...]]:
    """The parts every lock shares: its format and its packages (each name once; an app
    lock, ``external_ok`` False, pins every wheel by hash)."""
    doc = _Doc(path, _read_json(path))
    fmt = doc.get("lock_format", int)
    if fmt != LOCK_FORMAT:
        raise doc.error("lock_format", f"this gpuserve reads format {LOCK_FORMAT}, got {fmt}")
    raw_packages = doc.get("packages", list)
    if not raw_packages:
        raise doc.error("packages", "must list at least one package")
    packages = tuple(_package(path, i, p) for i, p in enumerate(raw_packages))
    seen: dict[str, int] = {}
    for i, p in enumerate(packages):
        if p.external and not external_ok:
            raise InputError(path, f"packages[{i}] ({p.name}).external",
                             "an app lock pins every wheel by hash (no external packages)")
        if p.name in seen:
            raise InputError(path, "packages", f"packages[{i}]: duplicate package {p.name} "
                                               f"(also packages[{seen[p.name]}])")
        seen[p.name] = i
    return doc, fmt, packages


#: Locks read and validated, by path as given and the file's identity and times.
_READ: dict[tuple, Lock] = {}


def load_lock(path: str | Path) -> Lock:
    """Read and validate one lock file; every problem is an InputError naming the field.
    A file read before and unchanged since (same path, inode, size and times) is not read
    again: every serve plan reads every lock (a fleet's status plans each host, a tune
    each candidate; 19 s of a 44 s fleet status test module went to reading the same six
    files)."""
    path = Path(path)
    try:
        st = path.stat()
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        return _load_lock(path)  # its own error, naming the file
    if key not in _READ:
        if len(_READ) >= 256:
            _READ.clear()
        _READ[key] = _load_lock(path)
    return _READ[key]


def _load_lock(path: Path) -> Lock:
    """:func:`load_lock` without the memo."""
    doc, fmt, packages = _read_lock(path, external_ok=True)
    by_name = {p.name: p for p in packages}

    externals = []
    for i, raw in enumerate(doc.get("external", list)):
        if not isinstance(raw, dict):
            raise doc.error(f"external[{i}]", "must be an object")
        ext = _Doc(path, raw, f"external[{i}].")
        item = ExternalPackage(ext.text("name", _NAME, "a normalized project name"),
                        ext.text("version", _VERSION, "a PEP 440 version"),
                        ext.text("why"), ext.text("index", _URL, _URL_WHAT))
        pkg = by_name.get(item.name)
        if pkg is None or not pkg.external or pkg.version != item.version:
            raise ext.error("name", f"{item.name} {item.version} is not an external entry of "
                                    "packages")
        externals.append(item)
    listed = {e.name: e for e in externals}
    for i, p in enumerate(packages):
        if p.external and p.name not in listed:
            raise InputError(path, f"packages[{i}] ({p.name}).external",
                             f"{p.name} is external but not listed under external")
    packages = tuple(replace(p, index=listed[p.name].index) if p.external and not p.index
                     else p for p in packages)

    # Descriptive fields (provenance, derivation notes) may be absent in a hand-made
    # test lock; the facts a host decision or an install needs are required.
    runtime = doc.get("cuda_runtime", dict, optional=True) or {}
    for key, value in runtime.items():
        if not (isinstance(value, str) and _VERSION.match(value)):
            raise doc.error(f"cuda_runtime.{key}", f"must be a PEP 440 version, got {value!r}")
    archs = doc.get("cuda_archs", list)
    for i, arch in enumerate(archs):
        if not (isinstance(arch, str) and _ARCH.match(arch)):
            raise doc.error(f"cuda_archs[{i}]", f"must look like sm_90, got {arch!r}")
    ptx = doc.get("cuda_ptx", list, optional=True) or []
    constraints = doc.get("constraints", list, optional=True) or []
    for i, item in enumerate([*constraints, *ptx]):
        if not isinstance(item, str):
            raise doc.error("constraints" if i < len(constraints) else "cuda_ptx",
                            f"must list strings, got {item!r}")

    lock = Lock(
        path=path,
        lock_format=fmt,
        generator=doc.text("generator", optional=True) or "",
        resolved=MappingProxyType(dict(doc.get("resolved", dict, optional=True) or {})),
        sglang=doc.text("sglang", _VERSION, "a PEP 440 version"),
        sglang_sha256=doc.text("sglang_sha256", _SHA256, "64 lowercase hex digits"),
        python=doc.text("python", _PYTHON, "a Python minor such as 3.11"),
        requires_python=doc.text("requires_python", optional=True),
        platform=doc.text("platform"),
        glibc_min=doc.text("glibc_min", _MINOR, "a glibc version such as 2.34"),
        torch=doc.text("torch", _VERSION, "a PEP 440 version"),
        torch_cuda=doc.text("torch_cuda", _MINOR, "a CUDA version such as 13.0"),
        cuda_major=doc.get("cuda_major", int),
        cuda_runtime=MappingProxyType(dict(runtime)),
        driver_min=doc.text("driver_min", _DRIVER, "a driver version such as 580.65.06"),
        driver_source=doc.text("driver_source", optional=True) or "",
        cuda_archs=tuple(archs),
        cuda_archs_source=doc.text("cuda_archs_source", optional=True) or "",
        constraints=tuple(constraints),
        download_bytes=doc.size("download_bytes"),
        external=tuple(externals),
        packages=tuple(sorted(packages, key=lambda p: p.name)),
        cuda_ptx=tuple(ptx),
    )
    _check_consistency(lock, doc)
    return lock


def _check_consistency(lock: Lock, doc: _Doc) -> None:
    """Header facts must agree with the package list they were derived from."""
    sglang, torch = lock.package("sglang"), lock.package("torch")
    if sglang is None or sglang.external:
        raise doc.error("packages", "no hash-pinned sglang package")
    if sglang.version != lock.sglang or sglang.sha256 != lock.sglang_sha256:
        raise doc.error("sglang_sha256", f"header says sglang {lock.sglang} sha256 "
                        f"{lock.sglang_sha256[:12]}..., packages say {sglang.version} "
                        f"{(sglang.sha256 or '')[:12]}...")
    # (a lock without torch is not a generated one, but nothing here needs the wheel)
    if torch is not None and torch.version != lock.torch:
        raise doc.error("torch", f"header says torch {lock.torch}, packages say {torch.version}")
    if lock.cuda_major != versions.parse(lock.torch_cuda).major:
        raise doc.error("cuda_major", f"{lock.cuda_major} does not match torch_cuda "
                        f"{lock.torch_cuda}")
    for name, version in lock.cuda_runtime.items():
        pkg = lock.package(name)
        if pkg is None or pkg.version != version:
            raise doc.error(f"cuda_runtime.{name}", f"{name}=={version} is not in packages")
    _check_totals(doc, lock)


@dataclass(frozen=True, repr=False)
class AppLock:
    """A lock of one package that is not SGLang (``smg``, SGLang's gateway), generated by
    ``tools/gen_lock.py VERSION --package NAME``: ``<name>-<V>-py<XY>.json``. The same
    package entries, hashes and pip text as :class:`Lock`, without the CUDA facts."""

    path: Path
    lock_format: int
    generator: str
    resolved: Mapping[str, Any] = field(hash=False)
    package_name: str
    version: str
    sha256: str
    python: str
    requires_python: str | None
    platform: str
    glibc_min: str
    download_bytes: int
    packages: tuple[LockedPackage, ...]

    @property
    def name(self) -> str:
        """The file's stem, e.g. ``smg-1.13.0-py311``."""
        return self.path.stem

    def __repr__(self) -> str:
        return f"AppLock({self.name})"

    package = Lock.package
    requirements_text = Lock.requirements_text
    hash = Lock.hash
    supports = Lock.supports


def load_app_lock(path: str | Path, package: str | None = None) -> AppLock:
    """Read and validate an app lock (every problem an InputError naming the field);
    ``package``: the package it must lock (e.g. ``smg``)."""
    path = Path(path)
    doc, fmt, packages = _read_lock(path, external_ok=False)
    lock = AppLock(
        path=path, lock_format=fmt,
        generator=doc.text("generator", optional=True) or "",
        resolved=MappingProxyType(dict(doc.get("resolved", dict, optional=True) or {})),
        package_name=doc.text("package", _NAME, "a normalized project name (lowercase, '-')"),
        version=doc.text("version", _VERSION, "a PEP 440 version"),
        sha256=doc.text("sha256", _SHA256, "64 lowercase hex digits"),
        python=doc.text("python", _PYTHON, "a Python minor such as 3.11"),
        requires_python=doc.text("requires_python", optional=True),
        platform=doc.text("platform"),
        glibc_min=doc.text("glibc_min", _MINOR, "a glibc version such as 2.17"),
        download_bytes=doc.size("download_bytes"),
        packages=tuple(sorted(packages, key=lambda p: p.name)),
    )
    if package is not None and lock.package_name != _normalize(package):
        raise doc.error("package", f"this is a lock of {lock.package_name}, not of {package}")
    own = lock.package(lock.package_name)
    if own is None or own.version != lock.version or own.sha256 != lock.sha256:
        raise doc.error("sha256", f"header says {lock.package_name} {lock.version} sha256 "
                        f"{lock.sha256[:12]}..., packages say "
                        f"{own.version if own else 'nothing'} "
                        f"{((own.sha256 if own else None) or '')[:12]}...")
    _check_totals(doc, lock)
    return lock


def app_locks(package: str, locks_dir: str | Path | None = None) -> list[AppLock]:
    """Every lock of ``package`` in ``locks_dir`` (default: the committed ones), oldest
    release first (``<package>-<V>-py<XY>.json``)."""
    where = Path(locks_dir) if locks_dir is not None else LOCKS_DIR
    found = [load_app_lock(p, package) for p in sorted(where.glob(f"{package}-*-py*.json"))]
    return sorted(found, key=lambda lk: (versions.parse(lk.version), lk.version,
                                         versions.parse(lk.python)))


def available_locks(locks_dir: str | Path | None = None) -> list[Lock]:
    """Every lock in ``locks_dir`` (default: the committed ones), oldest SGLang first."""
    where = Path(locks_dir) if locks_dir is not None else LOCKS_DIR
    found = [load_lock(p) for p in sorted(where.glob("sglang-*.json"))]
    return sorted(found, key=lambda lk: (versions.parse(lk.sglang), lk.sglang, lk.cuda_major,
                                         versions.parse(lk.python)))


def load_locks(user_dir: str | None, source: str, field: str) -> list[Lock]:
    """A user's locks (``sglang_locks_dir``) first, then the committed ones; a user's
    lock replaces a committed one of the same name. ``source``/``field`` name where
    ``user_dir`` was set, for the error when it is not a directory."""
    locks: dict[str, Lock] = {}
    if user_dir is not None:
        directory = Path(user_dir).expanduser()
        if not directory.is_dir():
            raise InputError(source, field, f"{user_dir!r} is not a directory of locks")
        for lock in available_locks(directory):
            refuse_catalog_mismatch(lock)
            locks[lock.name] = lock
    for lock in available_locks():
        locks.setdefault(lock.name, lock)
    return list(locks.values())


def check_against_catalog(lock: Lock, catalog_source_sha: str) -> str | None:
    """None when the lock installs the sglang wheel a flag catalog was generated from.

    ``catalog_source_sha`` is the catalog's ``source`` string (``sglang-0.5.23-cp311-
    ...whl from PyPI (sha256 00b3...)``) or a bare sha256. When the source names a
    different file (the catalog read the cp311 wheel, a py312 lock installs the cp312
    one of the same release) the hashes cannot be compared and the answer is None;
    otherwise a differing sha256 is returned as a sentence: the catalog's flags would
    describe a different build than the one installed.
    """
    m = re.search(r"(?:(\S+\.whl)\s.*)?\b([0-9a-f]{64})\b", catalog_source_sha)
    if m is None:
        raise ValueError(f"no sha256 in {catalog_source_sha!r}")
    filename, wanted = m.group(1), m.group(2)
    sglang = lock.package("sglang")
    installed = sglang.filename if sglang else None
    if lock.sglang_sha256 == wanted or (filename is not None and filename != installed):
        return None
    return (f"sglang {lock.sglang}: lock {lock.name} installs {installed} with sha256 "
            f"{lock.sglang_sha256}, the flag catalog was generated from "
            f"{filename or 'a wheel'} with sha256 {wanted}")


# The name gpuserve/plans/serve.py uses.
catalog_mismatch = check_against_catalog


def refuse_catalog_mismatch(lock: Lock) -> None:
    """Refuse a lock whose sglang wheel is not the one its release's flag catalog was
    generated from (a release without a catalog is left to the lock choice).

    Why here: every reader of ``sglang_locks_dir`` (the serve deploy's prepare,
    ``gpuserve check``, the fleet) goes through :func:`load_locks`, so they judge the
    same locks the same way; checked on the chosen lock only, ``check`` and a host that
    picked another Python disagreed."""
    from gpuserve.launch.catalog import available_versions, load_catalog

    release = versions.public(lock.sglang)
    if release not in available_versions():
        return
    mismatch = check_against_catalog(lock, load_catalog(release).source)
    if mismatch:
        raise InputError(lock.path, "packages (sglang)", mismatch)
