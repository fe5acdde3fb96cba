"""The host script's offline parts (gpuserve/data/scripts/weights_fetch.py): the hashes
it verifies with (git's own blob id, checked against ``git hash-object``), sealing a
verified directory under its final name, the state fact's document, and a damaged
directory going back to staging."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuserve.commands.weights import fetch_module

wf = fetch_module()


def _entry(path, name):
    data = (path / name).read_bytes()
    return {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()
            if name.endswith(".safetensors") else None,
            "git_sha1": wf.git_sha1(str(path / name))}


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_sha1_is_gits_blob_id(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"a": 1}\n')
    out = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert wf.git_sha1(str(f)) == out


def test_verify_finds_a_changed_byte_and_a_missing_file(tmp_path):
    (tmp_path / "config.json").write_text("{}\n")
    (tmp_path / "model.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"{}      ")
    files = [_entry(tmp_path, "config.json"), _entry(tmp_path, "model.safetensors")]
    assert wf.verify(str(tmp_path), files) == []
    raw = bytearray((tmp_path / "model.safetensors").read_bytes())
    raw[-1] ^= 1
    (tmp_path / "model.safetensors").write_bytes(bytes(raw))  # same size, one bit off
    assert wf.verify(str(tmp_path), files) == ["model.safetensors"]
    wf.forget(str(tmp_path), "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists()
    assert wf.verify(str(tmp_path), files) == ["model.safetensors"]


def test_seal_state_and_reopen(tmp_path):
    models = tmp_path / "models"
    target = models / "org--name" / ("a" * 40)
    staging = str(target) + ".partial"
    os.makedirs(staging)
    (target.parent / "x").write_text("")
    with open(os.path.join(staging, "config.json"), "w") as f:
        f.write("{}\n")
    os.makedirs(os.path.join(staging, ".cache", "huggingface"))
    doc = wf.state(str(target), models_dir=str(models))
    assert doc["complete"] is False and doc["staged_bytes"] == 3
    files = [_entry(Path(staging), "config.json")]
    wf.seal(staging, str(target), {"schema": wf.SCHEMA, "commit": "a" * 40, "files": files})
    assert not os.path.exists(staging) and not (target / ".cache").exists()
    assert oct(os.stat(target / "config.json").st_mode & 0o777) == "0o444"
    doc = wf.state(str(target), models_dir=str(models))
    assert doc["complete"] is True and doc["commit"] == "a" * 40 and doc["free_bytes"] > 0
    # a file whose size no longer matches the marker: not complete; back to staging
    os.chmod(target, 0o755)
    os.chmod(target / "config.json", 0o644)
    (target / "config.json").write_text("{}\n\n")
    assert wf.state(str(target), models_dir=str(models))["complete"] is False
    wf.reopen(str(target), staging)
    assert not target.exists() and os.path.isfile(os.path.join(staging, "config.json"))
    assert wf.verify(staging, files) == ["config.json"]


def test_state_records_the_floating_ref(tmp_path):
    ref = tmp_path / "refs" / "main"
    ref.parent.mkdir()
    ref.write_text("b" * 40 + "\n")
    doc = wf.state(str(tmp_path / ("b" * 40)), str(ref), str(tmp_path))
    assert doc["recorded"] == "b" * 40


def test_status_of_a_run_that_exited_without_a_word(tmp_path, capsys):
    (tmp_path / "rc").write_text("1\n")
    (tmp_path / "run.err").write_text("Traceback ...\nImportError: huggingface_hub\n")
    wf.main(["status", "--run-dir", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "failed" and "ImportError: huggingface_hub" in doc["tail"][-1]


def test_start_attaches_to_a_download_still_running(tmp_path, capsys):
    (tmp_path / "pid").write_text(str(os.getpid()))  # alive, and no rc yet
    wf.main(["start", "--run-dir", str(tmp_path), "--user", "root", "--python",
             "/nonexistent/python", "--", "run"])
    assert json.loads(capsys.readouterr().out) == {"started": False, "pid": os.getpid()}
    (tmp_path / "rc").write_text("0\n")
    assert wf._running(str(tmp_path)) is None
