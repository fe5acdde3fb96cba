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

from sglang_probe import complete  # uploaded beside this script


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
