"""The Hub stand-in's HTTP side: what huggingface_hub's client asks, answered from a
directory of repositories (lab/hub/store.py), plus the lab's fault knobs and counters.

Mounted under a path prefix of the lab mirror (``http://10.0.2.2:<port>/hub``, the
client's ``HF_ENDPOINT``) or run alone (:class:`HubServer`, the unit tests). Endpoints
and the client code that calls each (huggingface_hub 1.x):

- ``GET /api/models/{repo}[/revision/{rev}][?blobs=true]``: ``HfApi.model_info`` /
  ``repo_info`` (snapshot_download resolves a branch with it); ``blobs=true`` adds
  each sibling's ``size``, ``blobId`` and ``lfs {sha256, size, pointerSize}``.
- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand=[&cursor=]``:
  ``list_repo_tree`` (snapshot_download >= 1.22, ``verify_repo_checksums``), paged
  with a ``Link: <...>; rel="next"`` header as ``utils/_pagination.paginate`` follows.
- ``POST /api/models/{repo}/paths-info/{rev}``: ``get_paths_info`` (HfFileSystem).
- ``GET /api/models/{repo}/refs``: ``list_repo_refs``.
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (``Range`` honoured: 206 +
  ``Content-Range``): ``get_hf_file_metadata`` (``X-Repo-Commit``, ``ETag``,
  ``X-Linked-Etag``/``X-Linked-Size`` for LFS, ``Content-Length``), ``http_get``
  (resume with ``Range: bytes=N-``), ``parse_safetensors_file_metadata``
  (``Range: bytes=0-100000`` then ``bytes=8-{n+7}``). No ``X-Xet-*`` header: the client
  downloads over plain HTTP.
- Errors as ``hf_raise_for_status`` reads them: ``X-Error-Code`` (``RepoNotFound``,
  ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``) and ``X-Error-Message``; an
  anonymous request for a missing or private repository gets 401 like the Hub, an
  authenticated one 404; a gated repository 401 without a token, 403 with a wrong one.

The lab's own endpoints live under ``/_lab/`` (lab/hub/README.md): counters of what was
served, one-shot faults (a body cut after N bytes, corrupted bytes, a bare 404) and
moving a branch to another commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote

from lab.hub.store import CHUNK, COMMIT_RE, Commit, FileEntry, Repo, list_repos, token_digest

log = logging.getLogger("lab.hub")
DATE_FMT = "%Y-%m-%dT%H:%M:%S.000Z"
PAGE_SIZE = 1000
EXPAND_PAGE_SIZE = 50
MAX_LOG = 20000
CORRUPT_SPAN = 16
FAULT_KINDS = ("cut", "corrupt", "bare404", "status", "entries", "many", "self_page",
               "page_to", "hang", "echo_auth", "redirect", "endless", "ignore_range", "drip")


class HubError(Exception):
    """An error answer: status, X-Error-Code (None: a bare error), message."""

    def __init__(self, status: int, code: str | None, message: str,
                 commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass
class Fault:
    """A one-shot (``times``) misbehaviour of resolve GETs of ``repo``/``file``:
    ``cut`` closes the connection once the body reached byte ``after`` (absolute);
    ``corrupt`` serves bytes ``offset``.. ``offset+16`` inverted; ``bare404`` answers
    any request for the repository (or that file) 404 without X-Error-Code; ``status``
    answers it ``status`` (e.g. 503, or 429 with ``Retry-After: 1``), a Hub in trouble."""

    kind: str
    repo: str
    file: str | None = None
    times: int = 1
    after: int = 0
    offset: int | None = None
    status: int = 503
    entries: list | None = None  # ``entries``: raw tree entries added to the listing
    count: int = 0  # ``many``: that many extra file entries
    location: str | None = None  # ``redirect``, ``page_to``: where to send the client
    interval: float = 1.0  # ``drip``: seconds between two body bytes
    seconds: float = 0.0  # ``hang``: how long the request is left unanswered
    ua: str | None = None  # only for clients whose User-Agent holds this

    def matches(self, repo: str, file: str | None, ua: str = "") -> bool:
        return self.repo == repo and (self.file is None or self.file == file) and (
            self.ua is None or self.ua in ua)


@dataclass
class Served:
    """What one request was answered (the counters' log)."""

    method: str
    kind: str
    repo: str | None
    rev: str | None
    file: str | None
    range: str | None
    status: int
    bytes: int = 0
    fault: str | None = None
    auth: bool = False  # an Authorization header came with it


@dataclass
class HubState:
    """Per-process state: the counters, pending faults and branch moves."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[Served] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    refs: dict[str, dict[str, str]] = field(default_factory=dict)
    # set: LFS files answer 302 to http://<cdn_host>:<port><prefix>/_cdn/... as the Hub
    # answers with its CDN (another host, so the client keeps the 302's metadata and
    # sends no token there); None: served directly
    cdn_host: str | None = None

    def record(self, served: Served) -> None:
        with self.lock:
            self.requests.append(served)
            del self.requests[:-MAX_LOG]

    def take_fault(self, kinds: tuple[str, ...], repo: str, file: str | None,
                   ua: str = "") -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.kind in kinds and f.matches(repo, file, ua):
                    if f.times > 0:
                        f.times -= 1
                        if f.times == 0:
                            self.faults.remove(f)
                    return f
        return None

    def stats(self) -> dict:
        with self.lock:
            reqs = [asdict(r) for r in self.requests]
        files: dict[str, dict] = {}
        for r in reqs:
            if r["kind"] not in ("resolve", "cdn") or r["file"] is None:
                continue
            f = files.setdefault(f"{r['repo']}/{r['file']}", {
                "head": 0, "get_full": 0, "get_ranged": 0, "bytes": 0, "redirects": 0})
            if r["status"] == 302:
                f["redirects"] += 1
            elif r["method"] == "HEAD":
                f["head"] += 1
            elif r["range"]:
                f["get_ranged"] += 1
            else:
                f["get_full"] += 1
            f["bytes"] += r["bytes"]
        return {"requests": reqs, "files": files}


class Hub:
    """The repositories under ``root`` as the Hub answers for them; ``prefix`` is the
    path the endpoint sits under (``/hub`` on the lab mirror, ``""`` alone)."""

    def __init__(self, root: Path, prefix: str = "", page_size: int = PAGE_SIZE,
                 expand_page_size: int = EXPAND_PAGE_SIZE) -> None:
        self.root = Path(root)
        self.prefix = prefix.rstrip("/")
        self.page_size, self.expand_page_size = page_size, expand_page_size
        self.state = HubState()

    # -- repositories ---------------------------------------------------------------
    def repo(self, repo_id: str, token: str | None) -> Repo:
        if not (self.root / repo_id / "repo.json").is_file() or ".." in repo_id:
            raise self._repo_not_found(token)
        repo = Repo(self.root, repo_id)
        if repo.access == "public":
            return repo
        ok = token is not None and repo.token_sha256 == token_digest(token)
        if ok:
            return repo
        if repo.access == "private":
            raise self._repo_not_found(token)
        if token is None:
            raise HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must "
                           "have access to it and be authenticated to access it. Please log in.")
        raise HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are "
                       "not in the authorized list. Visit the model page to ask for access.")

    @staticmethod
    def _repo_not_found(token: str | None) -> HubError:
        # the Hub answers anonymous requests for missing and private repos alike with 401
        return HubError(404 if token else 401, "RepoNotFound", "Repository not found")

    def branches(self, repo: Repo) -> dict[str, str]:
        with self.state.lock:
            moved = dict(self.state.refs.get(repo.id, {}))
        return {**repo.branches, **moved}

    def resolve_rev(self, repo: Repo, rev: str) -> Commit:
        branches = self.branches(repo)
        if rev in branches:
            return repo.commit(branches[rev])
        if COMMIT_RE.match(rev) and rev in repo.commit_ids():
            return repo.commit(rev)
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    def move_branch(self, repo_id: str, branch: str, commit: str) -> None:
        repo = Repo(self.root, repo_id)
        if commit not in repo.commit_ids():
            raise HubError(400, None, f"{repo_id} has no commit {commit}")
        with self.state.lock:
            self.state.refs.setdefault(repo_id, {})[branch] = commit

    def hashed(self, repo: Repo, commit: Commit, entry: FileEntry) -> FileEntry:
        return repo.ensure_hashed(commit.id, entry, log=log.warning)


# -- request handling -------------------------------------------------------------------
def _token(h: BaseHTTPRequestHandler) -> str | None:
    auth = h.headers.get("authorization") or ""
    return auth[7:].strip() or None if auth.lower().startswith("bearer ") else None


def _send(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes = b"",
          head: bool = False) -> int:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    if "Content-Length" not in headers:
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if not head and body:
        h.wfile.write(body)
        return len(body)
    return 0


def _json(h: BaseHTTPRequestHandler, doc, status: int = 200, extra: dict | None = None,
          head: bool = False) -> int:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return _send(h, status, {"Content-Type": "application/json; charset=utf-8", **(extra or {})},
                 body, head)


def _error(h: BaseHTTPRequestHandler, err: HubError, head: bool = False) -> int:
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if err.status == 429:
        headers["Retry-After"] = "1"
    if err.code:
        headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message
    if err.commit:
        headers["X-Repo-Commit"] = err.commit
    body = json.dumps({"error": err.message}).encode()
    return _send(h, err.status, headers, body, head)


def handle(hub: Hub, h: BaseHTTPRequestHandler, method: str) -> None:
    """Answer one request whose path starts with ``hub.prefix``."""
    raw, _, query = h.path.partition("?")
    sub = raw[len(hub.prefix):] or "/"
    served = Served(method=method, kind="other", repo=None, rev=None, file=None,
                    range=h.headers.get("range"), status=200,
                    auth=bool(h.headers.get("authorization")))
    try:
        if sub.startswith("/_cdn/"):
            served.kind = "cdn"
            served.bytes = _cdn(hub, h, method, sub, served)
        elif sub.startswith("/_lab/"):
            served.kind = "lab"
            served.bytes = _control(hub, h, method, sub[len("/_lab/"):], query)
        elif sub.startswith("/api/"):
            served.kind = "api"
            served.bytes = _api(hub, h, method, sub, query, served)
        else:
            served.kind = "resolve"
            served.bytes = _resolve(hub, h, method, sub, served)
    except HubError as err:
        served.status = err.status
        _error(h, err, head=method == "HEAD")
    except _Answered:
        served.fault = "answered by a fault"
    except (BrokenPipeError, ConnectionResetError):
        served.status = 499
    if served.kind != "lab":
        hub.state.record(served)


def _split(sub: str) -> list[str]:
    return [s for s in sub.split("/") if s != ""]


def _api(hub: Hub, h, method: str, sub: str, query: str, served: Served) -> int:
    segs = _split(sub)  # api, models, org, name, ...
    if len(segs) < 4 or segs[1] != "models":
        raise HubError(404, "RepoNotFound", "Repository not found (the lab's Hub stand-in "
                       "serves model repositories only)")
    repo_id = f"{unquote(segs[2])}/{unquote(segs[3])}"
    served.repo = repo_id
    token = _token(h)
    _bare404(hub, repo_id, None, h)
    repo = hub.repo(repo_id, token)
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    rest = segs[4:]
    if not rest or rest[0] == "revision":
        rev = unquote(rest[1]) if len(rest) > 1 else "main"
        served.rev = rev
        commit = hub.resolve_rev(repo, rev)
        return _json(h, _model_info(hub, repo, commit, params.get("blobs") == "true"),
                     head=method == "HEAD")
    if rest[0] == "tree" and len(rest) >= 2:
        rev = unquote(rest[1])
        served.rev = rev
        commit = hub.resolve_rev(repo, rev)
        path = "/".join(unquote(s) for s in rest[2:])
        return _tree(hub, h, repo, commit, path, params)
    if rest[0] == "paths-info" and len(rest) >= 2 and method == "POST":
        served.rev = unquote(rest[1])
        return _paths_info(hub, h, repo, hub.resolve_rev(repo, served.rev))
    if rest[0] == "refs":
        branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": c}
                    for b, c in sorted(hub.branches(repo).items())]
        return _json(h, {"branches": branches, "converts": [], "tags": []})
    raise HubError(404, None, f"no such endpoint: {sub}")


def _bare404(hub: Hub, repo_id: str, file: str | None, h=None) -> None:
    """The request-wide faults: a 404 without X-Error-Code, or another status; ``hang``
    (no answer for ``seconds``), ``echo_auth`` (``status`` with the request's
    Authorization header in the page, as a careless proxy's error page),
    ``redirect`` (302 to ``location``, e.g. ``file:///etc/passwd``)."""
    if h is not None:
        _answer_faults(hub, repo_id, file, h)
    fault = hub.state.take_fault(("bare404", "status"), repo_id, file)
    if fault is None:
        return
    if fault.kind == "bare404":
        raise HubError(404, None, "Not Found")
    raise HubError(fault.status, None, f"lab fault: status {fault.status}")


def _answer_faults(hub: Hub, repo_id: str, file: str | None, h) -> None:
    fault = hub.state.take_fault(("hang", "echo_auth", "redirect"), repo_id, file, _ua(h))
    if fault is None:
        return
    if fault.kind == "hang":
        time.sleep(min(fault.seconds, 600))
        h.close_connection = True
        raise _Answered()
    if fault.kind == "echo_auth":
        page = (f"<html>upstream error; request headers: Authorization: "
                f"{h.headers.get('authorization')}</html>").encode()
        _send(h, fault.status, {"Content-Type": "text/html"}, page)
        raise _Answered()
    _send(h, 302, {"Location": fault.location or "file:///etc/passwd"})
    raise _Answered()


def _model_info(hub: Hub, repo: Repo, commit: Commit, blobs: bool) -> dict:
    siblings = []
    for path, entry in sorted(commit.files.items()):
        s: dict = {"rfilename": path}
        if blobs:
            entry = hub.hashed(repo, commit, entry)
            s.update(size=entry.size, blobId=entry.oid)
            if entry.lfs:
                s["lfs"] = {"sha256": entry.sha256, "size": entry.size,
                            "pointerSize": entry.pointer_size}
        siblings.append(s)
    org = repo.id.split("/")[0]
    meta = repo.meta
    return {
        "_id": commit.id[:24], "id": repo.id, "modelId": repo.id, "author": org,
        "sha": commit.id, "lastModified": commit.date, "createdAt": repo.meta["created"],
        "private": repo.access == "private",
        "gated": "manual" if repo.access == "gated" else False, "disabled": False,
        "downloads": 0, "likes": 0, "library_name": "transformers",
        "pipeline_tag": "text-generation", "tags": meta.get("tags", []),
        "config": meta.get("config", {}), "cardData": {"gpuserve_lab": meta.get("purpose", "")},
        "siblings": siblings, "spaces": [],
        "usedStorage": sum(e.size for e in commit.files.values()),
    }


def _last_commit(repo: Repo, commit: Commit, path: str) -> dict:
    """The earliest commit of the chain whose file is the same (size and id) as here."""
    entry, c = commit.files[path], commit
    while c.parent:
        p = repo.commit(c.parent)
        old = p.files.get(path)
        if old is None or old.size != entry.size or (
                (old.sha256, old.blob) != (entry.sha256, entry.blob)):
            break
        c = p
    return {"id": c.id, "title": c.title, "date": c.date}


def _file_json(hub: Hub, repo: Repo, commit: Commit, path: str, expand: bool) -> dict:
    """One file as the tree and paths-info list it."""
    entry = hub.hashed(repo, commit, commit.files[path])
    e: dict = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
    if entry.lfs:
        e["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
    if expand:
        e["lastCommit"] = _last_commit(repo, commit, path)
    return e


def _paths_info(hub: Hub, h, repo: Repo, commit: Commit) -> int:
    """``POST .../paths-info/{rev}`` (form ``paths=...&expand=``): the given paths that
    exist, files and folders (``HfApi.get_paths_info``, HfFileSystem)."""
    length = int(h.headers.get("content-length") or 0)
    form = parse_qs(h.rfile.read(length).decode()) if length else {}
    expand = form.get("expand", ["False"])[-1].lower() == "true"
    out = []
    for path in form.get("paths", []):
        path = path.strip("/")
        if path in commit.files:
            out.append(_file_json(hub, repo, commit, path, expand))
        elif any(f.startswith(path + "/") for f in commit.files):
            out.append({"type": "directory", "path": path,
                        "oid": hashlib.sha1(f"tree\0{commit.id}\0{path}".encode()).hexdigest()})
    return _json(h, out)


def _tree(hub: Hub, h, repo: Repo, commit: Commit, path: str, params: dict) -> int:
    recursive = params.get("recursive") == "true"
    expand = params.get("expand") == "true"
    base = f"{path}/" if path else ""
    if path and path in commit.files:
        raise HubError(404, "EntryNotFound", f"{path} is a file, not a directory",
                       commit=commit.id)
    dirs: set[str] = set()
    entries: list[dict] = []
    for fpath in sorted(commit.files):
        if not fpath.startswith(base):
            continue
        parts = fpath[len(base):].split("/")
        for i in range(1, len(parts)):
            if recursive or i == 1:
                dirs.add(base + "/".join(parts[:i]))
        if len(parts) > 1 and not recursive:
            continue
        entries.append(_file_json(hub, repo, commit, fpath, expand))
    if path and not entries and not dirs:
        raise HubError(404, "EntryNotFound", f"{path} does not exist on {commit.id}",
                       commit=commit.id)
    folders = [{"type": "directory", "path": d,
                "oid": hashlib.sha1(f"tree\0{commit.id}\0{d}".encode()).hexdigest()}
               for d in sorted(dirs)]
    listing = folders + entries + _listing_faults(hub, h, repo)
    _page_faults(hub, h, repo)
    size = hub.expand_page_size if expand else hub.page_size
    start = int(params.get("cursor", "0") or 0)
    page = listing[start:start + size]
    extra = {}
    if start + size < len(listing):
        host = h.headers.get("host", "127.0.0.1")
        raw = h.path.partition("?")[0]
        q = "&".join(f"{k}={quote(v)}" for k, v in params.items() if k != "cursor")
        extra["Link"] = f'<http://{host}{raw}?{q}&cursor={start + size}>; rel="next"'
    return _json(h, page, extra=extra)


def _ua(h) -> str:
    return h.headers.get("user-agent") or ""


def _listing_faults(hub: Hub, h, repo: Repo) -> list[dict]:
    """A hostile listing: raw ``entries`` (traversal, absolute, marker-named, duplicate,
    malformed), or ``many`` extra files; ``ua`` makes it depend on the client."""
    extra: list[dict] = []
    for kind in ("entries", "many"):
        f = hub.state.take_fault((kind,), repo.id, None, _ua(h))
        if f is not None and kind == "entries":
            extra += list(f.entries or [])
        elif f is not None:
            extra += [{"type": "file", "oid": "0" * 40, "size": 1, "path": f"x/{i}.bin"}
                      for i in range(f.count)]
    return extra


def _page_faults(hub: Hub, h, repo: Repo) -> None:
    """A listing page whose ``Link: rel=next`` points at itself (``self_page``) or at
    ``location`` (``page_to``: another origin)."""
    f = hub.state.take_fault(("self_page", "page_to"), repo.id, None, _ua(h))
    if f is None:
        return
    here = f"http://{h.headers.get('host', '127.0.0.1')}{h.path}"
    link = here if f.kind == "self_page" else (f.location or here)
    _json(h, [], extra={"Link": f'<{link}>; rel="next"'})
    raise _Answered()


class _Answered(Exception):
    """The fault already answered the request."""


def _content_type(path: str) -> str:
    if path.endswith(".json"):
        return "application/json"
    if path.endswith((".md", ".txt", ".gitattributes")) or path == ".gitattributes":
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


def _range(spec: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single ``bytes=`` range; None: the whole file."""
    if not spec or not spec.startswith("bytes=") or "," in spec:
        return None
    a, _, b = spec[6:].strip().partition("-")
    try:
        if a == "":
            n = int(b)
            return (max(size - n, 0), size - 1) if n > 0 else (size, size - 1)
        start = int(a)
        end = min(int(b), size - 1) if b else size - 1
    except ValueError:
        return None
    return start, end


def _resolve(hub: Hub, h, method: str, sub: str, served: Served) -> int:
    segs = sub.split("/")[1:]  # org, name, resolve, rev, path...
    if len(segs) < 5 or segs[2] != "resolve" or segs[0] in ("datasets", "spaces"):
        raise HubError(404, "RepoNotFound", "Repository not found")
    repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
    rev = unquote(segs[3])
    path = "/".join(unquote(s) for s in segs[4:])
    served.repo, served.rev, served.file = repo_id, rev, path
    _bare404(hub, repo_id, path, h)
    repo = hub.repo(repo_id, _token(h))
    commit = hub.resolve_rev(repo, rev)
    entry = commit.files.get(path)
    if entry is None:
        raise HubError(404, "EntryNotFound", "Entry not found", commit=commit.id)
    if hub.state.cdn_host and entry.lfs:
        return _redirect(hub, h, method, repo, commit, entry, served)
    return _serve_file(hub, h, method, repo, commit, entry, served, hub_headers=True)


def _redirect(hub: Hub, h, method: str, repo: Repo, commit: Commit, entry: FileEntry,
              served: Served) -> int:
    """The Hub's answer for an LFS file: 302 to its CDN, the file's metadata on the 302."""
    if method == "HEAD":
        entry = hub.hashed(repo, commit, entry)
    port = (h.headers.get("host") or "").rpartition(":")[2] or "80"
    location = (f"http://{hub.state.cdn_host}:{port}{hub.prefix}/_cdn/{quote(repo.id)}/"
                f"{commit.id}/{quote(entry.path)}")
    headers = {"X-Repo-Commit": commit.id, "X-Linked-Size": str(entry.size),
               "Location": location}
    if entry.hashed:
        headers["X-Linked-Etag"] = f'"{entry.etag}"'
    served.status = 302
    return _send(h, 302, headers, head=method == "HEAD")


def _cdn(hub: Hub, h, method: str, sub: str, served: Served) -> int:
    """The CDN stand-in: ``/_cdn/{org}/{name}/{commit}/{path}``, no token needed (the
    real one takes a signed URL)."""
    segs = sub.split("/")[2:]
    if len(segs) < 4:
        raise HubError(404, None, "Not Found")
    repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
    path = "/".join(unquote(x) for x in segs[3:])
    served.repo, served.rev, served.file = repo_id, segs[2], path
    if not (hub.root / repo_id / "repo.json").is_file() or ".." in repo_id:
        raise HubError(404, None, "Not Found")
    repo = Repo(hub.root, repo_id)
    if segs[2] not in repo.commit_ids() or path not in repo.commit(segs[2]).files:
        raise HubError(404, None, "Not Found")
    commit = repo.commit(segs[2])
    return _serve_file(hub, h, method, repo, commit, commit.files[path], served,
                       hub_headers=False)


def _serve_file(hub: Hub, h, method: str, repo: Repo, commit: Commit, entry: FileEntry,
                served: Served, hub_headers: bool) -> int:
    """HEAD or (ranged) GET of one file; ``hub_headers``: the Hub's own X- headers (a
    CDN sends none)."""
    path = entry.path
    rng = _range(h.headers.get("range"), entry.size) if method == "GET" else None
    if rng is None or method == "HEAD":
        entry = hub.hashed(repo, commit, entry)  # HEAD and full GETs carry the id
    headers = {"Accept-Ranges": "bytes",
               "Content-Type": _content_type(path),
               "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.split('/')[-1])}; "
                                      f"filename=\"{path.split('/')[-1]}\";"}
    if hub_headers:
        headers["X-Repo-Commit"] = commit.id
    if entry.hashed:
        headers["ETag"] = f'"{entry.etag}"'
        if entry.lfs and hub_headers:
            headers["X-Linked-Etag"] = f'"{entry.etag}"'
    if entry.lfs and hub_headers:
        headers["X-Linked-Size"] = str(entry.size)
    if method == "HEAD":
        headers["Content-Length"] = str(entry.size)
        return _send(h, 200, headers, head=True)
    if rng is not None and rng[0] >= entry.size:
        headers["Content-Range"] = f"bytes */{entry.size}"
        served.status = 416
        return _send(h, 416, headers)
    start, end = rng if rng is not None else (0, entry.size - 1)
    status = 206 if rng is not None else 200
    if rng is not None:
        headers["Content-Range"] = f"bytes {start}-{end}/{entry.size}"
    headers["Content-Length"] = str(end - start + 1)
    served.status = status
    return _body(hub, h, repo, commit, entry, start, end, status, headers, served)


def _body_fault(hub: Hub, h, repo: Repo, commit: Commit, entry: FileEntry, headers: dict,
                served: Served) -> int | None:
    """``endless``: the file's bytes, then zeros without end (no Content-Length) until
    the client leaves (at most ``after`` bytes, default 1 GiB); ``ignore_range``: the
    whole file, 200, whatever Range asked; ``drip``: one byte every ``interval`` s."""
    f = hub.state.take_fault(("endless", "ignore_range", "drip"), repo.id, entry.path)
    if f is None:
        return None
    served.fault = f.kind
    path = repo.file_path(commit.id, entry.path)
    data = path.read_bytes() if entry.size <= 64 << 20 else b""
    head = {k: v for k, v in headers.items() if k not in ("Content-Range", "Content-Length")}
    if f.kind == "ignore_range":
        return _send(h, 200, head, data)
    sent = 0
    if f.kind == "drip":
        _send(h, 200, {**head, "Content-Length": str(entry.size)}, head=True)
        for b in data:
            h.wfile.write(bytes([b]))
            h.wfile.flush()
            sent += 1
            time.sleep(f.interval)
        return sent
    h.close_connection = True  # no Content-Length: the body ends when the server closes
    h.send_response(200)
    for k, v in head.items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)
    limit, zeros = f.after or (1 << 30), b"\0" * (1 << 16)
    while sent < limit:
        h.wfile.write(zeros)
        sent += len(zeros)
    return sent + len(data)


def _body(hub: Hub, h, repo: Repo, commit: Commit, entry: FileEntry, start: int, end: int,
          status: int, headers: dict, served: Served) -> int:
    faulted = _body_fault(hub, h, repo, commit, entry, headers, served)
    if faulted is not None:
        return faulted
    cut = hub.state.take_fault(("cut",), repo.id, entry.path)
    stop = end + 1
    if cut is not None:
        stop = max(start, min(stop, cut.after))
        served.fault = f"cut at {stop}"
    corrupt = hub.state.take_fault(("corrupt",), repo.id, entry.path)
    bad = None
    if corrupt is not None:
        off = corrupt.offset if corrupt.offset is not None else entry.size // 2
        bad = (off, off + CORRUPT_SPAN)
        served.fault = f"corrupt {bad[0]}-{bad[1]}"
    _send(h, status, headers, head=True)
    sent = 0
    with repo.file_path(commit.id, entry.path).open("rb") as f:
        f.seek(start)
        pos = start
        while pos < stop:
            chunk = f.read(min(CHUNK, stop - pos))
            if not chunk:
                break
            if bad and bad[0] < pos + len(chunk) and bad[1] > pos:
                buf = bytearray(chunk)
                for i in range(max(bad[0], pos), min(bad[1], pos + len(chunk))):
                    buf[i - pos] ^= 0xFF
                chunk = bytes(buf)
            h.wfile.write(chunk)
            sent += len(chunk)
            pos += len(chunk)
    if cut is not None:
        h.close_connection = True
        h.wfile.flush()
    return sent


def _control(hub: Hub, h, method: str, what: str, query: str) -> int:
    length = int(h.headers.get("content-length") or 0)
    body = json.loads(h.rfile.read(length) or b"{}") if length else {}
    st = hub.state
    if what == "stats" and method == "GET":
        return _json(h, st.stats())
    if what == "faults" and method == "GET":
        with st.lock:
            return _json(h, [asdict(f) for f in st.faults])
    if what == "repos":  # GET or POST: every repository's branches and commits
        return _json(h, {r: _repo_summary(hub, r) for r in list_repos(hub.root)})
    if method != "POST":
        raise HubError(405, None, f"{method} /_lab/{what}: use POST")
    if what == "reset":
        with st.lock:
            st.requests.clear()
            st.faults.clear()
            st.refs.clear()
            st.cdn_host = None
    elif what == "config":
        with st.lock:
            st.cdn_host = body.get("cdn_host") or None
    elif what == "stats/reset":
        with st.lock:
            st.requests.clear()
    elif what == "faults":
        fault = Fault(**body)
        if fault.kind not in FAULT_KINDS:
            raise HubError(400, None, f"fault kind {fault.kind!r}: one of "
                           f"{', '.join(FAULT_KINDS)}")
        with st.lock:
            st.faults.append(fault)
    elif what == "faults/clear":
        with st.lock:
            st.faults.clear()
    elif what == "refs":
        hub.move_branch(body["repo"], body.get("branch", "main"), body["commit"])
    else:
        raise HubError(404, None, f"no lab control /_lab/{what}")
    return _json(h, {"ok": True})


def _repo_summary(hub: Hub, repo_id: str) -> dict:
    repo = Repo(hub.root, repo_id)
    return {"access": repo.access, "branches": hub.branches(repo), "commits": repo.commit_ids(),
            "purpose": repo.meta.get("purpose", "")}


# -- standalone server ------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    hub: Hub

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        handle(self.hub, self, "GET")

    def do_HEAD(self) -> None:  # noqa: N802
        handle(self.hub, self, "HEAD")

    def do_POST(self) -> None:  # noqa: N802
        handle(self.hub, self, "POST")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib signature)
        log.debug("%s %s", self.address_string(), format % args)


class HubServer:
    """The stand-in alone on 127.0.0.1 (a port of its own) in a background thread."""

    def __init__(self, root: Path, prefix: str = "", address: str = "127.0.0.1",
                 **kw) -> None:
        self.hub = Hub(root, prefix, **kw)
        handler = type("HubHandler", (_Handler,), {"hub": self.hub})
        self.httpd = ThreadingHTTPServer((address, 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}{self.hub.prefix}"

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def control(base_url: str, what: str, body: dict | None = None, timeout: float = 30):
    """The lab's own knobs of a running stand-in: GET (no body) or POST
    ``<base_url>/_lab/<what>``, its JSON answer (faults, counters, branch moves)."""
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base_url}/_lab/{what}", data=data,
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())

