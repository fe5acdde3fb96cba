#!/usr/bin/env python3
"""Requests to a Hub or mirror you do not control, made so that the server cannot turn
them against you: one rule for every name it sends, caps on every document, a deadline
on every request, the token to the configured origin alone, and one line of redacted
text for every failure.

Stdlib only: carried to the GPU host beside ``weights_fetch.py`` (which imports it from
its own directory) and imported by the controller (gpuserve/memory/remote.py), so the
controller and the host judge a listing, a header and a body by the same code.
docs/weights.md, "What a mirror cannot do to you".
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import time
import unicodedata
from collections.abc import Iterable
from typing import AnyStr, NamedTuple
from urllib.parse import quote, urljoin, urlsplit

MARKER = ".gpuserve-complete.json"
#: First path components a repository file may not have: the project's own marker,
#: staging and cache names inside a revision directory.
RESERVED = (MARKER, ".cache", ".gpuserve")
MAX_PATH = 1024  # bytes of a file name (UTF-8)
MAX_FILES = 10_000  # entries of a listing (host data weights_max_files)
MAX_JSON_BYTES = 64 << 20  # a config, an index (GLM-5 NVFP4's: 22 MB), a tree page
MAX_JSON_DEPTH = 64
MAX_HEADER_BYTES = 25_000_000  # a safetensors header (huggingface_hub's own limit)
HEADER_PROBE = 100_000  # the first ranged read of a shard (as huggingface_hub's)
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
STALL_TIMEOUT = 120.0  # host data weights_stall_timeout
STALL_BYTES = 64 << 10  # bytes a stall window must bring (a drip is a stall)
MIN_RATE = 4096  # bytes/s every RATE_WINDOW of a body must average (weights_min_rate)
RATE_WINDOW = 30.0  # seconds over which MIN_RATE is measured
REQUEST_DEADLINE = 120.0  # seconds one document or header request may take in all
MAX_REDIRECTS = 5
ERROR_BODY = 4096  # bytes of an error page read for its message
CHUNK = 1 << 20
_SECRET = re.compile(r"(?i)(authorization|bearer|token|password|secret)([\"':= ]+)"
                     r"[^\s\"',;}]+|hf_[A-Za-z0-9]{6,}")


class HubError(Exception):
    """A refusal or failure, one line, already redacted. ``kind``: listing, document,
    body, http, network, timeout, redirect; ``status`` and ``code`` (X-Error-Code) for
    an HTTP error answer; ``resumable``: the partial file is kept and a rerun goes on."""

    def __init__(self, kind, message, status=None, code=None, resumable=False):
        super().__init__(message)
        self.kind, self.status, self.code, self.resumable = kind, status, code, resumable


# ------------------------------------------------------------------ the rules (pure)

# The redaction rule: a byte-identical copy of gpuserve/redact.py's REDACTED and redact()
# (this script runs without gpuserve; tests/unit/test_redact.py compares the copies).
REDACTED = "<redacted>"


def redact(text: AnyStr, secrets: Iterable[AnyStr | None]) -> AnyStr:
    """``text`` with every occurrence of every secret hidden behind one REDACTED, where
    occurrences that overlap or touch become a single marker: a secret that contains or
    overlaps another leaks no part of either (the longest-first rule, also for overlaps),
    and a marker is never searched again. Any length: a short secret is still a secret;
    an empty value or None is nothing to look for. Text and secrets are both str, or both
    bytes (a server's raw output)."""
    spans = []
    for secret in {s for s in secrets if s}:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    marker = REDACTED if isinstance(text, str) else REDACTED.encode()
    parts, end = [], 0
    for start, stop in sorted(spans):
        if start > end or not parts:
            parts += [text[end:start], marker]
        end = max(end, stop)
    parts.append(text[end:])
    return text[:0].join(parts)


def one_line(text, secrets=(), limit=300):
    """Server text fit for a status line, the journal or a record: one line, printable,
    bounded, with the token and Authorization/Bearer material replaced."""
    text = redact(str(text), secrets)
    text = _SECRET.sub(lambda m: (m.group(1) + m.group(2) + REDACTED)
                       if m.group(1) else REDACTED, text)
    text = "".join(c if c.isprintable() else " " for c in text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown(name):
    """A name from a server, escaped for a message."""
    return ascii(str(name)[:200])


def path_problem(name):
    """Why ``name`` (a file name a server sent) is not a safe relative path, or None."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_PATH:
        return f"longer than {MAX_PATH} bytes"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in name):
        return "holds a control character"
    if "\\" in name:
        return "holds a backslash"
    if name.startswith("/"):
        return "is absolute"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "is not a normalised relative path (empty, '.' or '..' part)"
    if parts[0] in RESERVED or parts[0].startswith(".gpuserve"):
        return "collides with gpuserve's own marker, staging or cache names"
    return None


def _size(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def check_listing(entries, max_files=MAX_FILES):
    """The files of a tree listing (``type: file`` entries; directories skipped) as
    dicts ``path, size, sha256|None, git_sha1``, sorted; any bad entry refuses the whole
    revision (HubError naming it, escaped)."""
    files, seen = [], set()
    for e in entries:
        if not isinstance(e, dict) or e.get("type") not in ("file", "directory"):
            raise HubError("listing", f"an entry that is not a file or directory: "
                           f"{one_line(repr(e), limit=120)}")
        name = e.get("path")
        problem = path_problem(name)
        if problem:
            raise HubError("listing", f"file name {shown(name)} {problem}")
        if name in seen:
            raise HubError("listing", f"file name {shown(name)} is listed twice")
        seen.add(name)
        if e["type"] == "directory":
            continue
        size, oid, lfs = _size(e.get("size")), e.get("oid"), e.get("lfs")
        if size is None:
            raise HubError("listing", f"{shown(name)}: size "
                           f"{one_line(repr(e.get('size')), limit=40)} is not a "
                           "non-negative integer")
        if not isinstance(oid, str) or not re.fullmatch(r"[0-9a-f]{40}", oid):
            raise HubError("listing", f"{shown(name)}: oid is not a git blob id")
        sha = None
        if lfs is not None:
            sha = lfs.get("oid") if isinstance(lfs, dict) else None
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha) or \
                    _size(lfs.get("size", size)) != size:
                raise HubError("listing", f"{shown(name)}: lfs is not a sha256 and the size")
        files.append({"path": name, "size": size, "sha256": sha, "git_sha1": oid})
        if len(files) > max_files:
            raise HubError("listing", f"more than {max_files} files (host data "
                           "weights_max_files raises the cap)")
    names = {f["path"] for f in files}
    for f in files:  # a file may not also be a folder of another file
        parent = f["path"].rpartition("/")[0]
        while parent:
            if parent in names:
                raise HubError("listing", f"{shown(parent)} is both a file and a folder")
            parent = parent.rpartition("/")[0]
    return sorted(files, key=lambda f: f["path"])


def parse_json(data, what, max_depth=MAX_JSON_DEPTH):
    """A JSON document from bytes already capped in size, its nesting capped too."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise HubError("document", f"{what}: nested deeper than {max_depth}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise HubError("document", f"{what}: not JSON ({one_line(e, limit=80)})") from None
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise HubError("document", f"{what}: nested deeper than {max_depth}")
        children = node.values() if isinstance(node, dict) else node \
            if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return doc


def origin(url):
    """(scheme, host, port) of an http(s) URL."""
    p = urlsplit(url)
    port = p.port or (443 if p.scheme == "https" else 80)
    return (p.scheme, (p.hostname or "").lower(), port)


def endpoint_problem(url):
    """Why ``url`` cannot be a Hub endpoint (None: it can)."""
    if not isinstance(url, str) or not url:
        return "must be a non-empty string"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "must not hold whitespace or control characters"
    try:
        p = urlsplit(url)
        p.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        return f"is not a URL ({e})"
    if p.scheme not in ("http", "https") or not p.hostname:
        return "must be an http(s) URL"
    if "@" in p.netloc:
        return "must not carry credentials (the URL is not shown): set hf_token"
    if p.query or p.fragment:
        return "must not have a query or fragment"
    return None


def safe_join(root, name):
    """``root/name`` after proving it lies under ``root`` (no link leads out)."""
    problem = path_problem(name)
    if problem:
        raise HubError("listing", f"file name {shown(name)} {problem}")
    real_root = os.path.realpath(root)
    path = os.path.join(real_root, name)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != real_root and not parent.startswith(real_root + os.sep):
        raise HubError("listing", f"file name {shown(name)} leads out of {real_root}")
    if os.path.islink(path):
        raise HubError("listing", f"{path} is a symbolic link")
    return path


# ------------------------------------------------------------------ requests


class Meter:
    """The pace of one body: ends it (HubError ``timeout``) past its ``deadline``
    (monotonic), after a ``stall`` window bringing fewer than STALL_BYTES, or after a
    RATE_WINDOW bringing fewer than ``min_rate`` bytes/s on average (a drip that the
    per-read timeout never catches). ``clock`` is injectable: the windows are arithmetic
    on its readings, so a test decides them without waiting."""

    def __init__(self, what, stall, min_rate=0, deadline=None, limit="weights_timeout",
                 clock=time.monotonic, resumable=True):
        self.what, self.stall, self.min_rate, self.deadline = what, stall, min_rate, deadline
        self.limit, self.clock, self.resumable = limit, clock, resumable
        self.stall_at = self.rate_at = clock()
        self.stall_got = self.rate_got = 0

    def check(self, n=0):
        """Count ``n`` more bytes; raise when the body is too slow or too late."""
        now = self.clock()
        self.stall_got += n
        self.rate_got += n
        if self.deadline is not None and now > self.deadline:
            raise HubError("timeout", f"{self.what}: not done within {self.limit}",
                           resumable=self.resumable)
        if now - self.stall_at >= self.stall:
            if self.stall_got < STALL_BYTES:
                raise HubError("timeout", f"{self.what}: {self.stall_got} bytes in "
                               f"{self.stall:.0f} s: stalled (host data "
                               "weights_stall_timeout)", resumable=self.resumable)
            self.stall_at, self.stall_got = now, 0
        if self.min_rate and now - self.rate_at >= RATE_WINDOW:
            if self.rate_got < self.min_rate * RATE_WINDOW:
                raise HubError("timeout", f"{self.what}: {self.rate_got} bytes in "
                               f"{now - self.rate_at:.0f} s, below {self.min_rate:g} bytes/s "
                               "(host data weights_min_rate)", resumable=self.resumable)
            self.rate_at, self.rate_got = now, 0

    def left(self, read_timeout):
        """The socket timeout for the next read: the read timeout, never past the
        deadline."""
        if self.deadline is None:
            return read_timeout
        return max(0.01, min(read_timeout, self.deadline - self.clock()))


class Limits(NamedTuple):
    """A client's limits, each None for its default: the connect and read timeouts, the
    stall that ends a body (seconds), the minimum rate a body averages (bytes/s), one
    document or header request's deadline (seconds)."""

    connect: float | None = None
    read: float | None = None
    stall: float | None = None
    min_rate: float | None = None
    request_deadline: float | None = None


DEFAULT_LIMITS = Limits()


class Client:
    """HTTP(S) to one endpoint: connect and read timeouts on every request, redirects
    followed by hand (http(s) only, at most 5), the token sent only to the endpoint's
    own scheme, host and port."""

    def __init__(self, endpoint=None, token=None, limits=DEFAULT_LIMITS, user_agent="gpuserve",
                 clock=time.monotonic):
        self.endpoint = (endpoint or "https://huggingface.co").rstrip("/")
        problem = endpoint_problem(self.endpoint)
        if problem:
            raise HubError("endpoint", f"hf_endpoint {problem}")
        self.token, self.ua = token or None, user_agent
        self.connect = limits.connect or CONNECT_TIMEOUT
        self.read = limits.read or READ_TIMEOUT
        self.stall = limits.stall or STALL_TIMEOUT
        self.min_rate = MIN_RATE if limits.min_rate is None else limits.min_rate
        self.request_deadline = limits.request_deadline or REQUEST_DEADLINE
        self.clock = clock
        self.origin = origin(self.endpoint)

    def say(self, text, limit=300):
        return one_line(text, (self.token,), limit)

    # -- urls
    def resolve_url(self, repo, rev, name):
        return f"{self.endpoint}/{repo}/resolve/{quote(rev, safe='')}/{quote(name)}"

    def api_url(self, repo, *parts):
        return f"{self.endpoint}/api/models/{repo}/" + "/".join(quote(p, safe="") for p in parts)

    # -- one request
    def _open(self, method, url, headers, read_timeout):
        scheme, host, port = origin(url)
        try:
            if scheme == "https":
                conn = http.client.HTTPSConnection(host, port, timeout=self.connect,
                                                   context=ssl.create_default_context())
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.connect)
            conn.connect()
            sock = conn.sock
            sock.settimeout(read_timeout)
            p = urlsplit(url)
            target = (p.path or "/") + (f"?{p.query}" if p.query else "")
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
            resp.gpuserve_sock = sock  # the deadline shortens its reads' timeout
            return conn, resp
        except Exception as e:  # noqa: BLE001 - every network failure becomes one line
            raise self.network_error(e, url, read_timeout) from None

    def network_error(self, e, url, timeout=None):
        host = "{}://{}:{}".format(*origin(url))
        if isinstance(e, socket.timeout | TimeoutError):
            return HubError("timeout", f"{host} did not answer within "
                            f"{timeout or min(self.read, self.stall):.0f} s", resumable=True)
        if isinstance(e, ConnectionRefusedError):
            return HubError("network", f"{host} refused the connection", resumable=True)
        if isinstance(e, socket.gaierror):
            return HubError("network", f"{host}: name not resolved ({self.say(e, 80)})")
        if isinstance(e, ssl.SSLError | ssl.CertificateError):
            return HubError("network", f"{host}: TLS failed ({self.say(e, 120)})")
        if isinstance(e, ConnectionError | http.client.HTTPException | OSError):
            return HubError("network", f"{host}: connection failed "
                            f"({type(e).__name__}: {self.say(e, 120)})", resumable=True)
        return HubError("network", f"{host}: {type(e).__name__}: {self.say(e, 120)}")

    def request(self, method, url, headers=None, follow=True, read_timeout=None,
                meter=None):
        """(connection, response) of a 2xx (or a 3xx when ``follow`` is false); an
        error answer raises HubError with its status, X-Error-Code and a bounded,
        redacted message. The caller closes the connection. Every hop within the
        ``meter``'s deadline (default: REQUEST_DEADLINE from now)."""
        meter = meter or self.meter(f"{method} {self.say(url, 120)}")
        for _ in range(MAX_REDIRECTS + 1):
            h = {"User-Agent": self.ua, "Accept-Encoding": "identity", **(headers or {})}
            if self.token and origin(url) == self.origin:
                h["Authorization"] = f"Bearer {self.token}"
            meter.check()
            conn, resp = self._open(method, url, h, meter.left(
                read_timeout or min(self.read, self.stall)))
            if resp.status in (301, 302, 303, 307, 308) and follow:
                location = resp.getheader("Location") or ""
                conn.close()
                nxt = urljoin(url, location)
                if urlsplit(nxt).scheme not in ("http", "https"):
                    raise HubError("redirect", f"redirected to a non-HTTP URL "
                                   f"({self.say(nxt, 80)}): refused")
                url = nxt
                continue
            if resp.status >= 400 or (resp.status >= 300 and follow):
                raise self._http_error(conn, resp)
            return conn, resp
        raise HubError("redirect", f"more than {MAX_REDIRECTS} redirects")

    def _http_error(self, conn, resp):
        code = resp.getheader("X-Error-Code")
        message = resp.getheader("X-Error-Message") or ""
        body, until = b"", time.monotonic() + min(self.read, self.stall)
        try:  # at most ERROR_BODY bytes, within one read timeout (a dripping error page)
            while resp.status >= 400 and len(body) < ERROR_BODY and time.monotonic() < until:
                chunk = resp.read1(ERROR_BODY - len(body))
                if not chunk:
                    break
                body += chunk
        except Exception:  # noqa: BLE001 - the status is what matters
            pass
        finally:
            conn.close()
        if not message and body:
            with_json = body.decode("utf-8", "replace")
            try:
                doc = json.loads(with_json)
                message = doc.get("error") if isinstance(doc, dict) else with_json
            except ValueError:
                message = with_json
        return HubError("http", self.say(f"HTTP {resp.status}"
                                         + (f" {code}" if code else "")
                                         + (f": {message}" if message else ""), 200),
                        status=resp.status, code=self.say(code, 40) if code else None,
                        resumable=resp.status >= 500 or resp.status == 429)

    def meter(self, what, deadline=None):
        """A document request's meter: the sooner of ``deadline`` (monotonic) and
        REQUEST_DEADLINE from now, the stall window and the minimum rate."""
        own = self.clock() + self.request_deadline
        if deadline is not None and deadline < own:
            return Meter(what, self.stall, self.min_rate, deadline, "weights_timeout",
                         self.clock, resumable=False)
        return Meter(what, self.stall, self.min_rate, own,
                     f"the {self.request_deadline:.0f} s a request may take", self.clock,
                     resumable=False)

    # -- bounded reads
    def read_capped(self, url, cap, what, headers=None, deadline=None):
        """A body of at most ``cap`` bytes (one more is a refusal, not a bigger read),
        within the request's deadline and at the minimum rate."""
        meter = self.meter(what, deadline)
        conn, resp = self.request("GET", url, headers, meter=meter)
        try:
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > cap:
                raise HubError("document", f"{what}: {int(length):,} bytes announced, more "
                               f"than the {cap:,} allowed")
            data = bytearray()
            whole = int(length) if length is not None and length.isdigit() else None
            while len(data) <= cap:
                chunk = self._read1(resp, cap + 1 - len(data), url, meter)
                if not chunk:
                    break
                data += chunk
                if whole is None or len(data) < whole:  # a complete body is not slow
                    meter.check(len(chunk))
            if len(data) > cap:
                raise HubError("document", f"{what}: more than the {cap:,} bytes allowed "
                               "(or asked for)")
            return resp, bytes(data)
        finally:
            conn.close()

    def _read1(self, resp, n, url, meter=None):
        try:
            sock = getattr(resp, "gpuserve_sock", None)
            if meter is not None and meter.deadline is not None and sock is not None:
                timeout = min(self.read, self.stall)
                left = meter.left(timeout)
                if left < timeout:
                    sock.settimeout(left)
            return resp.read1(min(n, CHUNK))
        except Exception as e:  # noqa: BLE001
            raise self.network_error(e, url) from None

    def get_json(self, url, what, cap=MAX_JSON_BYTES):
        return parse_json(self.read_capped(url, cap, what)[1], what)

    def read_range(self, url, start, end, what):
        """Bytes ``start..end`` (inclusive) of a file; more than asked is refused."""
        _resp, data = self.read_capped(url, end - start + 1, what,
                                       {"Range": f"bytes={start}-{end}"})
        return data

    def exists(self, repo, rev, name):
        """Whether the revision has ``name`` (a HEAD, redirects not followed)."""
        try:
            conn, _resp = self.request("HEAD", self.resolve_url(repo, rev, name),
                                       follow=False)
        except HubError as e:
            if e.status == 404 and e.code == "EntryNotFound":
                return False
            raise
        conn.close()
        return True

    def list_tree(self, repo, rev, max_files=MAX_FILES, deadline=None):
        """The revision's recursive tree, every page from the endpoint's own origin, no
        page twice, at most ``max_files`` entries, within ``deadline`` (monotonic)."""
        url = self.api_url(repo, "tree", rev) + "?recursive=true&expand=false"
        entries, seen = [], set()
        while url:
            if url in seen:
                raise HubError("listing", "pagination repeats a page")
            seen.add(url)
            if deadline is not None and time.monotonic() > deadline:
                raise HubError("timeout", "the listing was not done within weights_timeout")
            resp, data = self.read_capped(url, MAX_JSON_BYTES, "tree page",
                                          deadline=deadline)
            page = parse_json(data, "tree page")
            if not isinstance(page, list):
                raise HubError("listing", "a tree page that is not a JSON list")
            entries += page
            if len(entries) > 2 * max_files + 2:
                raise HubError("listing", f"more than {max_files} files (host data "
                               "weights_max_files raises the cap)")
            url = _next_link(resp.getheader("Link"), url)
            if url and origin(url) != self.origin:
                raise HubError("listing", "pagination leads to another origin "
                               f"({'{}://{}:{}'.format(*origin(url))}): refused")
        return check_listing(entries, max_files)

    def commit_of(self, repo, rev):
        doc = self.get_json(self.api_url(repo, "revision", rev), "model info")
        return doc.get("sha") if isinstance(doc, dict) else None

    # -- a download
    def download(self, url, part, size, stall=None, deadline=None, hasher=None,
                 what="the body"):
        """``url`` into ``part`` (resumed from its length) until it has ``size`` bytes.
        Never writes past ``size``: one byte more is a refusal. A ``stall`` window
        bringing fewer than STALL_BYTES, a rate window below ``min_rate`` or the
        ``deadline`` (monotonic) stops it, resumable. ``hasher`` (``resume(part,
        have)``, ``update(chunk)``) sees every byte of the file once: the part already
        on disk through ``resume``, then each chunk as it is written."""
        stall = stall or self.stall
        meter = Meter(what, stall, self.min_rate, deadline, "weights_timeout", self.clock)
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if have > size:
            os.truncate(part, 0)
            have = 0
        if have == size and size > 0:
            if hasher is not None:
                hasher.resume(part, have)
            return
        headers = {"Range": f"bytes={have}-"} if have else {}
        conn, resp = self.request("GET", url, headers,
                                  read_timeout=min(self.read, stall), meter=meter)
        try:
            if have and resp.status == 200:
                have = 0  # Range ignored: the whole file again, from the start
            elif have and not (resp.getheader("Content-Range") or "").startswith(
                    f"bytes {have}-"):
                raise HubError("body", f"answered {resp.getheader('Content-Range')!r:.60} to "
                               f"a request from byte {have}")
            length = resp.getheader("Content-Length")
            if length is not None and (not length.isdigit() or int(length) != size - have):
                raise HubError("body", f"announces {self.say(length, 30)} bytes where the "
                               f"listing leaves {size - have:,}")
            if hasher is not None:
                hasher.resume(part, have)
            self._copy(resp, url, part, have, size, meter, hasher)
        finally:
            conn.close()

    def _copy(self, resp, url, part, have, size, meter, hasher):
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.truncate(have)
            f.seek(have)
            while have < size:
                chunk = self._read1(resp, size - have, url, meter)
                if not chunk:
                    raise HubError("body", f"the body ended at byte {have:,} of {size:,} "
                                   "(truncated)", resumable=True)
                f.write(chunk)
                if hasher is not None:
                    hasher.update(chunk)
                have += len(chunk)
                if have < size:
                    meter.check(len(chunk))
        if self._read1(resp, 1, url):
            raise HubError("body", f"sent more than the {size:,} bytes the listing gives")


def _next_link(header, base):
    """The ``rel="next"`` URL of a Link header, absolute."""
    for part in (header or "").split(","):
        m = re.match(r'\s*<([^>]*)>\s*;(.*)', part)
        if m and re.search(r'rel\s*=\s*"?next"?', m.group(2)):
            return urljoin(base, m.group(1))
    return None


def part_name(entry):
    """The partial file of a listing entry (its hash: a rerun resumes the same bytes)."""
    return (entry.get("sha256") or entry["git_sha1"]) + ".incomplete"


def header_of(client, repo, rev, name, cap=MAX_HEADER_BYTES):
    """A safetensors file's header (dict), as huggingface_hub reads it: a ranged read of
    the first 100 KB, a second only for a longer header; capped in bytes and nesting."""
    url = client.resolve_url(repo, rev, name)
    try:
        first = client.read_range(url, 0, HEADER_PROBE, f"{name}: header")
    except HubError as e:
        if e.status == 416:
            raise HubError("header", "truncated: the file is shorter than its 8-byte "
                           "header length (HTTP 416)") from None
        raise
    if len(first) < 8:
        raise HubError("header", "truncated: fewer than 8 bytes")
    n = int.from_bytes(first[:8], "little")
    if n > cap:
        raise HubError("header", f"announces a header of {n:,} bytes, more than the "
                       f"{cap:,} allowed")
    if 8 + n <= len(first):
        raw = first[8:8 + n]
    elif len(first) < HEADER_PROBE + 1:
        raise HubError("header", f"truncated: the file ends before the {n:,}-byte header "
                       "its first 8 bytes announce")
    else:
        try:
            raw = client.read_range(url, 8, 8 + n - 1, f"{name}: header")
        except HubError as e:
            if e.status == 416:
                raise HubError("header", "truncated: the file ends before the header its "
                               "first 8 bytes announce (HTTP 416 for the header's range)") \
                    from None
            raise
        if len(raw) < n:
            raise HubError("header", f"truncated: {len(raw):,} of {n:,} header bytes")
    doc = parse_json(raw, f"{name}: header")
    if not isinstance(doc, dict):
        raise HubError("header", "not a JSON object")
    return doc
