#!/usr/bin/env python3
"""Fetch one Hub revision into an immutable directory, verified, resumable.

Pushed to the GPU host and run with the SGLang venv's python (stdlib + huggingface_hub);
imported by ``gpuserve weights`` on a connected machine, so there is one implementation.

    weights_fetch.py state --target DIR [--ref FILE] [--models-dir DIR]   (host python3)
    weights_fetch.py start --run-dir RD --user U --python PY -- run ARGS...  (root)
    weights_fetch.py status --run-dir RD
    weights_fetch.py run --repo ORG/NAME --commit SHA --target DIR [--endpoint URL]
                         [--token-file F] [--status F] [--ref FILE] [--revision REF]

``run`` downloads into ``DIR.partial`` with huggingface_hub's ``snapshot_download``
(``local_dir``: partial files live under ``.cache/huggingface/download/*.incomplete``,
never under their final name, and a rerun resumes them), after a dry run whose bytes
still to fetch are checked against the free disk. Every file is then hashed against the
revision's tree listing: sha256 for LFS files, the git blob sha1 for the others; a file
that does not match is removed with its download metadata and fetched again (at most
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
import subprocess
import sys
import threading
import time

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
        for entry in doc["files"]:
            if os.path.getsize(os.path.join(target, entry["path"])) != entry["size"]:
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


def verify(directory, files):
    """The files (dicts: path, size, sha256|None, git_sha1) that are missing or differ."""
    bad = []
    for entry in files:
        path = os.path.join(directory, entry["path"])
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


def forget(directory, name):
    """Remove a file that failed verification and huggingface_hub's metadata of it
    (which would otherwise let the next round keep it)."""
    for path in (os.path.join(directory, name),
                 os.path.join(directory, ".cache", "huggingface", "download",
                              name + ".metadata")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# ------------------------------------------------------------------ fetch


def tree(api, repo, commit):
    """The revision's files with size and hashes (huggingface_hub's list_repo_tree)."""
    out = []
    for e in api.list_repo_tree(repo, recursive=True, revision=commit):
        if hasattr(e, "size") and hasattr(e, "blob_id"):
            lfs = getattr(e, "lfs", None)
            out.append({"path": e.path, "size": int(e.size),
                        "sha256": lfs["sha256"] if lfs else None, "git_sha1": e.blob_id})
    return sorted(out, key=lambda f: f["path"])


class Progress:
    """Bytes on disk in the staging directory (finished and ``.incomplete`` files),
    reported every ``every`` seconds with the rate and ETA, from a thread."""

    def __init__(self, staging, total, report, every=2.0):
        self.staging, self.total, self.report, self.every = staging, total, report, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.start_bytes = None

    def _loop(self):
        t0 = time.monotonic()
        self.start_bytes = _dir_bytes(self.staging)
        while not self.stop.wait(self.every):
            done = min(_dir_bytes(self.staging), self.total)
            elapsed = time.monotonic() - t0
            rate = max(done - self.start_bytes, 0) / elapsed if elapsed > 0 else 0.0
            eta = (self.total - done) / rate if rate > 0 else None
            self.report({"state": "running", "phase": "download", "bytes": done,
                         "total": self.total, "rate": rate, "eta_s": eta})

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)


def _download(repo, commit, staging, endpoint, token, workers, dry_run=False):
    from huggingface_hub import snapshot_download

    return snapshot_download(repo, revision=commit, local_dir=staging, endpoint=endpoint,
                             token=token or False, max_workers=workers, dry_run=dry_run,
                             cache_dir=os.path.join(staging, ".cache", "hub"))


def check_disk(staging, plan, total):
    """Refuse before downloading when the bytes still to fetch exceed the free disk."""
    need = sum(f.file_size for f in plan if f.will_download)
    free = shutil.disk_usage(staging).free
    if need + DISK_RESERVE > free:
        raise Refused(f"disk: {free:,} bytes free at {os.path.dirname(staging)}, the "
                      f"revision needs {need:,} more ({total:,} in all) plus a reserve of "
                      f"{DISK_RESERVE:,}: nothing was downloaded", EXIT_DISK)
    return need


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


def fetch(repo, commit, target, endpoint=None, token=None, report=print, rounds=3,
          workers=8, disk_check=True):
    """Fetch and verify ``repo@commit`` into ``target``; the marker's document."""
    from huggingface_hub import HfApi

    done = read_marker(target)
    if done is not None and done.get("commit") == commit:
        report({"state": "running", "phase": "present", "bytes": 0, "total": 0})
        return done
    staging = target.rstrip("/") + ".partial"
    reopen(target, staging)
    os.makedirs(staging, exist_ok=True)
    api = HfApi(endpoint=endpoint, token=token or False, library_name="gpuserve")
    files = tree(api, repo, commit)
    total = sum(f["size"] for f in files)
    plan = _download(repo, commit, staging, endpoint, token, workers, dry_run=True)
    need = check_disk(staging, plan, total) if disk_check else total
    report({"state": "running", "phase": "plan", "bytes": total - need, "total": total,
            "files": len(files), "to_fetch": need})
    refetched = []
    for attempt in range(1, rounds + 1):
        with Progress(staging, total, report):
            _download(repo, commit, staging, endpoint, token, workers)
        report({"state": "running", "phase": "verify", "bytes": total, "total": total})
        bad = verify(staging, files)
        if not bad:
            break
        refetched += bad
        report({"state": "running", "phase": "refetch", "bad": bad, "round": attempt,
                "bytes": total, "total": total})
        for name in bad:
            forget(staging, name)
    else:
        raise Refused(f"verification: {', '.join(bad[:5])} still differ from the Hub's "
                      f"hashes after {rounds} downloads; {staging} is kept", EXIT_VERIFY)
    marker = {"schema": SCHEMA, "repo": repo, "commit": commit, "endpoint": endpoint,
              "files": files, "total_bytes": total, "verified": "sha256 (LFS) / git sha1",
              "refetched": refetched, "sealed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                 time.gmtime())}
    seal(staging, target, marker)
    return marker


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

    try:
        marker = fetch(args.repo, args.commit, args.target, endpoint=args.endpoint,
                       token=token, report=report, rounds=args.rounds, workers=args.workers)
    except Refused as e:
        report({"state": "failed", "error": str(e), "code": e.code})
        return e.code
    except Exception as e:  # noqa: BLE001 - one line for the controller, never a token
        report({"state": "failed", "error": f"{type(e).__name__}: {str(e)[:400]}"})
        return 1
    if args.ref:
        os.makedirs(os.path.dirname(args.ref), exist_ok=True)
        _write(args.ref, args.commit + "\n")
    report({"state": "done", "bytes": marker["total_bytes"], "total": marker["total_bytes"],
            "files": len(marker["files"]), "refetched": marker.get("refetched", [])})
    return 0


def start(args):
    """Start ``run`` detached as ``--user`` (root calls this); print the pid."""
    user = pwd.getpwnam(args.user)
    running = _running(args.run_dir)
    if running:  # an earlier deploy's download (past its timeout) still runs: attach
        print(json.dumps({"started": False, "pid": running}))
        return 0
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

    def drop():
        os.setgid(user.pw_gid)
        os.initgroups(args.user, user.pw_gid)
        os.setuid(user.pw_uid)

    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        proc = subprocess.Popen(["/bin/sh", "-c", shell], stdin=null_in, stdout=null_out,
                                stderr=null_out, env=env, cwd=args.run_dir,
                                start_new_session=True, close_fds=True, preexec_fn=drop)
    _write(os.path.join(args.run_dir, "pid"), str(proc.pid))
    print(json.dumps({"started": True, "pid": proc.pid}))
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
    st = sub.add_parser("start")
    st.add_argument("--run-dir", required=True)
    st.add_argument("--user", required=True)
    st.add_argument("--python", required=True)
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
