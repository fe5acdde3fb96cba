"""Weights per GPU from a checkpoint's safetensors headers (checkpoint_scan.py + checkpoint.py).

Checkpoints are composed at test time by tools/compose_checkpoint.py (real names, dtypes,
shapes and data_offsets; sparse data), so the fixtures cost nothing in git.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuserve.errors import InputError
from gpuserve.facts.host import CHECKPOINT_SCAN_CACHE, ModelCheckpoint
from gpuserve.memory.checkpoint import (
    checkpoint_weights,
    classify,
    parse_scan,
    scan_directory,
    unrecognised,
)
from gpuserve.memory.models import MODELS_DIR, load_record
from gpuserve.memory.planner import GIB, Layout, PlanRequest, predict, weights_per_gpu
from gpuserve.paths import SCRIPTS_DIR
from tests import bounded
from tests.checkpoints import compose_record, compose_tool, scan_once

REPO = Path(__file__).resolve().parents[3]


compose = compose_tool()


def _record(name: str) -> tuple[dict, dict | None]:
    data = yaml.safe_load((MODELS_DIR / f"{name}.yaml").read_text())
    return data["config"], data.get("quantization_config")


def _mini_glm5(out: Path, shards: int = 3) -> Path:
    """GLM-5 NVFP4 with 5 decoder layers (3 dense + 2 MoE) and its MTP layer (index 5)."""
    config, quant = _record("glm-5-nvfp4")
    config = {**config, "num_hidden_layers": 5}
    quant = json.loads(json.dumps(quant).replace("model.layers.78*", "model.layers.5*"))
    compose.compose(config, out, quant=quant, shards=shards, source="glm-5-nvfp4 (5 layers)")
    return out


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    return _mini_glm5(tmp_path_factory.mktemp("ckpt") / "glm5-mini")


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def _all_tensors(directory: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        out.update({k: v for k, v in _header(shard).items() if k != "__metadata__"})
    return out


def _bytes(tensors: dict[str, dict], test) -> int:
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in tensors.items() if test(k))


# --------------------------------------------------------------------- composed format


def test_composed_checkpoint_is_real_format_and_sparse(mini):
    index = json.loads((mini / "model.safetensors.index.json").read_text())
    tensors = _all_tensors(mini)
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == _bytes(tensors, lambda k: True)
    assert "tools/compose_checkpoint.py" in (mini / "COMPOSED.md").read_text()
    assert (mini / "hf_quant_config.json").is_file()
    # NVFP4 expert: U8 [out, in/2] + F8_E4M3 scales per 16 + F32 scalars
    p = "model.layers.4.mlp.experts.17.down_proj"
    assert tensors[f"{p}.weight"]["dtype"] == "U8"
    assert tensors[f"{p}.weight"]["shape"] == [6144, 1024]
    assert tensors[f"{p}.weight_scale"] == {**tensors[f"{p}.weight_scale"], "dtype": "F8_E4M3",
                                            "shape": [6144, 128]}
    assert tensors[f"{p}.weight_scale_2"]["shape"] == []
    # excluded modules stay BF16: attention, shared experts, dense layers, the MTP layer
    assert tensors["model.layers.4.self_attn.q_b_proj.weight"]["dtype"] == "BF16"
    assert tensors["model.layers.4.mlp.shared_experts.up_proj.weight"]["dtype"] == "BF16"
    assert tensors["model.layers.5.mlp.experts.0.up_proj.weight"]["dtype"] == "BF16"
    for shard in mini.glob("*.safetensors"):  # holes, not weight bytes
        assert shard.stat().st_blocks * 512 < shard.stat().st_size


# --------------------------------------------------------------------- scan


def test_scan_cli_prints_one_json_document_and_aggregates_experts(mini):
    out = subprocess.run(
        [sys.executable, str(SCRIPTS_DIR / "checkpoint_scan.py"), "--dir", str(mini)],
        capture_output=True, text=True, check=True,
    ).stdout
    assert out.count("\n") == 1
    scan = parse_scan(out, "host:/models/glm5-mini")
    assert scan.tensor_count == len(_all_tensors(mini))
    assert len(scan.files) == 3 and scan.config["num_hidden_layers"] == 5
    row = next(t for t in scan.tensors
               if t.pattern == "model.layers.4.mlp.experts.*.up_proj.weight_scale")
    assert (row.dtype, row.count, row.shape) == ("F8_E4M3", 256, (2048, 384))
    assert row.nbytes == 256 * 2048 * 384
    assert scan.total_bytes == scan.index_total_size


def test_classify_deepseek_qwen_llama_names():
    glm = load_record("glm-5-nvfp4")
    cases = {
        "model.embed_tokens.weight": ("embed", None),
        "model.layers.3.self_attn.q_a_proj.weight": ("attention_replicated", None),
        "model.layers.3.self_attn.kv_b_proj.weight": ("attention", None),
        "model.layers.3.self_attn.indexer.wk.weight": ("indexer", None),
        "model.layers.3.mlp.gate.e_score_correction_bias": ("router", None),
        "model.layers.3.mlp.experts.*.gate_proj.weight_scale": ("routed_experts", None),
        "model.layers.3.mlp.shared_experts.down_proj.weight": ("shared_experts", None),
        "model.layers.1.mlp.down_proj.weight": ("dense_mlp", None),
        "model.layers.78.eh_proj.weight": ("mtp_extra", 78),
        "model.layers.78.shared_head.head.weight": ("mtp_shared", 78),
        "model.layers.78.mlp.experts.*.up_proj.weight": ("routed_experts", 78),
        "model.layers.3.self_attn.rotary_emb.inv_freq": ("other", None),
    }
    for name, want in cases.items():
        assert classify(name, glm) == want, name
    qwen = load_record("qwen3-30b-a3b")
    assert classify("model.layers.0.self_attn.k_proj.weight", qwen) == ("attention_kv", None)
    assert classify("model.layers.0.self_attn.q_norm.weight", qwen) == ("norm", None)
    assert classify("model.layers.0.mlp.gate.weight", qwen) == ("router", None)
    llama = load_record("llama-3.1-70b")
    assert classify("model.layers.0.mlp.up_proj.weight", llama) == ("dense_mlp", None)


# --------------------------------------------------------------------- weights per GPU


def _parts(scan, layout):
    return {p.name: p.gib * GIB for p in checkpoint_weights(scan, layout)}


def test_weights_per_gpu_equal_what_the_tensors_imply(mini):
    scan = scan_directory(mini)
    t = _all_tensors(mini)
    experts = _bytes(t, lambda k: ".experts." in k and "layers.5." not in k)
    shared = _bytes(t, lambda k: ".shared_experts." in k and "layers.5." not in k)
    sharded = _bytes(t, lambda k: any(f".{m}." in k for m in ("q_b_proj", "kv_b_proj", "o_proj"))
                     and "layers.5." not in k)
    replicated = _bytes(t, lambda k: any(f".{m}" in k for m in ("q_a_", "kv_a_"))
                        and "layers.5." not in k)
    embed = _bytes(t, lambda k: k == "model.embed_tokens.weight")

    tp8 = _parts(scan, Layout(tp=8))
    assert tp8["routed experts x2 layers"] == pytest.approx(experts / 8)
    assert tp8["shared experts"] == pytest.approx(shared / 8)
    assert tp8["attention (sharded)"] == pytest.approx(sharded / 8)
    assert tp8["attention (replicated)"] == pytest.approx(replicated)
    assert tp8["embedding"] == pytest.approx(embed / 8)
    assert not any(k.startswith("draft") for k in tp8)  # MTP layer not loaded without NEXTN

    ep8 = _parts(scan, Layout(tp=8, ep=8, moe_a2a_backend="flashinfer"))
    assert ep8["routed experts x2 layers"] == pytest.approx(experts / 8)  # 32 whole experts
    assert ep8["shared experts"] == pytest.approx(shared)  # replicated under a2a

    dp = _parts(scan, Layout(tp=8, attn_dp=8))
    assert dp["attention (sharded)"] == pytest.approx(sharded)  # attn_tp 1
    assert dp["embedding"] == pytest.approx(embed)

    mtp = _parts(scan, Layout(tp=8, speculative="NEXTN"))
    # the MTP layer's own embedding and head copies are replaced by the target's
    layer5 = _bytes(t, lambda k: k.startswith("model.layers.5.")
                    and "embed_tokens" not in k and "shared_head.head" not in k)
    assert 0 < mtp["draft/MTP layers x1"] < layer5


def test_full_size_glm5_checkpoint_agrees_with_the_record():
    """The composed GLM-5 NVFP4 (232,672 tensors) against the glm-5-nvfp4 record: equal
    within 0.01% at TP8 and TP8+EP8. With NEXTN the checkpoint is larger: the export
    keeps the MTP layer (model.layers.78*) BF16, the record sizes it like a target layer."""
    scan = scan_once("glm-5-nvfp4", shards=20)  # composed and scanned once per process
    assert scan.tensor_count == 232672
    rec = load_record("glm-5-nvfp4")
    for layout in (Layout(tp=8), Layout(tp=8, ep=8, moe_a2a_backend="flashinfer")):
        ckpt = sum(p.gib for p in checkpoint_weights(scan, layout))
        record = sum(p.gib for p in weights_per_gpu(rec, layout))
        assert ckpt == pytest.approx(record, rel=1e-4)
    nextn = Layout(tp=8, speculative="NEXTN")
    ckpt = {p.name: p.gib for p in checkpoint_weights(scan, nextn)}
    record = {p.name: p.gib for p in weights_per_gpu(rec, nextn)}
    assert ckpt["draft/MTP layers x1"] == pytest.approx(2.48, abs=0.01)
    assert record["draft/MTP layers x1"] == pytest.approx(0.87, abs=0.01)
    assert unrecognised(scan) == []


def test_plan_from_checkpoint_notes_a_drifted_record(mini):
    scan = scan_directory(mini)
    arch = scan.arch()
    layout = Layout(tp=8)
    plan = predict(
        arch,
        PlanRequest(gpu_memory_mib=97887,
        gpu_count=8,
        layout=layout,
        weight_parts=checkpoint_weights(scan, layout, arch),
        weights_from=f"checkpoint {scan.directory}",
        record=load_record("glm-5-nvfp4")),
    )
    assert plan.weights_from.startswith("checkpoint ")
    note = next(line for line in plan.explanation if line.startswith("model record"))
    assert f"{plan.weights_gib:.2f} GiB/GPU" in note and "glm-5-nvfp4" in note


def test_qwen3_moe_kv_heads_replicate_past_attn_tp(tmp_path):
    config, _ = _record("qwen3-30b-a3b")
    out = tmp_path / "qwen"
    compose.compose({**config, "num_hidden_layers": 2}, out, source="qwen3-30b-a3b")
    t = _all_tensors(out)
    scan = scan_directory(out)
    tp8 = _parts(scan, Layout(tp=8))
    q_o = _bytes(t, lambda k: ".q_proj." in k or ".o_proj." in k)
    k_v = _bytes(t, lambda k: ".k_proj." in k or ".v_proj." in k)
    # 4 KV heads over attn_tp 8: each GPU holds one whole KV head (1/4 of K and V)
    assert tp8["attention (sharded)"] == pytest.approx(q_o / 8 + k_v / 4)
    assert tp8["routed experts x2 layers"] == pytest.approx(
        _bytes(t, lambda k: ".experts." in k) / 8
    )


# --------------------------------------------------------------------- bad checkpoints


def _shard_with(tmp_path: Path, payload: bytes) -> Path:
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_record("qwen3-30b-a3b")[0]))
    (d / "model-00001-of-00001.safetensors").write_bytes(payload)
    return d


def _header_bytes(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (struct.pack("<Q", 4096) + b'{"a": 1}', "larger than the file"),
        (struct.pack("<Q", 200_000_000) + b"{}", "limit"),
        (b"\x05\x00", "shorter than the 8-byte"),
        (struct.pack("<Q", 8) + b"not json", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (_header_bytes({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}),
         "beyond the file"),
        (_header_bytes({"w": {"dtype": "Q3", "shape": [4], "data_offsets": [0, 8]}}) + bytes(8),
         "unknown dtype"),
    ],
)
def test_bad_header_is_an_input_error_naming_the_file(tmp_path, payload, words):
    d = _shard_with(tmp_path, payload)
    with pytest.raises(InputError) as err:
        scan_directory(d)
    assert err.value.file == f"{d}/model-00001-of-00001.safetensors"
    assert words in str(err.value)


def test_truncated_composed_shard_is_named(tmp_path):
    out = _mini_glm5(tmp_path / "ckpt", shards=2)
    shard = sorted(out.glob("*.safetensors"))[1]
    with open(shard, "r+b") as f:
        f.truncate(100)
    with pytest.raises(InputError, match=shard.name):
        scan_directory(out)


def test_directory_without_safetensors_or_missing(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError) as err:
        scan_directory(tmp_path)
    assert err.value.file == str(tmp_path) and "no *.safetensors" in str(err.value)
    with pytest.raises(InputError, match="no such directory"):
        scan_directory(tmp_path / "absent")
    with pytest.raises(InputError, match="not JSON"):
        parse_scan("Traceback (most recent call last):", "host gpu1")


# --------------------------------------------------------------------------------------
# checkpoint_scan.py --cache: a rerun whose files did not change reads no header again, and any
# change to what the scan reads (a shard rewritten, config.json edited, a new shard, the script
# itself) scans again. Runs the host script's real command (the ModelCheckpoint fact's) in a local
# shell against a composed real-format checkpoint.


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
    out = bounded.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
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
