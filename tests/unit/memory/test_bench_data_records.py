"""bench/data/throughput.jsonl: every measurement names a shipped model record and GPU."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuserve.host.gpus import get_gpu
from gpuserve.memory.models import load_record

DATA = Path(__file__).resolve().parents[3] / "bench" / "data"
KEYS = {"id", "pair", "baseline", "model", "gpu", "num_gpus", "nodes", "nvlink", "p2p",
        "virtualized", "tp", "ep", "attn_dp", "moe_a2a_backend", "kv_cache_dtype",
        "speculative", "concurrency", "input_len", "output_len", "decode_only", "measured",
        "source"}


def _rows() -> list[dict]:
    lines = (DATA / "throughput.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_rows_follow_the_schema_and_baselines_stay_in_their_pair():
    rows = _rows()
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == len(rows), "ids must be unique"
    for r in rows:
        assert set(r) == KEYS, r["id"]
        assert r["measured"]["output_tps"] > 0 and r["measured"]["per_user_tps"] > 0, r["id"]
        assert r["source"].startswith(("http", "/work/shared/field-notes")), r["id"]
        base = r["baseline"]
        if base is not None:
            assert by_id[base]["pair"] == r["pair"] and by_id[base]["baseline"] != r["id"]
        spec = r["speculative"]
        assert spec is None or set(spec) == {"algorithm", "num_steps", "eagle_topk",
                                             "num_draft_tokens"}
    assert all(any(r["baseline"] is None and r["pair"] == p for r in rows)
               for p in {r["pair"] for r in rows})


def test_every_model_and_gpu_of_the_rows_has_a_shipped_record():
    mapping = yaml.safe_load((DATA / "models.yaml").read_text())["models"]
    for r in _rows():
        arch = load_record(mapping[r["model"]])
        assert arch.num_layers > 0
        assert get_gpu(r["gpu"]).name == r["gpu"], r["id"]  # the nvidia-smi name itself
