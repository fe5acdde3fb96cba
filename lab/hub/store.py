"""The Hub stand-in's repositories on disk: repo -> commits -> files, and their hashes.

Layout under the hub root (``<mirror>/hub``)::

    <org>/<name>/repo.json             access, branches, commits (id, parent, title, date)
    <org>/<name>/commits/<commit>/...  the commit's files (unchanged files hard-linked)
    <org>/<name>/commits/<commit>.json the commit's manifest: path -> size, lfs, sha256, blob
    <org>/<name>/commits/<commit>.hashes.json  hashes computed later (lazy files)

Hashes are what the Hub publishes: an LFS file's ``sha256`` (its ETag) and the git blob
id of its pointer file; a regular file's git blob sha1 (its ETag). Which files are LFS
comes from the commit's ``.gitattributes`` (``filter=lfs`` patterns), as on the Hub.
A file too big to hash at publish time (the sparse header-planning checkpoints) has
``sha256: null`` in its manifest and is hashed on the first request that needs it
(HEAD, a full GET, a listing), once, then cached in ``<commit>.hashes.json``.

Commit ids are 40-hex sha1s over the parent, the title and each file's path, size and
content id (its hash; for a lazy file the sha256 of its safetensors header, which with
the size fixes a sparse file's bytes): the same content gives the same id whatever code
composed it, so a profile may pin one. Not git's commit-object hash.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
#: Files up to this size are hashed when published; bigger ones on first need.
EAGER_HASH_MAX = 256 << 20
#: The Hub's default .gitattributes for a new model repository (abridged to its LFS rules).
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib",
    "*.lfs.*", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot",
    "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
    "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip",
    "*.zst", "*tfevents*"))
CHUNK = 1 << 20


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with these bytes (what the Hub calls ``oid``/``blobId``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_blob_sha1_file(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file the git repository holds in place of an LFS file."""
    spec = "https://git-lfs.github.com/spec/v1"
    return f"version {spec}\noid sha256:{sha256}\nsize {size}\n".encode()


def lfs_patterns(gitattributes: str) -> list[str]:
    out = []
    for line in gitattributes.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "filter=lfs" in parts[1:]:
            out.append(parts[0])
    return out


def is_lfs(path: str, patterns: list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in patterns)


@dataclass
class FileEntry:
    """One file of a commit, as the Hub describes it."""

    path: str
    size: int
    lfs: bool
    sha256: str | None = None  # LFS files: content sha256 (None until hashed)
    blob: str | None = None  # regular files: git blob sha1 of the content

    @property
    def hashed(self) -> bool:
        return (self.sha256 if self.lfs else self.blob) is not None

    @property
    def etag(self) -> str:
        """The content's id the Hub puts in ETag (sha256 for LFS, git sha1 otherwise)."""
        value = self.sha256 if self.lfs else self.blob
        assert value is not None, f"{self.path}: not hashed yet"
        return value

    @property
    def oid(self) -> str:
        """The git blob id: of the pointer file for LFS, of the content otherwise."""
        if not self.lfs:
            return self.etag
        return git_blob_sha1(lfs_pointer(self.etag, self.size))

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.etag, self.size))


@dataclass
class Commit:
    id: str
    parent: str | None
    title: str
    date: str
    files: dict[str, FileEntry] = field(default_factory=dict)


class Repo:
    """One repository directory; reads repo.json and manifests, hashes lazy files."""

    _lock = threading.Lock()

    def __init__(self, root: Path, repo_id: str) -> None:
        self.id = repo_id
        self.dir = root / repo_id
        self.meta = json.loads((self.dir / "repo.json").read_text())
        self._commits: dict[str, Commit] = {}

    @property
    def access(self) -> str:
        """``public``, ``gated`` or ``private``."""
        return self.meta.get("access", "public")

    @property
    def token_sha256(self) -> str | None:
        return self.meta.get("token_sha256")

    @property
    def branches(self) -> dict[str, str]:
        return dict(self.meta.get("branches", {}))

    def commit_ids(self) -> list[str]:
        return [c["id"] for c in self.meta.get("commits", [])]

    def commit(self, commit_id: str) -> Commit:
        if commit_id in self._commits:
            return self._commits[commit_id]
        info = next(c for c in self.meta["commits"] if c["id"] == commit_id)
        manifest = json.loads((self.dir / "commits" / f"{commit_id}.json").read_text())
        cached = {}
        hashes = self.dir / "commits" / f"{commit_id}.hashes.json"
        if hashes.is_file():
            cached = json.loads(hashes.read_text())
        files = {}
        for path, f in manifest["files"].items():
            entry = FileEntry(path=path, size=f["size"], lfs=f["lfs"], sha256=f.get("sha256"),
                              blob=f.get("blob"))
            if not entry.hashed and path in cached:
                entry.sha256, entry.blob = cached[path].get("sha256"), cached[path].get("blob")
            files[path] = entry
        c = Commit(id=commit_id, parent=info.get("parent"), title=info["title"],
                   date=info["date"], files=files)
        self._commits[commit_id] = c
        return c

    def file_path(self, commit_id: str, path: str) -> Path:
        return self.dir / "commits" / commit_id / path

    def ensure_hashed(self, commit_id: str, entry: FileEntry, log=None) -> FileEntry:
        """Hash a lazy file now (once; cached beside the manifest), for the requests
        whose answer must carry its id."""
        if entry.hashed:
            return entry
        src = self.file_path(commit_id, entry.path)
        if log:
            log(f"hub: hashing {self.id}@{commit_id[:12]}/{entry.path} ({entry.size:,} B) "
                "for its ETag: first request that needs it")
        if entry.lfs:
            entry.sha256 = sha256_file(src)
        else:
            entry.blob = git_blob_sha1_file(src)
        with self._lock:
            hashes = self.dir / "commits" / f"{commit_id}.hashes.json"
            data = json.loads(hashes.read_text()) if hashes.is_file() else {}
            data[entry.path] = {"sha256": entry.sha256, "blob": entry.blob}
            tmp = hashes.with_name(f".{hashes.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            tmp.replace(hashes)
        return entry


def list_repos(root: Path) -> list[str]:
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in root.glob("*/*/repo.json"))


def _describe(path: Path, rel: str, patterns: list[str], eager_max: int) -> dict:
    size = path.stat().st_size
    lfs = is_lfs(rel, patterns)
    entry: dict = {"size": size, "lfs": lfs, "sha256": None, "blob": None}
    if size <= eager_max:
        if lfs:
            entry["sha256"] = sha256_file(path)
        else:
            entry["blob"] = git_blob_sha1_file(path)
    return entry


def _files_of(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())


def _content_id(path: Path, f: dict) -> str:
    """What fixes a file's bytes: its hash, or (a lazy, sparse safetensors file) the
    sha256 of its 8-byte length and JSON header (the rest is holes)."""
    if f["sha256"] or f["blob"]:
        return f["sha256"] or f["blob"]
    with path.open("rb") as fh:
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
        head += fh.read(min(n, 100 << 20))
    return "header-sha256:" + hashlib.sha256(head).hexdigest()


def write_commit(repo_dir: Path, tree: Path, *, title: str, date: str, parent: str | None,
                 eager_max: int = EAGER_HASH_MAX) -> str:
    """Turn the directory ``tree`` into a commit of ``repo_dir`` (moved into place);
    returns its id."""
    gitattributes = tree / ".gitattributes"
    patterns = lfs_patterns(gitattributes.read_text()) if gitattributes.is_file() else []
    files = {rel: _describe(tree / rel, rel, patterns, eager_max) for rel in _files_of(tree)}
    h = hashlib.sha1(f"gpuserve-lab-hub commit\0{parent or ''}\0{title}\0".encode())
    for rel, f in files.items():
        h.update(f"{rel}\0{f['size']}\0{_content_id(tree / rel, f)}\0".encode())
    commit_id = h.hexdigest()
    commits = repo_dir / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    (commits / f"{commit_id}.json").write_text(
        json.dumps({"id": commit_id, "files": files}, indent=1, sort_keys=True) + "\n")
    final = commits / commit_id
    if final.exists():
        import shutil

        shutil.rmtree(final)
    tree.rename(final)
    return commit_id


def link_tree(src: Path, dest: Path) -> None:
    """A new commit's starting tree: every file of ``src`` hard-linked (sparse stays sparse)."""
    for rel in _files_of(src):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(src / rel, dest / rel)


def write_repo_json(repo_dir: Path, meta: dict) -> None:
    tmp = repo_dir / ".repo.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    tmp.replace(repo_dir / "repo.json")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
