#!/usr/bin/env python3
"""Run SGLang's benchmark client on the host in the background, and report on it.

Uploaded and run as root by roles/checks (stdlib only, Python >= 3.8). Why in the
background: a benchmark takes minutes and pyinfra shows nothing while a command runs, so
the deploy starts the client here (``start``), then polls ``status`` (a read, printed as
one JSON line) to show the scenario, requests done and elapsed time, and ``stop``s it on
its own timeout. ``mark`` records the configuration that passed its gate, so a rerun
with nothing changed does not benchmark again.

Each run has its own directory (0700, owned by the service user): ``argv.json`` (the
client's arguments, no secret), ``client.out``/``client.err`` (its report and tqdm
progress), ``result.jsonl`` (its ``--output-file``), ``rc`` (exit status, written by the
monitor when the client ends) and ``monitor.pid``. The client runs as the service user
in the SGLang venv with ``HF_HUB_OFFLINE=1``; the server's API key, when it has one, is
read from its 0600 ``--config`` file and handed over in ``OPENAI_API_KEY`` (the client
sends it as a Bearer token), never on a command line.

``status`` prints SGLang's result line without ``server_info`` (the server's resolved
arguments, API key included) so that the key never reaches the controller.
"""

import argparse
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time

import host_job
from sglang_probe import api_key_from_config, server_host

PROGRESS = re.compile(r"(\d+)/(\d+) \[")
TAIL_LINES = 15


def _path(run_dir, name):
    return os.path.join(run_dir, name)


def _read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


LOOPBACK_URL = re.compile(r"^http://127\.0\.0\.1:(\d+)(/.*)?$")


def reach_server(argv):
    """``argv`` with ``--base-url http://127.0.0.1:PORT`` pointed at the address the
    server listens on (sglang_probe.server_host): a private ``listen_address`` serves
    there alone. The controller renders 127.0.0.1 so the run's fingerprint does not
    depend on it; argv.json records what really ran."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        match = LOOPBACK_URL.match(out[i + 1]) if arg == "--base-url" else None
        if match:
            host = server_host(int(match.group(1)))
            out[i + 1] = f"http://{host}:{match.group(1)}{match.group(2) or ''}"
    return out


def start(args):
    """Create the run directory and start the monitor (detached); print its pid."""
    user = pwd.getpwnam(args.user)
    argv = reach_server(json.loads(args.argv_json))
    os.makedirs(args.run_dir, mode=0o700, exist_ok=False)
    os.chown(args.run_dir, user.pw_uid, user.pw_gid)
    _write(_path(args.run_dir, "argv.json"), json.dumps(argv))
    _write(_path(args.run_dir, "started"), repr(time.time()))
    monitor = [sys.executable, os.path.abspath(__file__), "_monitor", "--run-dir",
               args.run_dir, "--user", args.user, "--python", args.python,
               "--config", args.config]
    pid = host_job.detach(monitor, args.run_dir, pid_name="monitor.pid")
    print(json.dumps({"started": True, "pid": pid}))


def monitor(args):
    """Run the client as the service user, wait, write its exit status to ``rc``."""
    user = pwd.getpwnam(args.user)
    argv = json.loads(_read(_path(args.run_dir, "argv.json"), "[]"))
    env = {
        "PATH": os.path.dirname(args.python) + ":/usr/local/bin:/usr/bin:/bin",
        "HOME": user.pw_dir,
        "LANG": "C.UTF-8",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    key = api_key_from_config(args.config)
    if key:
        env["OPENAI_API_KEY"] = key

    drop = host_job.drop_to(args.user)
    started = time.time()
    with open(_path(args.run_dir, "client.out"), "wb") as out, \
            open(_path(args.run_dir, "client.err"), "wb") as err:
        for f in (out, err):
            os.chown(f.name, user.pw_uid, user.pw_gid)
        try:
            proc = subprocess.Popen([args.python, "-m", "sglang.benchmark.serving", *argv],
                                    cwd=args.run_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, preexec_fn=drop)
            rc = proc.wait()
        except OSError as e:
            err.write(f"cannot start the benchmark client: {e}\n".encode())
            rc = 127
    _write(_path(args.run_dir, "rc"), json.dumps({"rc": rc, "seconds": time.time() - started}))


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _result_line(run_dir):
    """The last JSON line of the client's output file, without ``server_info``."""
    lines = [x for x in _read(_path(run_dir, "result.jsonl")).splitlines() if x.strip()]
    if not lines:
        return None
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        return lines[-1][:2000]  # the controller reports it as not JSON
    if isinstance(doc, dict):
        doc.pop("server_info", None)
    # the line keeps SGLang's Infinity (request_rate); the controller reads it
    return json.dumps(doc)


def status(args):
    run_dir = args.run_dir
    doc = {"state": "missing"}
    if os.path.isdir(run_dir):
        err = _read(_path(run_dir, "client.err"))
        found = PROGRESS.findall(err.replace("\r", "\n")[-4000:])
        done, total = (int(found[-1][0]), int(found[-1][1])) if found else (0, None)
        rc_doc = _read(_path(run_dir, "rc"))
        started = float(_read(_path(run_dir, "started"), "0") or 0) or time.time()
        doc = {"state": "running", "done": done, "total": total,
               "elapsed": round(time.time() - started, 1)}
        if rc_doc:
            rc = json.loads(rc_doc)
            doc.update(state="done" if rc["rc"] == 0 else "failed", rc=rc["rc"],
                       elapsed=round(rc["seconds"], 1))
        else:
            pid = int(_read(_path(run_dir, "monitor.pid"), "0") or 0)
            if not pid or not _pid_alive(pid):
                doc["state"] = "failed"
                doc["rc"] = None
        if doc["state"] != "running":
            out = _read(_path(run_dir, "client.out")).splitlines()
            errs = [x for x in err.replace("\r", "\n").splitlines() if x.strip()
                    and not PROGRESS.search(x)]
            doc["tail"] = (out + errs)[-TAIL_LINES:]
            doc["line"] = _result_line(run_dir)
    print(json.dumps(doc))


def stop(args):
    pid = int(_read(_path(args.run_dir, "monitor.pid"), "0") or 0)
    if pid and _pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
            time.sleep(2)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(json.dumps({"stopped": pid}))


def mark(args):
    os.makedirs(os.path.dirname(args.file), mode=0o755, exist_ok=True)
    _write(args.file, json.dumps({"fingerprint": args.fingerprint,
                                  "profile": args.profile,
                                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--user", required=True)
    s.add_argument("--python", required=True)
    s.add_argument("--config", default="")
    s.add_argument("--argv-json", required=True)
    s.set_defaults(func=start)
    m = sub.add_parser("_monitor")
    for name in ("--run-dir", "--user", "--python"):
        m.add_argument(name, required=True)
    m.add_argument("--config", default="")
    m.set_defaults(func=monitor)
    for name, func in (("status", status), ("stop", stop)):
        q = sub.add_parser(name)
        q.add_argument("--run-dir", required=True)
        q.set_defaults(func=func)
    k = sub.add_parser("mark")
    k.add_argument("--file", required=True)
    k.add_argument("--fingerprint", required=True)
    k.add_argument("--profile", required=True)
    k.set_defaults(func=mark)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
