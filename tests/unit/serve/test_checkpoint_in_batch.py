"""The serve deploy reads the checkpoint scan in its first batch (roles/deploys/serve.py
host_reads, gpuserve/plans/serve.checkpoint_path): the path is known from the
profile before any host read, and inside the batch the scan's heredoc must give exactly
what the fact's own command gives."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.facts.host import CHECKPOINT_JSON_FILES, CHECKPOINT_SCAN_CACHE, ModelCheckpoint
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.plans.serve import read_input
from gpuserve.roles.base.managed import PathState
from gpuserve.roles.base.prefetch import Read, _command_text, batch_script, split_output
from tests import bounded
from tests.checkpoints import compose_record

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("data", "want"), [
    ({"profile": "glm5-nvfp4-tp8"}, "/models/GLM-5-NVFP4"),
    ({"profile": "glm5-nvfp4-tp8", "preflight": "warn"}, "/models/GLM-5-NVFP4"),
    ({"profile": "glm5-nvfp4-tp8", "preflight": "off"}, None),     # nothing will scan it
    # a pinned Hub source: its revision directory under the default models_dir
    ({"profile": "deepseek-v3-fp8-h200-tp8"}, "/opt/gpuserve/models/deepseek-ai--DeepSeek-V3/"
     "e815299b0bcbac849fa540c768ef21845365c9eb"),
])
def test_checkpoint_path(data, want) -> None:
    assert read_input(data, "inventory/gpu.py").checkpoint_path == want


@pytest.mark.parametrize("data", [{}, {"profile": "../../etc/passwd"},
                                  {"profile": "no-such-profile"},
                                  {"profile": "glm5-nvfp4-tp8", "preflight": "maybe"}])
def test_bad_input_is_refused_before_the_batch(data) -> None:
    with pytest.raises(InputError):
        read_input(data, "inventory/gpu.py")


@pytest.mark.parametrize(("path", "said"), [
    ("deepseek-ai/DeepSeek-V3", "is a Hub id"), ("./models/GLM-5", "is not an absolute path")])
def test_a_model_path_the_offline_server_cannot_load_is_refused(tmp_path, path, said) -> None:
    profile = tmp_path / "mine.yaml"
    profile.write_text(f"extends: {REPO}/profiles/glm5-nvfp4-tp8.yaml\nmodel:\n"
                       f"  path: {path}\n")
    with pytest.raises(InputError) as e:
        read_input({"profile": str(profile)}, "inventory/gpu.py")
    text = str(e.value)
    assert text.startswith(f"{profile}:3: model.path: ") and said in text
    assert "HF_HUB_OFFLINE=1" in text and "model.hf:" in text and "absolute path" in text


def test_scan_in_a_batch_gives_the_facts_own_output(tmp_path) -> None:
    ckpt = compose_record("qwen3-30b-a3b", tmp_path / "Qwen3-30B-A3B", shards=2)

    class Scan(ModelCheckpoint):  # the real command, its cache moved under tmp_path
        def command(self, path: str) -> str:
            return super().command(path).replace(CHECKPOINT_SCAN_CACHE, str(tmp_path / "c"))

    def sh(script: str) -> list[str]:
        return bounded.run(["sh", "-c", script], capture_output=True, text=True).stdout.splitlines()

    alone = json.loads("\n".join(sh(_command_text(Scan().command(str(ckpt))))))
    reads = [Read.of(PathState, path=str(tmp_path)), Read.of(Scan, path=str(ckpt)),
             Read.of(PathState, path=str(ckpt))]
    results = split_output(sh(batch_script(reads, "##m##")), "##m##", len(reads))
    assert [r[0] for r in results] == [0, 0, 0]
    batched = json.loads(Scan().process(results[1][1]))
    assert (alone["cache"], batched["cache"]) == ("miss", "hit")
    assert {k: v for k, v in batched.items() if k != "cache"} == \
        {k: v for k, v in alone.items() if k != "cache"}
    assert PathState().process(results[2][1]).kind == "dir"  # the batch went on after it


def scan_runner(directory: Path, tmp_path: Path):
    """Run the fact's real command for ``directory`` (cache under ``tmp_path``); with
    ``no_python=True``, ``python3`` is a stub that only says it was started."""
    command = ModelCheckpoint().command(str(directory)).replace(CHECKPOINT_SCAN_CACHE,
                                                                str(tmp_path / "c"))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text("#!/bin/sh\necho python3-started\n")
    (stub / "python3").chmod(0o755)

    def sh(no_python: bool = False) -> str:
        script = (f"PATH={stub}:$PATH\n" if no_python else "") + command
        return bounded.run(["sh", "-c", script], capture_output=True, text=True).stdout
    return sh


def test_a_rerun_prints_the_kept_scan_without_starting_python(tmp_path) -> None:
    """The shell compares the files' stat with the stamp of the last clean
    scan and prints its output; Python runs again only when a file changed."""
    ckpt = compose_record("qwen3-30b-a3b", tmp_path / "Qwen3-30B-A3B", shards=2)
    sh = scan_runner(ckpt, tmp_path)

    first = json.loads(sh())
    assert first["cache"] == "miss" and not first["errors"]
    kept = json.loads(sh(no_python=True))
    assert kept == {**first, "cache": "hit"}
    assert oct((tmp_path / "c").stat().st_mode & 0o777) == "0o700"
    assert {oct(f.stat().st_mode & 0o777) for f in (tmp_path / "c").iterdir()} == {"0o600"}

    shard = sorted(ckpt.glob("*.safetensors"))[0]
    os.utime(shard, ns=(shard.stat().st_mtime_ns + 10**9,) * 2)  # a changed file
    assert sh(no_python=True).strip() == "python3-started"
    assert json.loads(sh())["cache"] == "miss"  # the script's own cache key changed too
    assert json.loads(sh(no_python=True))["cache"] == "hit"


def test_the_fact_stats_the_files_the_scan_reads() -> None:
    sys.path.insert(0, str(SCRIPTS_DIR))
    import checkpoint_scan

    assert CHECKPOINT_JSON_FILES == checkpoint_scan._READ_JSON


def test_a_shard_behind_a_link_replaced_scans_again(tmp_path) -> None:
    """Review: the scan follows links (os.stat), so the stamp must too: a shard whose
    link target was replaced (a shared store synced anew) is not the kept scan's."""
    ckpt = compose_record("qwen3-30b-a3b", tmp_path / "store", shards=2)
    linked = tmp_path / "linked"
    linked.mkdir()
    for f in ckpt.iterdir():
        (linked / f.name).symlink_to(f)
    sh = scan_runner(linked, tmp_path)

    assert json.loads(sh())["cache"] == "miss"
    assert json.loads(sh(no_python=True))["cache"] == "hit"
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    size = shard.stat().st_size
    with open(shard, "rb") as f:  # sparse and full size: copy the header only
        head = f.read(8)
        head += f.read(int.from_bytes(head, "little"))
    replaced = shard.with_suffix(".new")
    with open(replaced, "wb") as f:
        f.write(head)
        f.truncate(size)
    replaced.replace(shard)  # a new file (new inode) behind the same link
    assert sh(no_python=True).strip() == "python3-started"
