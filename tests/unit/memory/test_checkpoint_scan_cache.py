"""checkpoint_scan.py --cache: a rerun whose files did not change reads no header again,
and any change to what the scan reads (a shard rewritten, config.json edited, a new
shard, the script itself) scans again. Runs the host script's real command (the
ModelCheckpoint fact's) in a local shell against a composed real-format checkpoint."""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from gpuserve.facts.host import CHECKPOINT_SCAN_CACHE, ModelCheckpoint
from gpuserve.memory.checkpoint import parse_scan
from tests.checkpoints import compose_record

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def ckpt(tmp_path) -> Path:
    return compose_record("qwen3-30b-a3b", tmp_path / "Qwen3-30B-A3B", shards=3)


def run_fact(directory: Path, cache: Path, script_edit: str = "") -> dict:
    """The fact's command as a host runs it, with the cache directory moved to ``cache``."""
    cmd = ModelCheckpoint().command(str(directory))
    assert f"--cache {CHECKPOINT_SCAN_CACHE} " in cmd
    cmd = cmd.replace(CHECKPOINT_SCAN_CACHE, str(cache))
    if script_edit:  # the controller hashes the script it sends: a new script, a new salt
        salt = re.search(r"--salt (\w+)", cmd).group(1)
        cmd = cmd.replace(salt, f"{script_edit}{salt}")
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return json.loads(out)


def test_unchanged_checkpoint_is_a_hit_with_the_same_document(ckpt, tmp_path):
    cache = tmp_path / "cache"
    first = run_fact(ckpt, cache)
    second = run_fact(ckpt, cache)
    assert (first["cache"], second["cache"]) == ("miss", "hit")
    strip = lambda d: {k: v for k, v in d.items() if k != "cache"}  # noqa: E731
    assert strip(first) == strip(second)
    assert parse_scan(json.dumps(second)).tensor_count == parse_scan(json.dumps(first)).tensor_count
    # root-only: the kept documents describe the host's models
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    # the scan's own cache file, and the output and stamp the fact's shell reads
    kept = sorted(cache.iterdir())
    assert sorted(p.suffix for p in kept) == [".json", ".out", ".stamp"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in kept} == {0o600}


@pytest.mark.parametrize("change", ["shard_same_size_same_mtime", "config", "new_shard",
                                    "script"])
def test_any_change_to_what_the_scan_reads_scans_again(ckpt, tmp_path, change):
    cache = tmp_path / "cache"
    assert run_fact(ckpt, cache)["cache"] == "miss"
    salt = ""
    if change == "shard_same_size_same_mtime":
        shard = sorted(ckpt.glob("*.safetensors"))[0]  # sparse, full size: never read whole
        st = shard.stat()
        with open(shard, "r+b") as f:  # same size, then the old mtime back: ctime moves
            f.seek(st.st_size - 1)
            f.write(b"\x01")
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert shard.stat().st_size == st.st_size
    elif change == "config":
        cfg = ckpt / "config.json"
        cfg.write_text(cfg.read_text().replace('"num_hidden_layers": 48',
                                               '"num_hidden_layers": 47'))
    elif change == "new_shard":
        raw = json.dumps({"extra.bias": {"dtype": "BF16", "shape": [4],
                                         "data_offsets": [0, 8]}}).encode()
        (ckpt / "model-extra.safetensors").write_bytes(
            struct.pack("<Q", len(raw)) + raw + bytes(8))
    else:
        salt = "new"
    assert run_fact(ckpt, cache, script_edit=salt)["cache"] == "miss"


def test_failed_scan_is_not_kept(ckpt, tmp_path):
    cache = tmp_path / "cache"
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    with open(shard, "r+b") as f:
        good = f.read(8)
        f.seek(0)
        f.write(struct.pack("<Q", 2**40))  # a header length past the file
    doc = run_fact(ckpt, cache)
    assert doc["errors"] and doc["cache"] == "miss"
    assert not cache.exists() or not any(cache.iterdir())
    with open(shard, "r+b") as f:
        f.write(good)
    assert run_fact(ckpt, cache)["errors"] == []


def test_unwritable_cache_only_costs_the_scan(ckpt, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    doc = run_fact(ckpt, blocker / "cache")
    assert doc["errors"] == [] and doc["cache"] == "miss"
    assert parse_scan(json.dumps(doc)).files
