#!/usr/bin/env python3
"""One health probe of an SGLang systemd unit, run on the host by the health gate.

Uploaded by roles/checks and run with the host's python3 (stdlib only, Python >= 3.8).
It only reads: GET /health on the host itself (so the port need not be open to the
controller), `systemctl show` and `journalctl`. It always exits 0 and prints one JSON
line; every judgement is made on the controller (gpuserve/measure/health.py). With
``--smoke-model`` and a healthy server, it then makes sglang_smoke.py's completion and
prints that script's JSON line second (with the unit's InvocationID as ``start``), or,
with ``--smoke-unless-start`` naming the unit's current start, ``{"same_start": ID}``.

Where on the host: :func:`server_host` finds the address the server listens on at the
port in /proc/net/tcp{,6} (127.0.0.1 when it listens on every interface or not yet).
Why: host data ``listen_address`` may name a private address (RFC 1918 / ULA) the server
listens on alone; 127.0.0.1 would never answer then. The smoke and benchmark scripts
import it, so all three reach the server the same way.
"""

import argparse
import ipaddress
import json
import socket
import subprocess
import time

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _address(hex_addr, v6):
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw) if v6 else ipaddress.IPv4Address(raw)


def server_host(port, tables=(("/proc/net/tcp", False), ("/proc/net/tcp6", True))):
    """The host part of a URL that reaches what listens on ``port`` here: its address
    (IPv6 in brackets), or 127.0.0.1 for every interface or when nothing listens yet."""
    for path, v6 in tables:
        try:
            with open(path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 4 or fields[3] != LISTEN:
                continue
            hex_addr, _, hex_port = fields[1].partition(":")
            try:
                if int(hex_port, 16) != port:
                    continue
                address = _address(hex_addr, v6)
            except ValueError:
                continue
            if address.is_unspecified:  # every interface (:: takes IPv4 too on Linux)
                return "127.0.0.1"
            return f"[{address}]" if v6 else str(address)  # 127.0.0.2 and ::1 as they are
    return "127.0.0.1"

UNIT_PROPS = "ActiveState,SubState,NRestarts,ExecMainStatus,InvocationID,MainPID"


def _dechunk(data):
    """The body of a ``Transfer-Encoding: chunked`` response (RFC 9112 section 7.1)."""
    out, pos = [], 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            raise ValueError("truncated chunked body")
        size = int(data[pos:end].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return b"".join(out)
        start = end + 2
        if start + size > len(data):
            raise ValueError("truncated chunked body")
        out.append(data[start:start + size])
        pos = start + size + 2


def http_request(host, port, path, timeout, body=None, headers=None):
    """``(status, body bytes)`` of one plain HTTP/1.1 request to the server on this host.

    Why not urllib: importing it (http.client, email, ssl) took 0.5 s of every probe and
    smoke on the lab host, and this is only ever a request to the server's own port
    here. ``timeout`` bounds the whole exchange; a response that is not HTTP raises
    ValueError, a refused or cut connection OSError."""
    deadline = time.monotonic() + timeout
    head = [f"{'GET' if body is None else 'POST'} {path} HTTP/1.1", f"Host: {host}:{port}",
            "Connection: close", "Accept-Encoding: identity"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        head.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
    chunks = []
    with socket.create_connection((host.strip("[]"), port), timeout=timeout) as sock:
        sock.sendall(request)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete response within {timeout} s")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    header, sep, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = header.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        rest = _dechunk(rest)
    elif fields.get("content-length", "").isdigit():
        rest = rest[:int(fields["content-length"])]
    return int(parts[1]), rest


def http_status(port, path, timeout):
    try:
        return http_request(server_host(port), port, path, timeout)[0], None
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


def ended(unit, first_restarts):
    """systemd has seen this start attempt end (the controller decides the rest)."""
    return (unit.get("ActiveState") in ("failed", "inactive")
            or unit.get("SubState") == "auto-restart"
            or unit.get("NRestarts", "") != first_restarts)


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


def api_key_from_config(path):
    """Read `api-key:` from the YAML file gpuserve writes (one `key: "json string"` a line)."""
    if not path:
        return None
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("api-key", "api_key"):
                    value = value.strip()
                    return json.loads(value) if value.startswith('"') else value
    except OSError:
        return None
    return None


def complete(port, model, max_tokens=64, config="", prompt="The capital of France is",
             endpoint="/v1/completions", timeout=300.0):
    """One completion request; the JSON-able result the controller judges."""
    if endpoint == "/v1/completions":
        # ignore_eos is an SGLang extension of the OpenAI request: generate exactly
        # max_tokens so the speed figure always covers the same amount of decoding.
        payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                   "temperature": 0, "ignore_eos": True}
    else:
        payload = {"text": prompt, "sampling_params": {
            "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    headers = {"Content-Type": "application/json"}
    key = api_key_from_config(config)
    if key:
        headers["Authorization"] = "Bearer " + key
    host = server_host(port)  # where the server listens (a private listen_address)
    out = {"endpoint": endpoint, "status": None, "elapsed_s": None, "body": None}
    start = time.monotonic()
    try:
        out["status"], raw = http_request(host, port, endpoint, timeout,
                                          body=json.dumps(payload).encode(), headers=headers)
    except Exception as e:
        raw = b""
        out["error"] = f"{type(e).__name__}: {e}"
    out["elapsed_s"] = time.monotonic() - start
    try:
        out["body"] = json.loads(raw.decode("utf-8", "replace")) if raw else None
    except ValueError:
        out["body"] = raw.decode("utf-8", "replace")[:500]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--unit", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/health")
    p.add_argument("--lines", type=int, default=400)
    p.add_argument("--tail", type=int, default=30)
    p.add_argument("--http-timeout", type=float, default=25.0)
    # Wait on the host for up to this many seconds, returning as soon as /health is 200
    # on an active unit or systemd has seen the start attempt end: the gate then learns
    # of a ready server within half a second instead of at its next poll over SSH.
    p.add_argument("--wait", type=float, default=0.0)
    # Then one smoke completion, when (and only when) the server is healthy: a second
    # JSON line (sglang_smoke.py's). The health gate asks for it so that a healthy
    # server costs one command and one Python start for both checks.
    p.add_argument("--smoke-model", default="")
    p.add_argument("--smoke-max-tokens", type=int, default=64)
    p.add_argument("--smoke-config", default="")
    # ... unless the unit's start (its InvocationID) is this one: the controller's newest
    # smoke record measured it, and /health has just generated a token (SGLang's health
    # handler does), so the server is proven to serve; a second line says so instead
    p.add_argument("--smoke-unless-start", default="")
    args = p.parse_args()
    deadline = time.monotonic() + max(0.0, args.wait)
    # the first request gets the whole --http-timeout (a loaded server's /health runs a
    # generation and may take seconds); later ones in a wait at most 5 s, so that the
    # wait still ends in time (a server that is not up yet refuses at once anyway)
    http_timeout = args.http_timeout
    first_restarts = None
    # --port 0: a node that serves no HTTP (a multi-node launch's rank > 0); its unit
    # running is all it can show, the group's health is node 0's /health
    serves_http = args.port != 0
    status = error = None
    while True:
        if serves_http:
            status, error = http_status(args.port, args.path, http_timeout)
            http_timeout = min(args.http_timeout, 5.0)
        unit = unit_state(args.unit)
        if first_restarts is None:
            first_restarts = unit.get("NRestarts", "")
        running = unit.get("ActiveState") == "active"
        healthy = running and (status == 200 if serves_http else
                               unit.get("SubState") == "running")
        if healthy or ended(unit, first_restarts) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    args.invocation = unit.get("InvocationID", "")
    if healthy:
        # healthy: the controller judges on these two alone (measure/health.decide), and
        # two journalctl runs cost more than the rest of the probe
        lines, tail = [], []
    else:
        lines, tail = journal(args)
    # first_restarts: NRestarts when this probe began, so that a waiting probe that saw
    # systemd restart the server still tells the controller it happened
    print(json.dumps({"health": status, "health_error": error, "http": serves_http,
                      "unit": unit, "first_restarts": first_restarts,
                      "lines": lines, "tail": tail,
                      "last_exit": last_exit(args.unit, unit.get("NRestarts", ""))}),
          flush=True)
    if healthy and serves_http and args.smoke_model:
        if args.invocation and args.smoke_unless_start == args.invocation:
            print(json.dumps({"same_start": args.invocation}))
            return
        try:
            smoke = complete(args.port, args.smoke_model, args.smoke_max_tokens,
                             args.smoke_config)
        except Exception as e:  # the smoke check reports it; the gate has passed
            smoke = {"endpoint": "/v1/completions", "status": None, "elapsed_s": 0.0,
                     "body": None, "error": f"{type(e).__name__}: {e}"}
        smoke["start"] = args.invocation  # which start of the unit this measured
        print(json.dumps(smoke))


if __name__ == "__main__":
    main()
