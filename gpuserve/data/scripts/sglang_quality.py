#!/usr/bin/env python3
"""The quality check's requests to a local SGLang server, run on the host by
roles/checks/quality.py. Transport only: the controller judges (gpuserve/quality/).

Stdlib only (Python >= 3.8). Reads the request spec from --spec (base64 of zlib JSON:
prompts, top_k, timeout_s). The prompts go in batches: one POST /generate carries up to
BATCH prompts (and at most MAX_BODY bytes) as SGLang's batch form of GenerateReqInput
(lists of ``text`` or ``input_ids``, one ``sampling_params`` and ``logprob_start_len``
per prompt; python/sglang/srt/managers/io_struct.py ``_normalize_batch_inputs``), which
the server answers with a JSON list in the same order (tokenizer_manager.py
``_handle_batch_request``) and prefills as one batch. Per batch: the greedy pass with
return_logprob (logprob_start_len 0 for a completion prompt, whose prompt token ids the
forced pass needs, -1 otherwise); then for its completion prompts the teacher-forced
pass: input_ids = prompt ids + forced ids (the reference's, or its own reply),
logprob_start_len = prompt length - 1, top_logprobs_num, max_new_tokens 1. Batches run
PARALLEL at a time under one deadline; each reply is capped (MAX_REPLY per prompt,
MAX_BATCH_REPLY in all), must be a list of one answer per prompt, and is reduced to the
fields the parser reads. Prints one JSON document {"elapsed_s", "error", "requests",
"results": [...]} (one result per prompt) and exits 0.
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
MAX_BATCH_REPLY = 32 * 1024 * 1024
BATCH = 32
MAX_BODY = 1024 * 1024
PARALLEL = 4
KEEP_TOP = ("text", "output_ids")
KEEP_META = ("finish_reason", "prompt_tokens", "completion_tokens", "output_token_logprobs",
             "output_top_logprobs", "input_token_logprobs", "input_top_logprobs",
             "spec_verify_ct", "spec_accept_length")


def post(host, port, path, payload, headers, deadline, max_reply=MAX_REPLY):
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
            if size > max_reply:
                raise ValueError(f"reply larger than {max_reply} bytes")
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
    return int(status_line[1]), [reduce(d) for d in doc] if isinstance(doc, list) else reduce(doc)


def reduce(doc):
    """Only the reply fields the controller reads (keeps the output small)."""
    if not isinstance(doc, dict):
        return doc
    out = {k: doc[k] for k in KEEP_TOP if k in doc}
    meta = doc.get("meta_info")
    out["meta_info"] = ({k: meta[k] for k in KEEP_META if k in meta}
                        if isinstance(meta, dict) else meta)
    return out


def split(entries, size_of, limit=BATCH, max_body=MAX_BODY):
    """``entries`` in order, cut into lists of at most ``limit`` entries and (but for a
    single entry) at most ``max_body`` bytes by ``size_of``."""
    out, cur, size = [], [], 0
    for e in entries:
        n = size_of(e)
        if cur and (len(cur) >= limit or size + n > max_body):
            out.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += n
    return out + [cur] if cur else out


def batch_post(payload, n, ctx):
    """One batch request of ``n`` prompts -> one (status, body) or error per prompt, in
    order; anything but a list of ``n`` answers is an error for each of them."""
    try:
        status, doc = post(ctx["host"], ctx["port"], "/generate", payload, ctx["headers"],
                           ctx["deadline"], min(MAX_REPLY * n, MAX_BATCH_REPLY))
    except Exception as e:  # refused, cut, timed out, too big: the controller names it
        return [{"error": f"{type(e).__name__}: {e}"}] * n
    finally:
        with ctx["lock"]:
            ctx["requests"] += 1
    if status != 200:
        return [{"status": status, "body": doc}] * n
    if not isinstance(doc, list) or len(doc) != n:
        shape = f"a list of {len(doc)}" if isinstance(doc, list) else type(doc).__name__
        return [{"error": f"batch reply is {shape}, not a list of {n} answers: "
                          f"{str(doc)[:200]}"}] * n
    return [{"status": status, "body": d} for d in doc]


def greedy(batch, ctx):
    """The greedy pass of a batch of prompts: one result per prompt."""
    sps = []
    for item in batch:
        sp = {"max_new_tokens": item["max_new"], "temperature": 0}
        if item.get("stop"):
            sp["stop"] = item["stop"]
        sps.append(sp)
    payload = {"text": [item["text"] for item in batch], "sampling_params": sps,
               "return_logprob": True,
               "logprob_start_len": [0 if item.get("teacher") else -1 for item in batch]}
    answers = batch_post(payload, len(batch), ctx)
    return [dict(answers[i], id=item["id"]) for i, item in enumerate(batch)]


def forced_input(item, out):
    """(input_ids, forced count) of a completion prompt's teacher-forced pass, or an
    error text."""
    body = out.get("body") if isinstance(out.get("body"), dict) else {}
    meta = body.get("meta_info") if isinstance(body.get("meta_info"), dict) else {}
    prompt_ids = [t[1] for t in meta.get("input_token_logprobs") or []
                  if isinstance(t, list) and len(t) > 1]
    ids = item.get("forced")
    if ids is None:
        ids = body.get("output_ids") or []
    if not prompt_ids or not ids:
        return "no prompt ids or no continuation to force"
    return prompt_ids + list(ids), len(ids)


def forced(pairs, top_k, ctx):
    """The teacher-forced pass of (item, greedy result) pairs, in batches; sets each
    result's ``forced``."""
    todo = []
    for item, out in pairs:
        got = forced_input(item, out)
        if isinstance(got, str):
            out["forced"] = {"error": got}
        else:
            todo.append((out, got))
    for part in split(todo, lambda e: 8 * len(e[1][0]) + 64):
        payload = {"input_ids": [ids for _, (ids, _) in part], "return_logprob": True,
                   "logprob_start_len": [len(ids) - count - 1 for _, (ids, count) in part],
                   "top_logprobs_num": top_k,
                   "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        answers = batch_post(payload, len(part), ctx)
        for i, (out, (_, count)) in enumerate(part):
            answer = answers[i]
            out["forced"] = dict(answer, count=count) if "error" not in answer else answer


def run_batch(batch, top_k, ctx):
    """Greedy, then teacher-forced for the batch's completion prompts."""
    results = greedy(batch, ctx)
    forced([(item, results[i]) for i, item in enumerate(batch)
            if item.get("teacher") and results[i].get("status") == 200], top_k, ctx)
    return results


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
    lock = threading.Lock()
    ctx = {"host": server_host(args.port), "port": args.port, "headers": headers,
           "deadline": start + float(spec.get("timeout_s", 120)), "lock": lock,
           "requests": 0}
    batches = split(list(spec.get("prompts") or []), lambda i: 2 * len(i["text"]) + 256)
    results, top_k = [], int(spec.get("top_k", 20))

    def worker():
        while True:
            with lock:
                if not batches:
                    return
                batch = batches.pop(0)
            done = run_batch(batch, top_k, ctx)
            with lock:
                results.extend(done)

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(PARALLEL, len(batches)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(ctx["deadline"] - time.monotonic(), 0) + 5)
    with lock:
        done, requests = list(results), ctx["requests"]
    print(json.dumps({"elapsed_s": round(time.monotonic() - start, 3), "error": None,
                      "requests": requests, "results": done}))


if __name__ == "__main__":
    main()
