#!/usr/bin/env python3
"""Fetch one Hub revision into an immutable directory, verified, resumable.

Pushed to the GPU host and run with the SGLang venv's python (stdlib only);
imported by ``gpuserve weights`` on a connected machine, so there is one implementation.

    weights_fetch.py state --target DIR [--ref FILE] [--models-dir DIR]   (host python3)
    weights_fetch.py start --run-dir RD --user U --python PY -- run ARGS...  (root)
    weights_fetch.py status --run-dir RD
    weights_fetch.py run --repo ORG/NAME --commit SHA --target DIR [--endpoint URL]
                         [--token-file F] [--status F] [--ref FILE] [--revision REF]

``run`` lists the revision and downloads exactly that listing into ``DIR.partial``
through hub_client.py (stdlib, carried beside this script): every name judged by one
rule, every body capped at its listed size, a stall or deadline ends it resumably, the
token goes to the endpoint's origin alone. Partial files live under
``.cache/gpuserve/<hash>.incomplete``, never under their final name, and a rerun resumes
them; the bytes still to fetch are checked against the free disk first. Files are
fetched ``--workers`` at once, each hashed as its bytes arrive (sha256 for LFS files,
the git blob sha1 for the others; a resumed file's part read once): nothing is read
back after the download, and a body slower than ``--min-rate`` bytes/s over a window
ends like a stall. A file that does not match is removed and fetched again (at most
``--rounds`` rounds). Only then are the marker ``.gpuserve-complete.json`` written, the
files made read-only and ``DIR.partial`` renamed to ``DIR``: a directory under its final
name is always complete and verified. The token is read from a file (never argv).
"""

import argparse
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import sys
import threading
import time
from typing import NamedTuple

MARKER = ".gpuserve-complete.json"
SCHEMA = "gpuserve.weights/1"
#: Free bytes kept beyond the download (logs, the scan cache, the marker).
DISK_RESERVE = 1 << 30
EXIT_DISK = 3
EXIT_VERIFY = 4


class Refused(Exception):
    """A refusal with the numbers (disk) or the files (verification)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------ state (stdlib)


def _nearest_dir(path):
    while path and not os.path.isdir(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    return path or "/"


def _dir_bytes(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def read_marker(target):
    """The marker's document when every file it lists has its size (else None)."""
    try:
        with open(os.path.join(target, MARKER), encoding="utf-8") as f:
            doc = json.load(f)
        root = os.path.realpath(target) + os.sep
        for entry in doc["files"]:
            path = os.path.join(target, entry["path"])
            if not os.path.realpath(path).startswith(root) or os.path.islink(path) or \
                    os.path.getsize(path) != entry["size"]:
                return None
        return doc
    except (OSError, ValueError, KeyError, TypeError):
        return None


def state(target, ref=None, models_dir=None):
    """What the deploy's plan reads (a fact): complete or not, free and staged bytes,
    the commit a floating revision was recorded as."""
    doc = read_marker(target)
    recorded = None
    if ref:
        with contextlib.suppress(OSError), open(ref, encoding="utf-8") as f:
            recorded = f.read().strip() or None
    usage = shutil.disk_usage(_nearest_dir(models_dir or os.path.dirname(target)))
    staged = _dir_bytes(target + ".partial") if doc is None else 0
    return {"schema": SCHEMA, "complete": doc is not None,
            "commit": doc.get("commit") if doc else None, "free_bytes": usage.free,
            "staged_bytes": staged, "recorded": recorded,
            "damaged": doc is None and os.path.isfile(os.path.join(target, MARKER))}


# ------------------------------------------------------------------ verification


def git_sha1(path):
    """The git blob id of a file (sha1 of ``blob <size>\\0`` + contents)."""
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class StreamHash:
    """A listing entry's hash (sha256 for LFS files, else the git blob sha1) fed as the
    bytes arrive. ``resume(part, have)`` brings it to ``have`` bytes: it reads from the
    part only the bytes it has not seen (a resumed file's part once, at the first
    attempt), and starts again only when the part shrank below what it saw."""

    def __init__(self, entry):
        self.entry = entry
        self.at = 0
        self.h = self._fresh()

    def _fresh(self):
        if self.entry.get("sha256"):
            return hashlib.sha256()
        return hashlib.sha1(b"blob %d\0" % self.entry["size"])

    def resume(self, part, have):
        if have < self.at:
            self.h, self.at = self._fresh(), 0
        if have > self.at:
            with open(part, "rb") as f:
                f.seek(self.at)
                while self.at < have:
                    block = f.read(min(1 << 20, have - self.at))
                    if not block:
                        raise OSError(f"{part} ended at byte {self.at:,} of {have:,}")
                    self.update(block)

    def update(self, chunk):
        self.h.update(chunk)
        self.at += len(chunk)

    def matches(self):
        """Whether every byte was seen and they hash to the listing's value."""
        want = self.entry.get("sha256") or self.entry["git_sha1"]
        return self.at == self.entry["size"] and self.h.hexdigest() == want


def verify(directory, files):
    """The files (dicts: path, size, sha256|None, git_sha1) that are missing or differ."""
    bad = []
    for entry in files:
        path = hub_client().safe_join(directory, entry["path"])
        try:
            if os.path.getsize(path) != entry["size"]:
                bad.append(entry["path"])
            elif entry.get("sha256"):
                if sha256(path) != entry["sha256"]:
                    bad.append(entry["path"])
            elif git_sha1(path) != entry["git_sha1"]:
                bad.append(entry["path"])
        except OSError:
            bad.append(entry["path"])
    return bad


# ------------------------------------------------------------------ fetch


def hub_client():
    """The sibling module every Hub request goes through (hub_client.py, carried beside
    this script; the controller imports the same file under the same name)."""
    import importlib.util

    name = "gpuserve_hub_client"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hub_client.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class Progress:
    """Bytes on disk in the staging directory (finished and ``.incomplete`` files),
    reported every ``every`` seconds with the rate, the ETA and when bytes last grew
    (``progress_at``: how the next deploy tells a hung fetch from a slow one)."""

    def __init__(self, staging, total, report, every=2.0):
        self.staging, self.total, self.report, self.every = staging, total, report, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.start_bytes = None

    def _loop(self):
        t0 = time.monotonic()
        self.start_bytes = last = _dir_bytes(self.staging)
        progress_at = time.time()
        while not self.stop.wait(self.every):
            done = min(_dir_bytes(self.staging), self.total)
            if done != last:
                last, progress_at = done, time.time()
            elapsed = time.monotonic() - t0
            rate = max(done - self.start_bytes, 0) / elapsed if elapsed > 0 else 0.0
            eta = (self.total - done) / rate if rate > 0 else None
            self.report({"state": "running", "phase": "download", "bytes": done,
                         "total": self.total, "rate": rate, "eta_s": eta,
                         "progress_at": progress_at})

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)


def _parts_dir(staging):
    return os.path.join(staging, ".cache", "gpuserve")


def _have(staging, entry):
    """Bytes of ``entry`` already staged (its final file, else its partial file)."""
    hub = hub_client()
    for path in (hub.safe_join(staging, entry["path"]),
                 os.path.join(_parts_dir(staging), hub.part_name(entry))):
        with contextlib.suppress(OSError):
            return min(os.lstat(path).st_size, entry["size"])
    return 0


def check_disk(staging, files, total):
    """Refuse before downloading when the bytes still to fetch exceed the free disk."""
    need = sum(f["size"] - _have(staging, f) for f in files)
    free = shutil.disk_usage(staging).free
    if need + DISK_RESERVE > free:
        raise Refused(f"disk: {free:,} bytes free at {os.path.dirname(staging)}, the "
                      f"revision needs {need:,} more ({total:,} in all) plus a reserve of "
                      f"{DISK_RESERVE:,}: nothing was downloaded", EXIT_DISK)
    return need


def download_file(client, repo, commit, staging, entry, stall, deadline, tries=5):
    """One file into its partial file (resumed, up to ``tries`` times in this run),
    hashed as its bytes arrive, then renamed to its name under ``staging`` (proven to
    lie under it): True. False when its bytes differ from the listing's hash (the part
    is removed: the next round fetches it again). A file already under its name counts
    when this staging directory recorded it verified; else it is hashed once."""
    hub = hub_client()
    final = hub.safe_join(staging, entry["path"])
    if os.path.isfile(final) and os.lstat(final).st_size == entry["size"]:
        if _verified(staging, entry, final):
            return True
        known = StreamHash(entry)
        known.resume(final, entry["size"])
        if known.matches():
            _record(staging, entry, final)
            return True
        forget(staging, entry["path"])
        return False
    parts = _parts_dir(staging)
    os.makedirs(parts, exist_ok=True)
    part = os.path.join(parts, hub.part_name(entry))
    url = client.resolve_url(repo, commit, entry["path"])
    hasher = StreamHash(entry)
    for attempt in range(1, tries + 1):
        try:
            client.download(url, part, entry["size"], stall=stall, deadline=deadline,
                            hasher=hasher, what=hub.shown(entry["path"]))
            break
        except hub.HubError as e:
            if not e.resumable or e.kind == "timeout" or attempt == tries:
                raise
            time.sleep(min(2 * attempt, 10))
    if not hasher.matches():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        return False
    os.makedirs(os.path.dirname(final), exist_ok=True)
    final = hub.safe_join(staging, entry["path"])  # again: the folders exist now
    os.replace(part, final)
    _record(staging, entry, final)
    return True


def _record_path(staging, entry, final):
    """The verified record of ``final``: an empty file whose name holds the entry's
    path and hash and the file's inode, size and mtime (no byte added to staging)."""
    st = os.lstat(final)
    name = hashlib.sha1(entry["path"].encode("utf-8", "surrogatepass")).hexdigest()
    want = entry.get("sha256") or entry["git_sha1"]
    return os.path.join(_parts_dir(staging), f"{name}.{want}.{st.st_ino}.{st.st_size}."
                                             f"{st.st_mtime_ns}.verified")


def _record(staging, entry, final):
    """Note that ``final`` (this inode, size and mtime) hashed to the listing's value."""
    os.makedirs(_parts_dir(staging), exist_ok=True)
    with open(_record_path(staging, entry, final), "w", encoding="utf-8"):
        pass


def _verified(staging, entry, final):
    """Whether this staging directory recorded ``final``, unchanged since, as verified."""
    try:
        return os.path.isfile(_record_path(staging, entry, final))
    except OSError:
        return False


def forget(directory, name):
    """Remove a file that failed verification (proven to lie under ``directory``)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(hub_client().safe_join(directory, name))


def reopen(target, staging):
    """A directory under its final name whose files no longer match the marker goes
    back to staging, where verification finds what to fetch again."""
    if os.path.isdir(target):
        for root, dirs, _files in os.walk(target):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        os.chmod(target, 0o755)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(target, MARKER))
        if os.path.isdir(staging):
            shutil.rmtree(staging)
        os.rename(target, staging)


def seal(staging, target, marker):
    """Marker, read-only files, then the rename that makes the directory final."""
    shutil.rmtree(os.path.join(staging, ".cache"), ignore_errors=True)
    with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
        json.dump(marker, f, indent=1)
    for root, dirs, files in os.walk(staging):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(staging, 0o555)
    os.rename(staging, target)


class FetchOptions(NamedTuple):
    """How a fetch runs: rounds of downloads, files at once, whether the free disk is
    checked first, and its limits (None: hub_client's default or none): the stall of a
    body, the listing's file cap, the monotonic deadline of the whole fetch, the minimum
    rate a body averages."""

    rounds: int = 3
    workers: int = 8
    disk_check: bool = True
    stall: float | None = None
    max_files: int | None = None
    deadline: float | None = None
    min_rate: float | None = None


DEFAULT_FETCH = FetchOptions()


def fetch(repo, commit, target, endpoint=None, token=None, report=print,
          options=DEFAULT_FETCH):
    """Fetch and verify ``repo@commit`` into ``target``; the marker's document. Every
    request goes through hub_client (caps, deadlines, the minimum rate, the token to the
    endpoint alone); the listing is judged by its rule before any file is touched; each
    file is hashed as it arrives and only the files that differ are fetched again."""
    rounds, workers, disk_check, stall, max_files, deadline, min_rate = options
    hub = hub_client()
    done = read_marker(target)
    if done is not None and done.get("commit") == commit:
        report({"state": "running", "phase": "present", "bytes": 0, "total": 0})
        return done
    client = hub.Client(endpoint, token, hub.Limits(stall=stall or hub.STALL_TIMEOUT,
                                                     min_rate=min_rate))
    files = client.list_tree(repo, commit, max_files or hub.MAX_FILES, deadline)
    staging = target.rstrip("/") + ".partial"
    reopen(target, staging)
    os.makedirs(staging, exist_ok=True)
    total = sum(f["size"] for f in files)
    need = check_disk(staging, files, total) if disk_check else total
    report({"state": "running", "phase": "plan", "bytes": total - need, "total": total,
            "files": len(files), "to_fetch": need})
    refetched, todo = [], files
    for attempt in range(1, rounds + 1):
        with Progress(staging, total, report):
            bad = _download_all(client, repo, commit, staging, todo, workers,
                                stall or hub.STALL_TIMEOUT, deadline)
        if not bad:
            break
        refetched += bad
        report({"state": "running", "phase": "refetch", "bad": bad, "round": attempt,
                "bytes": total, "total": total})
        todo = [f for f in files if f["path"] in set(bad)]
    else:
        raise Refused(f"verification: {', '.join(hub.shown(b) for b in bad[:5])} still "
                      f"differ from the Hub's hashes after {rounds} downloads; {staging} "
                      "is kept", EXIT_VERIFY)
    marker = {"schema": SCHEMA, "repo": repo, "commit": commit, "endpoint": endpoint,
              "files": files, "total_bytes": total, "verified": "sha256 (LFS) / git sha1",
              "refetched": refetched, "sealed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                 time.gmtime())}
    seal(staging, target, marker)
    return marker


def _download_all(client, repo, commit, staging, files, workers, stall, deadline):
    """Every file, ``workers`` at once (files sharing a partial file's name, the same
    bytes, one after the other); the names whose bytes differed from the listing, in
    listing order; the first failure (in listing order) raised."""
    from concurrent.futures import ThreadPoolExecutor

    def one(entry):
        try:
            return download_file(client, repo, commit, staging, entry, stall, deadline)
        except Exception as e:  # noqa: BLE001 - re-raised below, in listing order
            return e

    hub = hub_client()
    waves, seen = [[], []], set()
    for entry in files:
        waves[hub.part_name(entry) in seen].append(entry)
        seen.add(hub.part_name(entry))
    results = {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for wave in waves:
            results.update(zip((f["path"] for f in wave), pool.map(one, wave), strict=True))
    errors = [results[f["path"]] for f in files if isinstance(results[f["path"]], Exception)]
    if errors:
        raise errors[0]
    return [f["path"] for f in files if results[f["path"]] is False]


# ------------------------------------------------------------------ background run


def _write(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def run(args):
    """The download itself (as the service user): status lines into ``--status``."""
    token = None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip() or None

    def report(doc):
        if args.status:
            _write(args.status, json.dumps({**doc, "at": time.time()}))
        else:
            print(json.dumps(doc), flush=True)

    hub = hub_client()
    deadline = time.monotonic() + args.timeout if args.timeout else None
    try:
        marker = fetch(args.repo, args.commit, args.target, endpoint=args.endpoint,
                       token=token, report=report, options=FetchOptions(
                           rounds=args.rounds, workers=args.workers,
                           stall=args.stall_timeout, max_files=args.max_files,
                           deadline=deadline, min_rate=args.min_rate))
    except Refused as e:
        report({"state": "failed", "error": hub.one_line(e, (token,), 400), "code": e.code})
        return e.code
    except hub.HubError as e:
        report({"state": "failed", "error": hub.one_line(
            f"{args.endpoint or 'https://huggingface.co'}: {args.repo}@{args.commit}: {e}",
            (token,), 400), "kind": e.kind})
        return 1
    except Exception as e:  # noqa: BLE001 - one line for the controller, never a token
        report({"state": "failed",
                "error": hub.one_line(f"{type(e).__name__}: {e}", (token,), 400)})
        return 1
    if args.ref:
        os.makedirs(os.path.dirname(args.ref), exist_ok=True)
        _write(args.ref, args.commit + "\n")
    report({"state": "done", "bytes": marker["total_bytes"], "total": marker["total_bytes"],
            "files": len(marker["files"]), "refetched": marker.get("refetched", [])})
    return 0


def _host_job():
    """The job runner carried beside this script (host_job.py), loaded by its path: this
    module also runs imported by the controller, where its directory is not on sys.path."""
    import importlib.util

    name = "gpuserve_host_job"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_job.py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def start(args):
    """Start ``run`` detached as ``--user`` (root calls this); print the pid."""
    user = pwd.getpwnam(args.user)
    running = _running(args.run_dir)
    if running and (not _hung(args.run_dir, args.hung_after)
                    or not _ours(running, args.run_dir)):
        # an earlier deploy's download (past its timeout) still runs and moves: attach
        print(json.dumps({"started": False, "pid": running}))
        return 0
    if running:  # no byte for hung_after seconds: end it (its partial files stay)
        _end(running)
    os.makedirs(args.run_dir, mode=0o700, exist_ok=True)
    os.chown(args.run_dir, user.pw_uid, user.pw_gid)
    for name in ("status.json", "rc", "run.err"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(args.run_dir, name))
    env = {"PATH": os.path.dirname(args.python) + ":/usr/local/bin:/usr/bin:/bin",
           "HOME": args.run_dir, "HF_HOME": os.path.join(args.run_dir, "hf"),
           "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           # progress is the status file's; tqdm's bars would fill run.err for hours
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    argv = [args.python, os.path.abspath(__file__), *rest,
            "--status", os.path.join(args.run_dir, "status.json")]
    shell = (" ".join(_q(a) for a in argv) + f" 2>{_q(args.run_dir + '/run.err')}; "
             f"echo $? > {_q(args.run_dir + '/rc')}")
    pid = _host_job().detach(["/bin/sh", "-c", shell], args.run_dir, user=args.user,
                             env=env, cwd=args.run_dir)
    print(json.dumps({"started": True, "pid": pid}))
    return 0


def _running(run_dir):
    """The pid of this run directory's download while it still runs, else None."""
    try:
        with open(os.path.join(run_dir, "pid"), encoding="utf-8") as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    if os.path.exists(os.path.join(run_dir, "rc")):
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    return pid


def _hung(run_dir, after):
    """Whether a running download made no progress for ``after`` seconds: its last
    download status line's ``progress_at``, or the start itself when it never wrote a
    status line (hung while listing)."""
    path = os.path.join(run_dir, "status.json")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("phase") != "download":
            return False  # planning or hashing local files: no server in the loop
        seen = float(doc.get("progress_at") or doc.get("at") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        try:
            seen = os.path.getmtime(os.path.join(run_dir, "pid"))
        except OSError:
            return True
    return time.time() - seen > after


def _ours(pid, run_dir):
    """Whether ``pid`` leads its own process group and runs this script for
    ``run_dir`` (never a reused pid, never the caller's own group)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        leader = os.getpgid(pid) == pid and pid != os.getpgrp()
    except OSError:
        return False
    text = b" ".join(argv)
    return leader and b"weights_fetch.py" in text and \
        os.path.join(run_dir, "status.json").encode() in text


def _end(pid):
    """End a hung download's process group (TERM, then KILL), waiting for it to go."""
    import signal

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)
        t = time.monotonic()
        while time.monotonic() - t < wait:
            try:
                os.kill(pid, 0)
            except OSError:
                return
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)


def _q(text):
    return "'" + text.replace("'", "'\\''") + "'"


def status(args):
    """The run's last status line; ``failed`` when it exited without saying why."""
    def read(name):
        try:
            with open(os.path.join(args.run_dir, name), encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None

    doc = {"state": "starting"}
    text = read("status.json")
    if text:
        with contextlib.suppress(ValueError):
            doc = json.loads(text)
    rc = read("rc")
    if rc is not None and doc.get("state") not in ("done", "failed"):
        tail = (read("run.err") or "").strip().splitlines()[-5:]
        doc = {"state": "failed", "error": f"exited with status {rc.strip()}",
               "tail": tail}
    print(json.dumps(doc))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("state")
    s.add_argument("--target", required=True)
    s.add_argument("--ref")
    s.add_argument("--models-dir")
    r = sub.add_parser("run")
    r.add_argument("--repo", required=True)
    r.add_argument("--commit", required=True)
    r.add_argument("--target", required=True)
    r.add_argument("--endpoint")
    r.add_argument("--token-file")
    r.add_argument("--status")
    r.add_argument("--ref")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--min-rate", type=float, default=None)
    r.add_argument("--stall-timeout", type=float, default=None)
    r.add_argument("--max-files", type=int, default=None)
    r.add_argument("--timeout", type=float, default=None)
    st = sub.add_parser("start")
    st.add_argument("--run-dir", required=True)
    st.add_argument("--user", required=True)
    st.add_argument("--python", required=True)
    st.add_argument("--hung-after", type=float, default=300.0)
    st.add_argument("rest", nargs=argparse.REMAINDER)
    q = sub.add_parser("status")
    q.add_argument("--run-dir", required=True)
    a = p.parse_args(argv)
    if a.cmd == "state":
        print(json.dumps(state(a.target, a.ref, a.models_dir)))
        return 0
    return {"run": run, "start": start, "status": status}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
