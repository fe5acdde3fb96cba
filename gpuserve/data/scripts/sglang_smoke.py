#!/usr/bin/env python3
"""One smoke completion against a local SGLang server, run on the host by roles/checks.

Stdlib only (Python >= 3.8). The API key, when the server has one, is read here from the
server's own --config YAML (mode 0600), so it never appears on a command line, in the
deploy output or on the controller. Prints one JSON line:
{"endpoint", "status", "elapsed_s", "body"} and always exits 0; the controller judges it
(gpuserve/measure/smoke.py).
"""

import argparse
import json
import time

from sglang_probe import http_request, server_host  # uploaded beside this script


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
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--endpoint", default="/v1/completions",
                   choices=["/v1/completions", "/generate"])
    p.add_argument("--config", default="")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    print(json.dumps(complete(args.port, args.model, args.max_tokens, args.config,
                              args.prompt, args.endpoint, args.timeout)))


if __name__ == "__main__":
    main()
