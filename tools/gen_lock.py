#!/usr/bin/env python3
"""Generate gpuserve/data/locks/sglang-<V>-cu<major>-py<XY>.json from a real pip resolve.

Usage::

    .venv/bin/python tools/gen_lock.py 0.5.23 --python 3.11 --glibc 2.36
    .venv/bin/python tools/gen_lock.py 0.5.23 --python 3.12 --glibc 2.39
    .venv/bin/python tools/gen_lock.py 0.5.23 --python 3.11 --glibc 2.36 --check
    .venv/bin/python tools/gen_lock.py 0.5.23 --find-links /srv/wheelhouse --out-dir /tmp/l
    .venv/bin/python tools/gen_lock.py 1.13.0 --package smg --python 3.11 --glibc 2.36

Why this exists: ``pip install sglang==V`` pins only SGLang's own requirements; the
other ~200 packages float (on 2026-11-30 the CUDA 13.0 stacks pulled 13.5 compiler
wheels, sglang-install.md §4.5), and pip never looks at the host's driver. A
lock is one exact, hash-pinned set for one (SGLang, CUDA major, Python minor), so a
host installs what was reviewed, and the header says what it needs (driver, glibc,
Python) before 4 GiB are downloaded. Locks are never hand-written: this script
resolves against the index, reads the wheels, and writes the file; adding or
refreshing a lock = run it and review the diff (``--check`` reports drift).

How it resolves: ``pip install --dry-run --ignore-installed --report`` with
``--only-binary=:all: --target --python-version --implementation cp --abi ...
--platform manylinux_2_NN_x86_64 ...`` (sglang-install.md §9), in a temporary venv
with a current pip and an empty configuration (``PIP_CONFIG_FILE=/dev/null``, no
``PIP_*`` variables that change resolution). pip rather than uv because pip is what
the host runs to install the lock, so the resolver that chooses is the one that
installs; and the ``--report`` JSON (download URL + sha256 per package) is a stable,
documented format since pip 22.2. The venv is built from an interpreter of the
*target* minor: pip evaluates environment markers against the interpreter that runs
it, not against ``--python-version`` (pypa/pip#11010, #13296).

What is derived, never typed: the package set, URLs and sha256 (the report), sizes
(PyPI's JSON API, else HTTP HEAD; local files are hashed), torch's CUDA
(``torch/version.py`` read from the torch wheel with HTTP range requests on the
zip's central directory), the CUDA runtime wheels (torch's own requirement closure),
the glibc floor (the wheels' manylinux tags), the kernel architectures (the SASS
entries of the ``.nv_fatbin`` sections of the kernel wheel's ``.so`` files, range
read), and the driver floor (looked up for torch's CUDA in DRIVER_MIN, a cited
table). Compiler wheels (nvcc, nvvm, nvjitlink, crt) are pinned to the runtime's
minor with a constraints file when the natural resolve floats them past it.

Placeholders: some pins resolve on PyPI only to a build-time stub (``cuda-tile
1.6.0rc5``, pinned by sglang 0.5.18-0.5.22, is a ``wheel_stub`` sdist that downloads
the real wheel from pypi.nvidia.com). For the resolve, PLACEHOLDERS gives pip a
metadata-only wheel (checked against the sdist's PKG-INFO), and the lock marks the
package external: no hash, it must come from that index or a wheelhouse.

Other packages (``--package smg``, SGLang's gateway): the same resolve and the same
hash facts, for a package that is not SGLang (no torch, no CUDA, no kernels). The lock
is ``<package>-<V>-py<XY>.json`` with a shorter header (``package``, ``version``,
``sha256`` of the package's own wheel, ``python``, ``platform``/``glibc_min``,
``download_bytes``, ``packages``), read by ``gpuserve.launch.locks.load_app_lock``.

Downloads (the placeholder sdists, torch/version.py, kernel arch scans) are cached
under ~/.cache/gpuserve/locks, keyed by sha256.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime as dt
import difflib
import email.parser
import glob
import hashlib
import io
import json
import os
import re
import shutil
import ssl
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "gpuserve" / "data" / "locks"
FLAGS_DIR = REPO_ROOT / "gpuserve" / "data" / "flags"
GENERATOR = "tools/gen_lock.py"
LOCK_FORMAT = 1
DEFAULT_INDEX = "https://pypi.org/simple"
PYPI_JSON = "https://pypi.org/pypi"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuserve" / "locks"
USER_AGENT = "gpuserve-gen-lock/1 (+tools/gen_lock.py)"

# Minimum Linux x86_64 driver for a CUDA toolkit's GA release: "CUDA Toolkit and
# Corresponding Driver Versions" (Table 3) of the CUDA release notes. torch's wheel is
# built with that toolkit; newer minors need newer rows, added here by hand from the
# same table (the script refuses a CUDA it has no row for).
DRIVER_SOURCE = ("https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ Table 3 "
                 "(CUDA Toolkit and Corresponding Driver Versions, Linux x86_64)")
DRIVER_MIN = {
    "12.8": ("570.26", "CUDA 12.8 GA"),
    "13.0": ("580.65.06", "CUDA 13.0 GA"),
}


@dataclasses.dataclass(frozen=True)
class Placeholder:
    """A release that exists on PyPI only as a stub that downloads the real wheel."""

    name: str
    version: str
    requires_python: str
    requires_dist: tuple[str, ...]  # unconditional ones (no ``extra ==`` marker)
    index: str
    why: str


# Checked against the placeholder sdist's PKG-INFO and pyproject.toml whenever used.
PLACEHOLDERS = (
    Placeholder(
        name="cuda-tile", version="1.6.0rc5", requires_python="<3.15,>=3.10",
        requires_dist=("typing-extensions",), index="https://pypi.nvidia.com/",
        why=("PyPI has only a wheel_stub sdist (cuda_tile-1.6.0rc5.tar.gz) that downloads "
             "the real wheel from https://pypi.nvidia.com/ at build time; pinned by "
             "sglang 0.5.18-0.5.22 (sglang-install.md §5)")),
)

# Compiler pieces that must not run ahead of the CUDA runtime's minor (§4.5).
COMPILER_RE = re.compile(r"^nvidia-(cuda-nvcc|nvjitlink|nvvm|cuda-crt)(-cu\d+)?$")
RUNTIME_RE = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$")
CUDA_WHEEL_RE = re.compile(r"^(nvidia-.+|cuda-toolkit)$")
KERNEL_WHEELS = ("sglang-kernel", "sgl-kernel")
# Kernel .so members larger than this (compressed) are not range-read for arch scans
# (sglang-kernel 0.4.10's flash_ops.abi3.so is 342 MB).
ARCH_SCAN_LIMIT = 64 * 1024 * 1024
# pip's legacy aliases: manylinux1 = glibc 2.5, manylinux2010 = 2.12, manylinux2014 = 2.17.
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
# PIP_* variables that only concern transport; every other one could change the resolve.
PIP_TRANSPORT_ENV = ("PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_PROXY",
                     "PIP_RETRIES", "PIP_TIMEOUT")


class LockError(SystemExit):
    """A fact could not be derived or disagrees with another source: no lock is written."""

    def __init__(self, message: str) -> None:
        super().__init__(f"gen_lock: {message}")


def log(message: str) -> None:
    print(message, file=sys.stderr)


# --------------------------------------------------------------------------
# HTTP: small GETs, HEADs and range reads, with retries.
# --------------------------------------------------------------------------


def _ssl_context() -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cafile if cafile and Path(cafile).exists()
                                      else None)


_SSL = _ssl_context()


def http(url: str, *, method: str = "GET", headers: dict | None = None,
         ok404: bool = False) -> tuple[bytes, dict] | None:
    """Body and headers of ``url``; None on 404 when ``ok404``; raises after 4 tries."""
    hdrs = {"User-Agent": USER_AGENT, **(headers or {})}
    for attempt in range(4):
        try:
            req = urllib.request.Request(url, method=method, headers=hdrs)
            with urllib.request.urlopen(req, timeout=120, context=_SSL) as resp:
                return resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and ok404:
                return None
            if exc.code < 500 or attempt == 3:
                raise LockError(f"{method} {url}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == 3:
                raise LockError(f"{method} {url}: {exc}") from exc
        time.sleep(2 ** attempt)
    raise AssertionError("unreachable")


class RangeFile(io.RawIOBase):
    """A remote file read with HTTP range requests (enough of a file for ``zipfile``)."""

    def __init__(self, url: str, size: int) -> None:
        super().__init__()
        self.url, self.size, self.pos, self.requests = url, size, 0, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer) -> int:
        if self.pos >= self.size:
            return 0
        end = min(self.size, self.pos + len(buffer)) - 1
        got = http(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        assert got is not None
        data = got[0]
        if len(data) != end - self.pos + 1:
            raise LockError(f"{self.url}: range request returned {len(data)} bytes, "
                            f"wanted {end - self.pos + 1} (no range support?)")
        self.requests += 1
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def open_wheel(url: str, size: int) -> zipfile.ZipFile:
    """A wheel as a ZipFile: a local file, or a remote one read by byte ranges."""
    if url.startswith("file:"):
        return zipfile.ZipFile(_file_path(url))
    return zipfile.ZipFile(io.BufferedReader(RangeFile(url, size), buffer_size=1 << 20))


def _file_path(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# --------------------------------------------------------------------------
# The resolve: a temporary venv with a current pip, an empty config, a report.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Indexes:
    index_url: str
    extra_index_urls: tuple[str, ...]
    find_links: tuple[str, ...]

    def pip_args(self) -> list[str]:
        args = ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        return args


def find_interpreter(python: str, given: str | None) -> str:
    """An interpreter of the target minor, so pip evaluates markers for that Python."""
    candidates = [given] if given else [
        sys.executable, shutil.which(f"python{python}"),
        *sorted(glob.glob(str(Path.home() / f".pyenv/versions/{python}.*/bin/python{python}")),
                reverse=True),
        *sorted(glob.glob(str(Path.home() / f".local/share/uv/python/cpython-{python}.*"
                                            f"/bin/python{python}")), reverse=True),
    ]
    for exe in candidates:
        if not exe:
            continue
        try:
            out = subprocess.run(
                [exe, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == python:
            return exe
    raise LockError(f"no Python {python} interpreter with the venv module found "
                    f"(tried {', '.join(c for c in candidates if c)}); pass --interpreter: "
                    "pip evaluates environment markers against the interpreter that runs it")


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") or k in PIP_TRANSPORT_ENV}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def make_venv(interpreter: str, where: Path, indexes: Indexes) -> tuple[Path, str]:
    """A venv whose pip is the newest the index offers (the venv's own pip if that fails)."""
    subprocess.run([interpreter, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    up = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--upgrade",
                         *indexes.pip_args(), "pip"], env=pip_env(), capture_output=True,
                        text=True)
    if up.returncode != 0:
        log(f"warning: could not upgrade pip in the resolver venv ({up.stderr.strip()[-300:]})"
            "; resolving with the venv's bundled pip")
    version = subprocess.run([str(py), "-c", "import pip; print(pip.__version__)"],
                             check=True, capture_output=True, text=True).stdout.strip()
    if tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (22, 2):
        raise LockError(f"pip {version} has no stable --report format (needs >= 22.2)")
    return py, version


def platform_args(glibc: str) -> list[str]:
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2:
        raise LockError(f"--glibc {glibc}: expected 2.NN")
    args: list[str] = []
    for m in range(minor, 4, -1):
        args += ["--platform", f"manylinux_2_{m}_x86_64"]
    for legacy in ("manylinux2014", "manylinux2010", "manylinux1"):
        if LEGACY_MANYLINUX[legacy] <= (major, minor):
            args += ["--platform", f"{legacy}_x86_64"]
    return args + ["--platform", "linux_x86_64"]


def resolve_args(version: str, python: str, glibc: str, indexes: Indexes,
                 stub_dir: Path, constraints: Path | None, report: Path,
                 target: Path, package: str = "sglang", extra: tuple[str, ...] = ()
                 ) -> list[str]:
    abi = "cp" + python.replace(".", "")
    args = ["install", "--dry-run", "--ignore-installed", "--quiet",
            "--report", str(report), "--only-binary=:all:", "--target", str(target),
            "--python-version", python, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none", *platform_args(glibc),
            *indexes.pip_args(), "--find-links", str(stub_dir)]
    if constraints is not None:
        args += ["-c", str(constraints)]
    return args + [f"{package}=={version}", *extra]


def run_resolve(py: Path, args: list[str]) -> dict:
    report = Path(args[args.index("--report") + 1])
    log("+ pip " + " ".join(args))
    proc = subprocess.run([str(py), "-m", "pip", *args], env=pip_env(), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise LockError(f"pip could not resolve:\n{proc.stderr.strip()[-4000:]}")
    return json.loads(report.read_text())


def build_stub_wheels(stub_dir: Path) -> None:
    """Metadata-only wheels for PLACEHOLDERS, so ``--only-binary`` resolves through them."""
    stub_dir.mkdir(parents=True, exist_ok=True)
    for ph in PLACEHOLDERS:
        dist = f"{ph.name.replace('-', '_')}-{ph.version}"
        metadata = "".join([
            "Metadata-Version: 2.1\n", f"Name: {ph.name}\n", f"Version: {ph.version}\n",
            "Summary: metadata-only stand-in for tools/gen_lock.py resolves (not installable)\n",
            f"Requires-Python: {ph.requires_python}\n",
            *(f"Requires-Dist: {r}\n" for r in ph.requires_dist)])
        wheel = ("Wheel-Version: 1.0\nGenerator: gpuserve-gen-lock\nRoot-Is-Purelib: true\n"
                 "Tag: py3-none-any\n")
        files = {f"{dist}.dist-info/METADATA": metadata, f"{dist}.dist-info/WHEEL": wheel}
        record = "".join(f"{p},,\n" for p in files) + f"{dist}.dist-info/RECORD,,\n"
        with zipfile.ZipFile(stub_dir / f"{dist}-py3-none-any.whl", "w") as zf:
            for path, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
                zf.writestr(path, text)


# --------------------------------------------------------------------------
# Facts read from PyPI and from the wheels.
# --------------------------------------------------------------------------

_PROJECT_JSON: dict[str, dict | None] = {}


def pypi_files(name: str, version: str) -> dict[str, dict]:
    """PyPI's files of one release by filename (``size``, ``digests``, ``url``)."""
    got = http(f"{PYPI_JSON}/{name}/{version}/json", ok404=True)
    base = f"{PYPI_JSON}/{name}/{version}/json"
    if got is not None:
        files = json.loads(got[0]).get("urls") or []
    else:  # some mirrors serve only the project document
        if name not in _PROJECT_JSON:
            proj = http(f"{PYPI_JSON}/{name}/json", ok404=True)
            _PROJECT_JSON[name] = json.loads(proj[0]) if proj else None
        doc = _PROJECT_JSON[name] or {}
        files = (doc.get("releases") or {}).get(version) or []
        base = f"{PYPI_JSON}/{name}/json"
    return {f["filename"]: {**f, "url": urllib.parse.urljoin(base, f["url"])} for f in files}


def file_facts(name: str, version: str, url: str, sha256: str | None) -> tuple[str, int]:
    """(sha256, size) of one resolved file, cross-checked where two sources exist."""
    filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
    if url.startswith("file:"):
        path = _file_path(url)
        digest = sha256_file(path)
        if sha256 and sha256 != digest:
            raise LockError(f"{path}: sha256 {digest}, pip reported {sha256}")
        return digest, path.stat().st_size
    if not sha256:
        raise LockError(f"{name} {version}: the index gave no sha256 for {url}")
    if urllib.parse.urlparse(url).hostname == "files.pythonhosted.org":
        info = pypi_files(name, version).get(filename)
        if info is not None:
            if info["digests"]["sha256"] != sha256:
                raise LockError(f"{filename}: PyPI JSON says sha256 {info['digests']['sha256']}"
                                f", pip's report {sha256}")
            return sha256, int(info["size"])
    got = http(url, method="HEAD")
    assert got is not None
    length = {k.lower(): v for k, v in got[1].items()}.get("content-length")
    if length is None:
        raise LockError(f"{url}: no size from the JSON API or a HEAD request")
    return sha256, int(length)


def wheel_facts(item: dict) -> dict:
    """One resolved wheel of a pip report: name, version, file name, URL, sha256, size
    (checked against PyPI by :func:`file_facts`); never a directory or VCS checkout."""
    meta, info = item["metadata"], item["download_info"]
    name = canonicalize_name(meta["name"])
    if info.get("dir_info") or info.get("vcs_info"):
        raise LockError(f"{name}: resolved to a directory or VCS checkout ({info['url']})")
    hashes = (info.get("archive_info") or {}).get("hashes") or {}
    sha, size = file_facts(name, meta["version"], info["url"], hashes.get("sha256"))
    return {"name": name, "version": meta["version"],
            "filename": urllib.parse.unquote(info["url"].rsplit("/", 1)[-1]),
            "url": info["url"], "sha256": sha, "size": size}


def resolved_packages(report: dict, facts=wheel_facts) -> list[dict]:
    """Every package of the report through ``facts`` (in parallel: each may fetch a
    wheel's header from PyPI), sorted by name, each name once."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        packages = sorted(pool.map(facts, report["install"]), key=lambda p: p["name"])
    names = [p["name"] for p in packages]
    if len(set(names)) != len(names):
        raise LockError(f"duplicate packages in the report: {names}")
    return packages


def lock_header(report: dict, indexes: Indexes, glibc: str, pip_version: str,
                command: str) -> dict:
    """What every lock says of how it was resolved (format, generator, the resolve)."""
    return {
        "lock_format": LOCK_FORMAT,
        "generator": GENERATOR,
        "resolved": {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
            "pip": pip_version,
            "interpreter": report["environment"]["python_full_version"],
            "index": indexes.index_url,
            "extra_index_urls": list(indexes.extra_index_urls),
            "find_links": list(indexes.find_links),
            "glibc_offered": glibc,
            "command": command,
        },
    }


def glibc_floor(filename: str) -> tuple[int, int] | None:
    """The lowest glibc any of a wheel's platform tags accepts; None for non-manylinux."""
    floors = []
    for tag in parse_wheel_filename(filename)[3]:
        m = re.match(r"^manylinux_(\d+)_(\d+)_", tag.platform)
        if m:
            floors.append((int(m.group(1)), int(m.group(2))))
        elif tag.platform.split("_", 1)[0] in LEGACY_MANYLINUX:
            floors.append(LEGACY_MANYLINUX[tag.platform.split("_", 1)[0]])
    return min(floors) if floors else None


def _cached(kind: str, key: str, produce) -> dict:
    path = CACHE_DIR / kind / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    value = produce()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)
    return value


def torch_version_py(pkg: dict) -> dict:
    """``__version__`` and ``cuda`` from the torch wheel's torch/version.py (range read)."""
    def read() -> dict:
        with open_wheel(pkg["url"], pkg["size"]) as zf:
            text = zf.read("torch/version.py").decode()
        values: dict = {}
        for node in ast.parse(text).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else (
                node.target if isinstance(node, ast.AnnAssign) else None)
            if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
                try:
                    values[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
        return {"__version__": values.get("__version__"), "cuda": values.get("cuda")}
    return _cached("torch-version", pkg["sha256"], read)


FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)


def fatbin_archs(data: bytes) -> tuple[set[int], set[int]]:
    """(SASS archs, PTX archs) listed in the ``.nv_fatbin`` section of an ELF64 .so.

    Fatbin layout (cuobjdump's, as documented by reverse engineering): a 16-byte
    header (magic 0xBA55ED50, u16 version, u16 header size, u64 payload size), then
    entries (u16 kind: 1 PTX, 2 or 0x10 cubin; u32 entry header size at 4; u64 padded
    payload size at 8; u32 SM number at 28) back to back.
    """
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise LockError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    sass: set[int] = set()
    ptx: set[int] = set()
    for sh_name, _type, _flags, _addr, offset, size in sections:
        if names[sh_name:names.index(b"\0", sh_name)] != b".nv_fatbin":
            continue
        blob, pos = data[offset:offset + size], 0
        while (pos := blob.find(FATBIN_MAGIC, pos)) != -1 and pos + 16 <= len(blob):
            _magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, pos)
            entry, end = pos + hsize, min(len(blob), pos + hsize + fsize)
            while entry + 32 <= end:
                kind, _v, ehsize, padded = struct.unpack_from("<HHIQ", blob, entry)
                arch, = struct.unpack_from("<I", blob, entry + 28)
                if ehsize == 0:
                    break
                if kind == 1:
                    ptx.add(arch)
                elif kind in (2, 0x10):
                    sass.add(arch)
                entry += ehsize + padded
            pos = max(end, pos + 16)
    return sass, ptx


def kernel_archs(pkg: dict) -> dict:
    """SASS and PTX architectures of every kernel .so small enough to range read."""
    def read() -> dict:
        files: dict[str, dict] = {}
        skipped = []
        with open_wheel(pkg["url"], pkg["size"]) as zf:
            for info in zf.infolist():
                if not re.search(r"\.so(\.\d+)*$", info.filename):
                    continue
                if info.compress_size > ARCH_SCAN_LIMIT:
                    skipped.append(f"{info.filename} ({info.compress_size} bytes compressed)")
                    continue
                sass, ptx = fatbin_archs(zf.read(info))
                files[info.filename] = {"sass": sorted(sass), "ptx": sorted(ptx)}
        return {"files": files, "skipped": skipped}
    return _cached("kernel-archs", pkg["sha256"], read)


def check_placeholder(ph: Placeholder) -> dict:
    """The PyPI sdist of a placeholder: still a wheel_stub, same metadata as our table."""
    files = pypi_files(ph.name, ph.version)
    sdists = [f for f in files.values() if f["filename"].endswith((".tar.gz", ".zip"))]
    if not sdists or any(f["filename"].endswith(".whl") for f in files.values()):
        raise LockError(f"{ph.name} {ph.version} on PyPI is no longer a lone sdist "
                        f"({sorted(files)}); revisit PLACEHOLDERS")
    sdist = sdists[0]
    path = CACHE_DIR / "sdist" / sdist["filename"]
    if not path.exists() or sha256_file(path) != sdist["digests"]["sha256"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        got = http(sdist["url"])
        assert got is not None
        path.write_bytes(got[0])
    if sha256_file(path) != sdist["digests"]["sha256"]:
        raise LockError(f"{path}: sha256 differs from PyPI's")
    with tarfile.open(path) as tf:
        top = f"{sdist['filename'].removesuffix('.tar.gz')}/"
        pkg_info = tf.extractfile(top + "PKG-INFO").read().decode()  # type: ignore[union-attr]
        pyproject = tomllib.loads(tf.extractfile(top + "pyproject.toml").read().decode())  # type: ignore[union-attr]
    meta = email.parser.Parser().parsestr(pkg_info)
    plain = sorted(r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r)
    index = (pyproject.get("tool", {}).get("wheel_stub", {}) or {}).get("index_url")
    backend = pyproject.get("build-system", {}).get("build-backend", "")
    problems = []
    if not backend.startswith("wheel_stub"):
        problems.append(f"build backend is {backend!r}, not wheel_stub")
    if index != ph.index:
        problems.append(f"wheel_stub index_url is {index!r}, table says {ph.index!r}")
    if meta.get("Requires-Python") != ph.requires_python:
        problems.append(f"Requires-Python {meta.get('Requires-Python')!r}, table says "
                        f"{ph.requires_python!r}")
    if plain != sorted(ph.requires_dist):
        problems.append(f"Requires-Dist {plain}, table says {list(ph.requires_dist)}")
    if problems:
        raise LockError(f"{ph.name} {ph.version}: PyPI's placeholder disagrees with "
                        f"PLACEHOLDERS: {'; '.join(problems)}")
    return {"filename": sdist["filename"], "sha256": sdist["digests"]["sha256"]}


# --------------------------------------------------------------------------
# From a report to a lock.
# --------------------------------------------------------------------------


def _minor_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def compiler_drift(report: dict) -> list[str]:
    """Constraints pinning the compiler wheels to the runtime's minor, if any drifted."""
    versions = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in report["install"]}
    runtimes = [v for n, v in versions.items() if RUNTIME_RE.match(n)]
    if len(runtimes) != 1:
        raise LockError(f"expected one nvidia-cuda-runtime wheel, got {runtimes}")
    minor = _minor_of(runtimes[0])
    compilers = {n: v for n, v in versions.items() if COMPILER_RE.match(n)}
    if all(_minor_of(v) == minor for v in compilers.values()):
        return []
    return [f"{n}=={minor}.*" for n in sorted(compilers)]


def cuda_runtime_closure(report: dict) -> dict[str, str]:
    """The CUDA wheels torch requires (through extras such as cuda-toolkit[cublas,...])."""
    items = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    env = dict(report["environment"])
    found: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [("torch", frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in items:
            continue
        seen.add((name, extras))
        for text in items[name]["metadata"].get("requires_dist") or []:
            req = Requirement(text)
            dep = canonicalize_name(req.name)
            if not CUDA_WHEEL_RE.match(dep) or dep not in items:
                continue
            if req.marker and not any(
                    Marker(str(req.marker)).evaluate({**env, "extra": e})
                    for e in (extras or {""})):
                continue
            found[dep] = items[dep]["metadata"]["version"]
            todo.append((dep, frozenset(req.extras)))
    return dict(sorted(found.items()))


def catalog_sha(version: str) -> tuple[str, str] | None:
    """(wheel filename, sha256) the flag catalog of ``version`` was generated from."""
    path = FLAGS_DIR / f"sglang-{version}.json"
    if not path.exists():
        return None
    source = json.loads(path.read_text())["source"]
    m = re.match(r"^(\S+) from .*\(sha256 ([0-9a-f]{64})\)$", source)
    return (m.group(1), m.group(2)) if m else None


def build_lock(version: str, python: str, glibc: str, indexes: Indexes, report: dict,
               stub_dir: Path, constraints: list[str], pip_version: str,
               command: str) -> dict:
    stub_url = stub_dir.resolve().as_uri()
    used_stubs = {canonicalize_name(i["metadata"]["name"]) for i in report["install"]
                  if i["download_info"]["url"].startswith(stub_url)}
    placeholders = {ph.name: ph for ph in PLACEHOLDERS}
    external = []
    for name in sorted(used_stubs):
        ph = placeholders[name]
        sdist = check_placeholder(ph)
        external.append({"name": ph.name, "version": ph.version, "why": ph.why,
                         "index": ph.index, "placeholder_sdist": sdist})

    def facts(item: dict) -> dict:
        meta = item["metadata"]
        name = canonicalize_name(meta["name"])
        if name in used_stubs:
            return {"name": name, "version": meta["version"], "filename": None, "url": None,
                    "sha256": None, "size": None, "external": True,
                    "index": placeholders[name].index}
        return wheel_facts(item)

    packages = resolved_packages(report, facts)
    by_name = {p["name"]: p for p in packages}
    meta_by_name = {canonicalize_name(i["metadata"]["name"]): i["metadata"]
                    for i in report["install"]}

    sglang = by_name.get("sglang")
    torch = by_name.get("torch")
    if sglang is None or torch is None or sglang.get("external") or torch.get("external"):
        raise LockError("the resolved set lacks a sglang or torch wheel")
    tv = torch_version_py(torch)
    if not tv["cuda"]:
        raise LockError(f"{torch['filename']}: torch/version.py has no CUDA (a CPU build?)")
    # PyPI's torch is "2.14.1" with version.py "2.14.1+cu130"; a wheel whose own version
    # has a local label (download.pytorch.org's "+cu130", a wheelhouse's) says it in both.
    if str(tv["__version__"]) != torch["version"] and \
            str(tv["__version__"]).split("+", 1)[0] != torch["version"]:
        raise LockError(f"{torch['filename']}: version.py says {tv['__version__']}")
    torch_cuda = _minor_of(str(tv["cuda"]))
    cuda_major = int(torch_cuda.split(".")[0])
    if torch_cuda not in DRIVER_MIN:
        raise LockError(f"torch {torch['version']} is built for CUDA {torch_cuda}; add its "
                        f"row to DRIVER_MIN from {DRIVER_SOURCE}")
    driver_min, row = DRIVER_MIN[torch_cuda]
    runtime = cuda_runtime_closure(report)
    rt = [v for n, v in runtime.items() if RUNTIME_RE.match(n)]
    if not rt or _minor_of(rt[0]) != torch_cuda:
        raise LockError(f"torch says CUDA {torch_cuda}, the runtime wheels are {runtime}")
    drift = {n: v for n, v in by_name.items()
             if COMPILER_RE.match(n) and _minor_of(v["version"]) != torch_cuda}
    if drift:
        raise LockError(f"compiler wheels still off CUDA {torch_cuda}: "
                        f"{ {n: v['version'] for n, v in drift.items()} }")

    floors = [f for p in packages if p.get("filename") and (f := glibc_floor(p["filename"]))]
    glibc_min = max(floors) if floors else (2, 5)

    kernel = next((by_name[k] for k in KERNEL_WHEELS if k in by_name), None)
    if kernel is None:
        archs, ptx, archs_source = [], [], "no sgl-kernel/sglang-kernel wheel in the resolved set"
    else:
        scan = kernel_archs(kernel)
        files = scan["files"]
        # The core library sgl_kernel loads at import for every model (common_ops, one
        # build per sm90/ sm100/ directory); the other .so files serve some models only.
        core = {n: f for n, f in files.items() if re.search(r"(^|/)common_ops[.]", n)} or files
        archs = [f"sm_{a}" for a in sorted({a for f in core.values() for a in f["sass"]})]
        ptx = [f"compute_{a}" for a in sorted({a for f in core.values() for a in f["ptx"]})]
        per_file = "; ".join(f"{name}: {'/'.join(f'sm_{a}' for a in f['sass']) or 'none'}"
                             + (f" + PTX {'/'.join(f'compute_{a}' for a in f['ptx'])}"
                                if f["ptx"] else "")
                             for name, f in files.items())
        archs_source = (f"cuda_archs = SASS (cubin) architectures of {', '.join(core)} in "
                        f"{kernel['filename']}, read from the .nv_fatbin entry headers. "
                        f"All .so files: {per_file}"
                        + (f"; not read (over {ARCH_SCAN_LIMIT >> 20} MiB compressed): "
                           + ", ".join(scan["skipped"]) if scan["skipped"] else ""))

    cat = catalog_sha(version)
    if cat is None:
        log(f"note: no flag catalog for sglang {version}; sglang_sha256 not cross-checked")
    elif cat[0] == sglang["filename"]:
        if cat[1] != sglang["sha256"]:
            raise LockError(f"{sglang['filename']}: sha256 {sglang['sha256']}, but "
                            f"gpuserve/data/flags/sglang-{version}.json was generated from "
                            f"sha256 {cat[1]}")
        log(f"sglang_sha256 equals the flag catalog's source ({cat[0]})")
    else:
        log(f"note: the flag catalog was read from {cat[0]}, this lock installs "
            f"{sglang['filename']}; sha256 not comparable")

    return {
        **lock_header(report, indexes, glibc, pip_version, command),
        "sglang": sglang["version"],
        "sglang_sha256": sglang["sha256"],
        "python": python,
        "requires_python": meta_by_name["sglang"].get("requires_python"),
        "platform": f"manylinux_{glibc_min[0]}_{glibc_min[1]}_x86_64",
        "glibc_min": f"{glibc_min[0]}.{glibc_min[1]}",
        "torch": torch["version"],
        "torch_cuda": torch_cuda,
        "cuda_major": cuda_major,
        "cuda_runtime": runtime,
        "driver_min": driver_min,
        "driver_source": f"{DRIVER_SOURCE}: {row} >= {driver_min}",
        "cuda_archs": archs,
        "cuda_archs_source": archs_source,
        "cuda_ptx": ptx,
        "constraints": constraints,
        "download_bytes": sum(p["size"] or 0 for p in packages),
        "external": external,
        "packages": packages,
    }


def build_app_lock(package: str, version: str, python: str, glibc: str,
                   indexes: Indexes, report: dict, pip_version: str, command: str) -> dict:
    """The lock of a package that is not SGLang (``--package smg``): every wheel of the
    resolve with its sha256 and size, the package's own wheel named in the header, and
    the glibc floor of the wheels' manylinux tags. No placeholders, no CUDA facts."""
    packages = resolved_packages(report)
    key = canonicalize_name(package)
    own = next((p for p in packages if p["name"] == key), None)
    if own is None or own["version"] != version:
        raise LockError(f"the resolved set lacks {package}=={version}")
    meta = next(i["metadata"] for i in report["install"]
                if canonicalize_name(i["metadata"]["name"]) == key)
    floors = [f for p in packages if (f := glibc_floor(p["filename"]))]
    glibc_min = max(floors) if floors else (2, 5)
    return {
        **lock_header(report, indexes, glibc, pip_version, command),
        "package": key,
        "version": own["version"],
        "sha256": own["sha256"],
        "python": python,
        "requires_python": meta.get("requires_python"),
        "platform": f"manylinux_{glibc_min[0]}_{glibc_min[1]}_x86_64",
        "glibc_min": f"{glibc_min[0]}.{glibc_min[1]}",
        "download_bytes": sum(p["size"] for p in packages),
        "packages": packages,
    }


def generate(version: str, python: str, glibc: str, indexes: Indexes,
             interpreter: str | None, package: str = "sglang",
             extra: tuple[str, ...] = ()) -> dict:
    exe = find_interpreter(python, interpreter)
    with tempfile.TemporaryDirectory(prefix="gpuserve-lock-") as tmp_s:
        tmp = Path(tmp_s)
        py, pip_version = make_venv(exe, tmp / "venv", indexes)
        stub_dir = tmp / "placeholders"
        build_stub_wheels(stub_dir)
        report_path, target = tmp / "report.json", tmp / "target"
        args = resolve_args(version, python, glibc, indexes, stub_dir, None, report_path, target,
                            package, extra)
        report = run_resolve(py, args)
        if package != "sglang":
            command = " ".join(["pip", *args]).replace(str(tmp), "<tmp>")
            return build_app_lock(package, version, python, glibc, indexes, report,
                                  pip_version, command)
        constraints = compiler_drift(report)
        if constraints:
            log(f"compiler wheels drifted off the runtime's minor; re-resolving with "
                f"{constraints}")
            cfile = tmp / "constraints.txt"
            cfile.write_text("".join(c + "\n" for c in constraints))
            args = resolve_args(version, python, glibc, indexes, stub_dir, cfile, report_path,
                                target, extra=extra)
            report = run_resolve(py, args)
        command = " ".join(["pip", *args]).replace(str(tmp), "<tmp>")
        return build_lock(version, python, glibc, indexes, report, stub_dir, constraints,
                          pip_version, command)


def lock_path(out_dir: Path, lock: dict) -> Path:
    py = lock["python"].replace(".", "")
    if "package" in lock:  # an app lock (--package smg)
        return out_dir / f"{lock['package']}-{lock['version']}-py{py}.json"
    return out_dir / f"sglang-{lock['sglang']}-cu{lock['cuda_major']}-py{py}.json"


def render(lock: dict) -> str:
    return json.dumps(lock, indent=1, ensure_ascii=False) + "\n"


def _comparable(lock: dict) -> str:
    return render({k: v for k, v in lock.items() if k != "resolved"})


def check(lock: dict, path: Path) -> int:
    """0 when the committed lock pins what the index resolves today, else 1 with a diff."""
    if not path.exists():
        log(f"{path}: no committed lock to check")
        return 1
    old = json.loads(path.read_text())
    diff = list(difflib.unified_diff(_comparable(old).splitlines(), _comparable(lock).splitlines(),
                                     f"{path} (committed)", "resolved now", lineterm=""))
    if diff:
        print("\n".join(diff))
        log(f"{path}: the index now resolves something else (resolved section ignored)")
        return 1
    log(f"{path}: up to date ({len(lock['packages'])} packages)")
    return 0


def summary(lock: dict) -> str:
    if "package" in lock:
        return (f"{lock['package']} {lock['version']} py{lock['python']}: "
                f"{len(lock['packages'])} packages, {lock['download_bytes'] / 2**20:.1f} MiB, "
                f"glibc >= {lock['glibc_min']}")
    return (f"sglang {lock['sglang']} py{lock['python']}: {len(lock['packages'])} packages, "
            f"{lock['download_bytes'] / 2**30:.2f} GiB, torch {lock['torch']} (CUDA "
            f"{lock['torch_cuda']}), driver >= {lock['driver_min']}, glibc >= "
            f"{lock['glibc_min']}, archs {'/'.join(lock['cuda_archs'])}, "
            f"external {[e['name'] for e in lock['external']]}")


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", help="SGLang release, e.g. 0.5.23 (or --package's release)")
    ap.add_argument("--package", default="sglang",
                    help="the package to lock (default sglang; e.g. smg, SGLang's gateway)")
    ap.add_argument("--python", default="3.11", help="target Python minor (default 3.11)")
    ap.add_argument("--glibc", default="2.36",
                    help="host glibc: offers manylinux_2_<N>..2_5 tags (default 2.36, Debian 12)")
    ap.add_argument("--index-url", default=DEFAULT_INDEX)
    ap.add_argument("--extra-index-url", action="append", default=[])
    ap.add_argument("--find-links", action="append", default=[],
                    help="a local wheel directory (or URL) to resolve from as well")
    ap.add_argument("--with", dest="extra", action="append", default=[], metavar="REQ",
                    help="a further requirement resolved into the same lock (repeatable), "
                    "e.g. mooncake-transfer-engine for a PD fleet (docs/disaggregation.md)")
    ap.add_argument("--interpreter", help="Python of the target minor that runs the resolver")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    ap.add_argument("--check", action="store_true",
                    help="re-resolve and compare with the committed lock; exit 1 with a diff")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if not re.fullmatch(r"3\.\d+", args.python):
        ap.error(f"--python {args.python}: expected 3.N")
    find_links = tuple(str(Path(f).resolve()) if "://" not in f else f for f in args.find_links)
    indexes = Indexes(args.index_url, tuple(args.extra_index_url), find_links)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.package):
        ap.error(f"--package {args.package}: expected a project name")
    lock = generate(args.version, args.python, args.glibc, indexes, args.interpreter,
                    args.package, tuple(args.extra))
    path = lock_path(args.out_dir, lock)
    if args.check:
        return check(lock, path)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(render(lock))
    log(f"{path}: {summary(lock)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
