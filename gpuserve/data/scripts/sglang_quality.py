#!/usr/bin/env python3
"""The quality check's requests to a local SGLang server, run on the host by
roles/checks/quality.py. Transport only: the controller judges (gpuserve/quality/).

Stdlib only (Python >= 3.8). Reads the request spec from --spec (base64 of zlib JSON:
prompts, top_k, timeout_s). Per prompt: one greedy POST /generate with return_logprob
(and logprob_start_len 0 for a completion prompt, whose prompt token ids the forced pass
needs); for a completion prompt then one teacher-forced POST /generate with input_ids =
prompt ids + forced ids (the reference's, or its own reply), logprob_start_len = prompt
length - 1, top_logprobs_num, max_new_tokens 1. Requests run 16 at a time under one
deadline; each reply is capped at 4 MiB and reduced to the fields the parser reads.
Prints one JSON document {"elapsed_s", "error", "results": [...]} and exits 0.
"""

import argparse
import base64
import json
import socket
import threading
import time
import zlib

from sglang_probe import _dechunk, api_key_from_config, server_host  # uploaded beside

MAX_REPLY = 4 * 1024 * 1024
PARALLEL = 16
KEEP_TOP = ("text", "output_ids")
KEEP_META = ("finish_reason", "prompt_tokens", "completion_tokens", "output_token_logprobs",
             "output_top_logprobs", "input_token_logprobs", "input_top_logprobs",
             "spec_verify_ct", "spec_accept_length")


def post(host, port, path, payload, headers, deadline):
    """(status, parsed JSON or the text's first 300 chars) of one bounded POST."""
    body = json.dumps(payload).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
            "Accept-Encoding: identity", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    chunks, size = [], 0
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the check's time ran out")
    with socket.create_connection((host.strip("[]"), port), timeout=left) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete reply before the check's deadline")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_REPLY:
                raise ValueError(f"reply larger than {MAX_REPLY} bytes")
            chunks.append(chunk)
    header, sep, rest = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = header.decode("latin-1").split("\r\n")[0].split(" ", 2)
    if not sep or len(status_line) < 2 or not status_line[1].isdigit():
        raise ValueError(f"not an HTTP response: {header[:80]!r}")
    if b"chunked" in header.lower():
        rest = _dechunk(rest)
    try:
        doc = json.loads(rest.decode("utf-8", "replace"))
    except ValueError:
        return int(status_line[1]), rest.decode("utf-8", "replace")[:300]
    return int(status_line[1]), reduce(doc)


def reduce(doc):
    """Only the reply fields the controller reads (keeps the output small)."""
    if not isinstance(doc, dict):
        return doc
    out = {k: doc[k] for k in KEEP_TOP if k in doc}
    meta = doc.get("meta_info")
    out["meta_info"] = ({k: meta[k] for k in KEEP_META if k in meta}
                        if isinstance(meta, dict) else meta)
    return out


def one(item, top_k, ctx):
    """The greedy request and, for a completion prompt, the teacher-forced one."""
    sp = {"max_new_tokens": item["max_new"], "temperature": 0}
    if item.get("stop"):
        sp["stop"] = item["stop"]
    payload = {"text": item["text"], "sampling_params": sp, "return_logprob": True}
    if item.get("teacher"):
        payload["logprob_start_len"] = 0
    out = {"id": item["id"]}
    try:
        out["status"], out["body"] = post(ctx["host"], ctx["port"], "/generate", payload,
                                          ctx["headers"], ctx["deadline"])
        if item.get("teacher") and out["status"] == 200:
            out["forced"] = forced(item, out["body"], top_k, ctx)
    except Exception as e:  # refused, cut, timed out, too big: the controller names it
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def forced(item, body, top_k, ctx):
    meta = body.get("meta_info") if isinstance(body, dict) else None
    prompt_ids = [t[1] for t in (meta or {}).get("input_token_logprobs") or []]
    ids = item.get("forced")
    if ids is None:
        ids = body.get("output_ids") or []
    if not prompt_ids or not ids:
        return {"error": "no prompt ids or no continuation to force"}
    payload = {"input_ids": prompt_ids + list(ids), "return_logprob": True,
               "logprob_start_len": len(prompt_ids) - 1, "top_logprobs_num": top_k,
               "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    try:
        status, reply = post(ctx["host"], ctx["port"], "/generate", payload, ctx["headers"],
                             ctx["deadline"])
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"status": status, "body": reply, "count": len(ids)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--config", default="")
    p.add_argument("--spec", required=True)
    args = p.parse_args()
    start = time.monotonic()
    try:
        spec = json.loads(zlib.decompress(base64.b64decode(args.spec)))
    except Exception as e:
        print(json.dumps({"elapsed_s": 0, "error": f"bad --spec: {e}", "results": []}))
        return
    headers = {"Content-Type": "application/json"}
    key = api_key_from_config(args.config)
    if key:
        headers["Authorization"] = "Bearer " + key
    ctx = {"host": server_host(args.port), "port": args.port, "headers": headers,
           "deadline": start + float(spec.get("timeout_s", 120))}
    items, results, lock = list(spec.get("prompts") or []), [], threading.Lock()

    def worker():
        while True:
            with lock:
                if not items:
                    return
                item = items.pop(0)
            r = one(item, int(spec.get("top_k", 20)), ctx)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(PARALLEL)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(ctx["deadline"] - time.monotonic(), 0) + 5)
    with lock:
        done = list(results)
    print(json.dumps({"elapsed_s": round(time.monotonic() - start, 3), "error": None,
                      "results": done}))


if __name__ == "__main__":
    main()
