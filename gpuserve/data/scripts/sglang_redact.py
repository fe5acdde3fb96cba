#!/usr/bin/env python3
"""Run the SGLang server with its output redacted: secrets never reach the journal.

Why: SGLang logs its resolved arguments at start-up, ``api_key`` included
(https://github.com/sgl-project/sglang/issues/37457, open; fixes proposed in
https://github.com/sgl-project/sglang/pull/19328 and /pull/39449), so with plain
``--config`` the key would still end up in the journal. The unit runs this wrapper:

    sglang_redact.py SECRETS.yaml -- /opt/gpuserve/venvs/V-HASH/bin/python -m sglang.launch_server

It reads the secret values from the --config file (``api-key``/``admin-api-key``, one
``key: "json string"`` a line, as gpuserve writes it) and ``HF_TOKEN`` from its own
environment, runs the command with stdout and stderr on one pipe, and forwards every
line with each secret replaced by ``<redacted>``. Stdlib only. It ignores SIGTERM and
SIGINT: systemd signals the whole control group, the server shuts down, and the wrapper
forwards the last lines and exits with the server's status.

Code runs only from the venv: the unit sets PYTHONSAFEPATH=1 (this script's directory,
root-owned, is then not on sys.path either) and the wrapper passes it on to the server,
so a module planted in the working directory is never imported (see the unit template).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from typing import AnyStr

SECRET_KEYS = ("api-key", "api_key", "admin-api-key", "admin_api_key")
ENV_SECRETS = ("HF_TOKEN",)


def read_secrets(path):
    found = []
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in SECRET_KEYS:
                    value = value.strip()
                    found.append(json.loads(value) if value.startswith('"') else value)
    except OSError:
        pass
    found += [os.environ[k] for k in ENV_SECRETS if os.environ.get(k)]
    # SGLang logs its arguments with repr() (ServerArgs(...), or a dict), which escapes
    # backslashes, quotes and non-printable characters: redact those spellings too, and
    # the JSON one (redact() hides a secret containing another whole, at any length: a
    # short secret is still a secret; the deploy refuses ones under 16 characters).
    spelled = {v for s in found if s
               for v in (s, repr(s)[1:-1], json.dumps(s)[1:-1])}
    return [v.encode() for v in spelled]


# The redaction rule: a byte-identical copy of gpuserve/redact.py's REDACTED and redact()
# (this script runs without gpuserve; tests/unit/test_redact.py compares the copies).
REDACTED = "<redacted>"


def redact(text: AnyStr, secrets: Iterable[AnyStr | None]) -> AnyStr:
    """``text`` with every occurrence of every secret hidden behind one REDACTED, where
    occurrences that overlap or touch become a single marker: a secret that contains or
    overlaps another leaks no part of either (the longest-first rule, also for overlaps),
    and a marker is never searched again. Any length: a short secret is still a secret;
    an empty value or None is nothing to look for. Text and secrets are both str, or both
    bytes (a server's raw output)."""
    spans = []
    for secret in {s for s in secrets if s}:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    marker = REDACTED if isinstance(text, str) else REDACTED.encode()
    parts, end = [], 0
    for start, stop in sorted(spans):
        if start > end or not parts:
            parts += [text[end:start], marker]
        end = max(end, stop)
    parts.append(text[end:])
    return text[:0].join(parts)


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: sglang_redact.py SECRETS.yaml -- COMMAND ...\n")
        return 2
    secrets = read_secrets(argv[1])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # PYTHONSAFEPATH=1 (Python >= 3.11): the server's `python -m` never imports from the
    # working directory, even when this wrapper is started without the unit's environment
    env = dict(os.environ, PYTHONSAFEPATH="1")
    proc = subprocess.Popen(argv[3:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_default_signals, env=env)
    out = sys.stdout.buffer
    for line in iter(proc.stdout.readline, b""):
        out.write(redact(line, secrets))
        out.flush()
    code = proc.wait()
    return 128 - code if code < 0 else code


def _default_signals():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
