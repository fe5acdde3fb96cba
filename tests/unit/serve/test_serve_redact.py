"""The output redactor the unit runs SGLang under: secrets never reach the journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuserve.redact import REDACTED

SCRIPT = Path(__file__).resolve().parents[3] / "gpuserve" / "data" / "scripts" / \
    "sglang_redact.py"

KEY = "sk-lab-key-never-in-the-journal"
TOKEN = "hf_tokenNeverInTheJournal"


def test_secrets_redacted_and_status_kept(tmp_path: Path) -> None:
    cfg = tmp_path / "sglang-secrets.yaml"
    cfg.write_text(f'# comment\napi-key: "{KEY}"\n')
    # what SGLang 0.5.x prints at start-up (sglang issue #37457), on stdout and stderr
    child = (
        "import sys; print(\"[2026-11-29 10:00:00] server_args=ServerArgs(model_path='m', "
        f"api_key='{KEY}', port=30000)\"); "
        f"print('token {TOKEN} here', file=sys.stderr); print('ready'); sys.exit(3)"
    )
    env = dict(os.environ, HF_TOKEN=TOKEN)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(cfg), "--", sys.executable, "-c",
                           child], capture_output=True, env=env, timeout=60)
    out = proc.stdout.decode()
    assert proc.returncode == 3
    assert KEY not in out and TOKEN not in out
    assert f"api_key='{REDACTED}'" in out and f"token {REDACTED} here" in out
    assert out.rstrip().endswith("ready")


def test_escaped_spellings_of_a_secret_are_redacted(tmp_path: Path) -> None:
    # SGLang prints server_args with repr(): a backslash or quote in the key is escaped
    key = "sk-back\\slash'and\"quote"
    cfg = tmp_path / "sglang-secrets.yaml"
    cfg.write_text(f"api-key: {json.dumps(key)}\n")
    child = f"print('server_args=' + repr({{'api_key': {key!r}}}))"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(cfg), "--", sys.executable, "-c",
                           child], capture_output=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})
    out = proc.stdout.decode()
    assert proc.returncode == 0 and out.startswith("server_args={'api_key': ")
    assert "back" not in out and "quote" not in out, out
    assert REDACTED in out


def test_a_secret_containing_another_leaks_no_tail(tmp_path: Path) -> None:
    # the token is the key's head: replaced in the order given, the key's tail would show
    key, token = "abcdef123", "abc"
    cfg = tmp_path / "sglang-secrets.yaml"
    cfg.write_text(f'api-key: "{key}"\n')
    child = f"print('api_key={key} hf={token}')"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(cfg), "--", sys.executable, "-c",
                           child], capture_output=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "HF_TOKEN": token})
    assert proc.stdout.decode() == f"api_key={REDACTED} hf={REDACTED}\n"


def test_missing_secrets_file_still_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.yaml"), "--",
                           sys.executable, "-c", "print('hello')"],
                          capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0 and proc.stdout.decode() == "hello\n"


def test_usage_error() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "x.yaml"], capture_output=True,
                          timeout=60)
    assert proc.returncode == 2
