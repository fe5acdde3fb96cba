#!/usr/bin/env python3
"""One health probe of an SGLang systemd unit, run on the host by the health gate.

Uploaded by roles/checks and run with the host's python3 (stdlib only, Python >= 3.8).
It only reads: GET /health on 127.0.0.1 (so the port need not be open to the
controller), `systemctl show` and `journalctl`. It always exits 0 and prints exactly one
JSON line; every judgement is made on the controller (gpuserve/measure/health.py).
"""

import argparse
import json
import subprocess
import urllib.error
import urllib.request

UNIT_PROPS = "ActiveState,SubState,NRestarts,ExecMainStatus,InvocationID,MainPID"


def http_status(port, path, timeout):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, None
    except urllib.error.HTTPError as e:
        return e.code, None
    except Exception as e:  # refused, reset, timeout: nothing healthy listens yet
        return None, f"{type(e).__name__}: {e}"


def run(cmd):
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, errors="replace", timeout=20)
        return out.stdout
    except Exception:
        return ""


def unit_state(unit):
    props = {}
    for line in run(["systemctl", "show", unit, "-p", UNIT_PROPS]).splitlines():
        key, _, value = line.partition("=")
        props[key] = value
    return props


def journal(args):
    """Lines of the current start attempt, and its tail with systemd's own messages.

    The server's output carries _SYSTEMD_INVOCATION_ID; systemd's messages about the
    unit ("Main process exited, code=exited, status=1/FAILURE") carry INVOCATION_ID.
    """
    lines, tail = [], []
    inv = args.invocation
    if inv:
        lines = run(["journalctl", "_SYSTEMD_INVOCATION_ID=" + inv, "-o", "cat", "--no-pager",
                     "-n", str(args.lines)]).splitlines()
        tail = run(["journalctl", "_SYSTEMD_INVOCATION_ID=" + inv, "+", "INVOCATION_ID=" + inv,
                    "-o", "short-iso", "--no-pager", "-n", str(args.tail)]).splitlines()
    if not tail or tail == ["-- No entries --"]:
        tail = run(["journalctl", "-u", args.unit, "-o", "short-iso", "--no-pager",
                    "-n", str(args.tail)]).splitlines()
    return lines, tail


def last_exit(unit, n_restarts):
    """systemd's line about the unit's last main-process exit ("Main process exited,
    code=killed, status=9/KILL"), only when systemd restarted it: after a restart the
    unit's ExecMain* properties describe the new process, so only the journal still
    knows how the old one ended."""
    if n_restarts in ("", "0"):
        return None
    for line in reversed(run(["journalctl", "-u", unit, "-o", "cat", "--no-pager",
                              "-n", "300"]).splitlines()):
        if "Main process exited" in line:
            return line
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--unit", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/health")
    p.add_argument("--lines", type=int, default=400)
    p.add_argument("--tail", type=int, default=30)
    p.add_argument("--http-timeout", type=float, default=25.0)
    args = p.parse_args()
    status, error = http_status(args.port, args.path, args.http_timeout)
    unit = unit_state(args.unit)
    args.invocation = unit.get("InvocationID", "")
    lines, tail = journal(args)
    print(json.dumps({"health": status, "health_error": error, "unit": unit,
                      "lines": lines, "tail": tail,
                      "last_exit": last_exit(args.unit, unit.get("NRestarts", ""))}))


if __name__ == "__main__":
    main()
