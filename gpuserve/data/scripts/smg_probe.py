"""Wait for SGLang's gateway (smg) on this host and report its workers, as one JSON line.

    python3 smg_probe.py --port 30080 --key-file /etc/gpuserve-router/api-key \
        --live-timeout 60 --ready-timeout 60 [--expect N]

Run by the router deploy (roles/router) as root over SSH, standard library only. Polls
``GET /liveness`` (public) until it answers 200, then ``GET /workers`` (with the key
from ``--key-file``, sent as a Bearer token, never printed) until ``N`` workers are
``ready`` or ``--ready-timeout`` passes; with ``--url U --until gone|ready`` (a rolling
switch, roles/router/rolling.py) until worker ``U`` has left the list or is ``ready``
in it, and ``reached`` says whether it happened. Prints
``{"live": bool, "waited": s, "workers": [{"url", "status", "is_healthy"}], "error": ...}``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time


def get(port: int, path: str, key: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def workers(port: int, key: str) -> list[dict]:
    status, body = get(port, "/workers", key)
    if status != 200:
        raise OSError(f"GET /workers: HTTP {status}")
    return [{"url": w.get("url"), "status": w.get("status"), "is_healthy": w.get("is_healthy")}
            for w in json.loads(body).get("workers", [])]


def reached(listed: list[dict], url: str, until: str) -> bool:
    """Whether worker ``url`` has left the gateway (``gone``) or is ``ready`` in it."""
    url = url.rstrip("/")
    mine = [w for w in listed if str(w.get("url") or "").rstrip("/") == url]
    if until == "gone":
        return not mine
    return any(w.get("status") == "ready" and w.get("is_healthy") is not False for w in mine)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--live-timeout", type=float, default=60)
    ap.add_argument("--ready-timeout", type=float, default=60)
    ap.add_argument("--expect", type=int, default=0, help="workers that should be ready")
    ap.add_argument("--url", help="one worker to wait for (with --until)")
    ap.add_argument("--until", choices=("gone", "ready"), default="ready")
    a = ap.parse_args()
    with open(a.key_file) as f:
        key = f.read().strip()
    start = time.monotonic()
    result: dict = {"live": False, "workers": [], "error": None}
    while True:
        try:
            if get(a.port, "/liveness")[0] == 200:
                result["live"] = True
                break
        except OSError as exc:
            result["error"] = f"GET /liveness: {exc}"
        if time.monotonic() - start > a.live_timeout:
            break
        time.sleep(0.5)
    if result["live"]:
        result["error"] = None
        deadline = time.monotonic() + a.ready_timeout
        while True:
            try:
                result["workers"] = workers(a.port, key)
                result["error"] = None
            except (OSError, ValueError) as exc:
                result["error"] = str(exc)
            ready = sum(w["status"] == "ready" for w in result["workers"])
            if a.url:
                result["reached"] = result["error"] is None and reached(
                    result["workers"], a.url, a.until)
                done = result["reached"]
            else:
                done = (result["error"] is None and ready >= a.expect
                        and len(result["workers"]) == a.expect)
            if done or time.monotonic() > deadline:
                break
            time.sleep(1)
    result["waited"] = round(time.monotonic() - start, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
