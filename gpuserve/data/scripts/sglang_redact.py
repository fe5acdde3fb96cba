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
line with each secret replaced by ``[REDACTED]``. Stdlib only. It ignores SIGTERM and
SIGINT: systemd signals the whole control group, the server shuts down, and the wrapper
forwards the last lines and exits with the server's status.

Code runs only from the venv: the unit sets PYTHONSAFEPATH=1 (this script's directory,
root-owned, is then not on sys.path either) and the wrapper passes it on to the server,
so a module planted in the working directory is never imported (see the unit template).
"""

import json
import os
import signal
import subprocess
import sys

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
    # the JSON one. Longest first, so a secret containing another is replaced whole. Any
    # length: a short secret is still a secret (the deploy refuses ones under 16
    # characters); only an empty value is nothing to look for.
    spelled = {v for s in found if s
               for v in (s, repr(s)[1:-1], json.dumps(s)[1:-1])}
    return sorted({v.encode() for v in spelled}, key=len, reverse=True)


def redact(line, secrets):
    for secret in secrets:
        line = line.replace(secret, b"[REDACTED]")
    return line


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
