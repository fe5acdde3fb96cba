"""Model records and config.json parsing (gpuserve.memory.models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.memory.models import from_directory, load_record, record_names, resolve_model

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "models"


def test_every_record_loads_and_names_its_sources():
    names = record_names()
    for required in (
        "glm-5-nvfp4",
        "deepseek-v3",
        "qwen3-235b-a22b-fp8",
        "qwen3-30b-a3b",
        "llama-3.1-70b",
        "deepseek-r1-0528-nvfp4",
        "kimi-k2.5-nvfp4",
        "gpt-oss-120b",
        "qwen3.5-397b-a17b-fp8",
    ):
        assert required in names
    for name in names:
        arch = load_record(name)
        assert arch.sources and all(s.startswith("http") for s in arch.sources), name
        assert arch.num_layers > 0 and arch.hidden_size > 0


def test_glm5_nvfp4_record():
    a = load_record("glm-5-nvfp4")
    assert a.attention == "dsa" and a.is_mla and a.is_moe
    assert a.dense_layer_ids == (0, 1, 2)
    assert len(a.moe_layer_ids) == 75
    assert (a.n_routed_experts, a.n_shared_experts, a.mtp_layers) == (256, 1, 1)
    assert len(a.index_layer_ids) == 78  # no index_topk_freq: every layer has an indexer
    assert a.quantization.method == "modelopt_fp4"
    kept = a.unquantized_parts()
    for part in ("attention", "shared_experts", "indexer", "dense_mlp", "router", "lm_head"):
        assert part in kept
    assert "routed_experts" not in kept


def test_deepseek_v3_fp8_quantizes_attention_but_not_router():
    a = load_record("deepseek-v3")
    assert a.attention == "mla"
    assert a.quantization.method == "fp8"
    kept = a.unquantized_parts()
    assert "router" in kept and "embed" in kept
    assert "attention" not in kept and "routed_experts" not in kept


def test_qwen_and_llama_shapes():
    q = load_record("qwen3-235b-a22b-fp8")
    assert q.attention == "gqa" and len(q.moe_layer_ids) == 94 and q.n_shared_experts == 0
    small = load_record("qwen3-30b-a3b")
    assert small.quantization is None and small.n_routed_experts == 128
    llama = load_record("llama-3.1-70b")
    assert not llama.is_moe and llama.dense_layer_ids == tuple(range(80))
    assert (llama.num_kv_heads, llama.head_dim, llama.intermediate_size) == (8, 128, 28672)


def test_nvfp4_records_keep_mla_projections_but_quantize_experts():
    for name, experts in (("deepseek-r1-0528-nvfp4", 256), ("kimi-k2.5-nvfp4", 384)):
        a = load_record(name)
        assert a.is_mla and a.n_routed_experts == experts and a.num_layers == 61
        q = a.quantization
        assert q.method == "modelopt_fp4" and q.kv_cache_quant_algo == "FP8"
        assert not q.quantizes("model.layers.5.self_attn.kv_b_proj")
        assert "routed_experts" not in a.unquantized_parts()
    # DeepSeek-R1 FP4 v2 quantizes o_proj too; nvidia/Kimi-K2.5-NVFP4 keeps all of self_attn
    assert load_record("deepseek-r1-0528-nvfp4").quantization.quantizes(
        "model.layers.5.self_attn.o_proj")
    kimi = load_record("kimi-k2.5-nvfp4")
    assert not kimi.quantization.quantizes("model.layers.5.self_attn.o_proj")
    # K2.5's text body sits under text_config, beneath a multimodal architecture
    assert kimi.architecture == "KimiK25ForConditionalGeneration"


def test_gpt_oss_experts_use_intermediate_size_and_attention_stays_bf16():
    a = load_record("gpt-oss-120b")
    assert (a.n_routed_experts, a.num_experts_per_tok, a.moe_intermediate_size) == (128, 4, 2880)
    assert len(a.moe_layer_ids) == 36 and not a.dense_layer_ids
    # "model.layers.*.self_attn" in modules_to_not_convert covers the projections under it
    assert a.quantization.method == "mxfp4"
    assert "attention" in a.unquantized_parts()
    assert "routed_experts" not in a.unquantized_parts()


def test_qwen35_record_reads_its_text_config():
    a = load_record("qwen3.5-397b-a17b-fp8")
    assert a.architecture == "Qwen3_5MoeForConditionalGeneration" and a.attention == "gqa"
    assert (a.num_layers, a.num_kv_heads, a.head_dim) == (60, 2, 256)
    assert (a.n_routed_experts, a.num_experts_per_tok, a.moe_intermediate_size) == (512, 10, 1024)
    assert a.shared_expert_intermediate_size == 1024 and len(a.moe_layer_ids) == 60
    assert a.quantization.weight_block_size == (128, 128)


def test_from_directory_reads_hf_quant_config_and_index():
    a = from_directory(FIXTURES / "glm5-nvfp4-mini")
    assert a.moe_layer_ids == (2, 3)
    assert a.index_layer_ids == (0, 2)  # index_topk_freq 2, index_skip_topk_offset 1
    assert a.quantization.method == "modelopt_fp4"
    assert a.quantization.kv_cache_quant_algo == "FP8"
    assert a.checkpoint_bytes == 21474836480
    assert resolve_model(str(FIXTURES / "glm5-nvfp4-mini")).name == "glm5-nvfp4-mini"


def test_resolve_unknown_record_is_an_input_error():
    with pytest.raises(InputError, match="no record 'nope'"):
        resolve_model("nope")


def test_directory_without_config(tmp_path):
    with pytest.raises(InputError, match="config.json"):
        from_directory(tmp_path)


def test_bad_field_type_names_file_and_field(tmp_path):
    cfg = json.loads((FIXTURES / "qwen3-30b-a3b-5layers" / "config.json").read_text())
    cfg["num_hidden_layers"] = "five"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as exc:
        from_directory(tmp_path)
    assert exc.value.field == "num_hidden_layers"
    assert str(tmp_path / "config.json") in str(exc.value)


def test_invalid_json_reports_line(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "hidden_size": 1,\n  oops\n}')
    with pytest.raises(InputError) as exc:
        from_directory(tmp_path)
    assert exc.value.line == 3


def test_unsupported_quantization_is_rejected(tmp_path):
    cfg = json.loads((FIXTURES / "qwen3-30b-a3b-5layers" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gguf"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as exc:
        from_directory(tmp_path)
    assert exc.value.field == "quantization_config.quant_method"


@pytest.mark.parametrize(
    ("name", "content", "field", "words"),
    [
        ("config.json", b"\xff\xfe{}", None, "not UTF-8"),
        ("config.json", b"[1]", None, "JSON object"),
        ("hf_quant_config.json", b"\xff", None, "not UTF-8"),
        ("hf_quant_config.json", b"[]", None, "JSON object"),
        ("model.safetensors.index.json", b"[1]", None, "JSON object"),
        ("model.safetensors.index.json", b'{"metadata": {"total_size": "big"}}',
         "metadata.total_size", "integer"),
    ],
)
def test_malformed_directory_files_name_file_and_field(tmp_path, name, content, field, words):
    (tmp_path / "config.json").write_bytes(
        (FIXTURES / "qwen3-30b-a3b-5layers" / "config.json").read_bytes())
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError) as exc:
        from_directory(tmp_path)
    assert exc.value.file == str(tmp_path / name) and exc.value.field == field
    assert words in exc.value.message


@pytest.mark.parametrize(
    ("qcfg", "field"),
    [("fp8", "quantization_config"),
     ({"quant_method": "fp8", "weight_block_size": ["a"]},
      "quantization_config.weight_block_size")],
)
def test_malformed_quantization_config_is_an_input_error(tmp_path, qcfg, field):
    cfg = json.loads((FIXTURES / "qwen3-30b-a3b-5layers" / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as exc:
        from_directory(tmp_path)
    assert exc.value.field == field
