#!/usr/bin/env python3
"""Wait until a local SGLang server has no request in flight, run on the host by a
rolling switch (roles/router/rolling.py) after the gateway stopped sending it new ones.

Why: smg drains a worker that leaves its discovery file by sending it no new requests,
but removes it from its registry after ``drain_settle_secs`` (5 s) whether or not its
streams have ended (fleet.md section 6), and a restart cuts every stream still running.
So the engine itself is asked: ``GET /v1/loads`` (SGLang's per-rank load report, the
one smg polls: ``{"loads": [{"num_running_reqs", "num_waiting_reqs", ...}]}``), else
``GET /metrics`` (``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``, only with
``--enable-metrics``). Stdlib only; the API key, when the server has one, comes from its
``--config`` file as in sglang_smoke.py. Always exits 0 and prints one JSON line:
``{"idle": bool, "in_flight": n|null, "source": path|null, "waited": s, "error": str|null}``
(``idle`` false with ``source`` null: the server reports no load at all; the controller
then waits its fixed grace instead).
"""

import argparse
import json
import re
import time

from sglang_probe import (  # uploaded beside this script
    api_key_from_config,
    http_request,
    server_host,
)

_METRIC = re.compile(r"^sglang:(num_running_reqs|num_queue_reqs)\{[^}]*\}\s+([0-9.eE+-]+)\s*$")


def in_flight_from_loads(body):
    """Requests running or waiting over every rank of a ``/v1/loads`` answer."""
    doc = json.loads(body)
    loads = doc.get("loads") if isinstance(doc, dict) else None
    if not isinstance(loads, list):
        raise ValueError("no loads list")
    total = 0
    for rank in loads:
        for key in ("num_running_reqs", "num_waiting_reqs"):
            value = rank.get(key, 0) if isinstance(rank, dict) else None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{key} is not a count")
            total += value
    return total


def in_flight_from_metrics(body):
    """Requests running or queued from SGLang's Prometheus text (every label set)."""
    total, seen = 0.0, False
    for line in body.decode("utf-8", "replace").splitlines():
        match = _METRIC.match(line.strip())
        if match:
            total += float(match.group(2))
            seen = True
    if not seen:
        raise ValueError("no sglang:num_running_reqs in /metrics")
    return int(total)


def probe(port, key, timeout):
    """(in flight, source) from the first endpoint that answers; (None, None) if none."""
    headers = {"Authorization": "Bearer " + key} if key else {}
    host = server_host(port)
    for path, parse in (("/v1/loads", in_flight_from_loads),
                        ("/metrics", in_flight_from_metrics)):
        try:
            status, body = http_request(host, port, path, timeout, headers=headers)
            if status == 200:
                return parse(body), path
        except (OSError, ValueError):
            continue
    return None, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--config", default="")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for idle")
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args()
    key = api_key_from_config(args.config)
    start = time.monotonic()
    out = {"idle": False, "in_flight": None, "source": None, "error": None}
    while True:
        count, source = probe(args.port, key, 5.0)
        out.update(in_flight=count, source=source)
        if source is None:
            out["error"] = "neither GET /v1/loads nor GET /metrics reports the load"
            break
        if count == 0:
            out["idle"] = True
            break
        if time.monotonic() - start >= args.timeout:
            out["error"] = f"{count} request(s) still in flight after {args.timeout:.0f} s"
            break
        time.sleep(args.interval)
    out["waited"] = round(time.monotonic() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
