"""The serve deploy reads the checkpoint scan in its first batch (deploy/serve.py
host_reads, roles/service/serve_plan.checkpoint_path): the path is known from the
profile before any host read, and inside the batch the scan's heredoc must give exactly
what the fact's own command gives."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuserve.facts.host import CHECKPOINT_SCAN_CACHE, ModelCheckpoint
from roles.managed import PathState
from roles.prefetch import Read, _command_text, batch_script, split_output
from roles.service.serve_plan import checkpoint_path
from tests.checkpoints import compose_record

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("data", "want"), [
    ({"profile": "glm5-nvfp4-tp8"}, "/models/GLM-5-NVFP4"),
    ({"profile": "glm5-nvfp4-tp8", "preflight": "warn"}, "/models/GLM-5-NVFP4"),
    ({"profile": "glm5-nvfp4-tp8", "preflight": "off"}, None),     # nothing will scan it
    ({"profile": "deepseek-v3-fp8-h200-tp8"}, None),                # a hub id
    ({}, None),                                                     # plan_serve says why
    ({"profile": "../../etc/passwd"}, None),
    ({"profile": "no-such-profile"}, None),
    ({"profile": "glm5-nvfp4-tp8", "preflight": "maybe"}, None),
])
def test_checkpoint_path(data, want) -> None:
    assert checkpoint_path(data, "inventory/gpu.py") == want


def test_scan_in_a_batch_gives_the_facts_own_output(tmp_path) -> None:
    ckpt = compose_record("qwen3-30b-a3b", tmp_path / "Qwen3-30B-A3B", shards=2)

    class Scan(ModelCheckpoint):  # the real command, its cache moved under tmp_path
        def command(self, path: str) -> str:
            return super().command(path).replace(CHECKPOINT_SCAN_CACHE, str(tmp_path / "c"))

    def sh(script: str) -> list[str]:
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                              timeout=60).stdout.splitlines()

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
