"""What speculation adds to the memory plan: a separate draft's weights (from its
checkpoint or its record), its pool beyond the KV budget SGLang gives it, its CUDA graphs,
and the room they leave outside the static pool; the tune's pre-load check on them.

The EAGLE-3 head for GLM-5 below is purpose-built (Llama-shaped like SGLang's
models/llama_eagle3.py, tensor names as that loader reads them), not a published draft.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuserve.cli import main as cli_main
from gpuserve.errors import InputError
from gpuserve.launch.profiles import load_profile
from gpuserve.memory.calibration import CALIBRATION_ERROR_GIB, DRAFT_DEFAULT_GIB
from gpuserve.memory.checkpoint import CheckpointScan, TensorGroup
from gpuserve.memory.draft import (
    draft_from_config,
    draft_from_scan,
    load_draft_record,
    resolve_draft,
)
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import GIB, Layout, PlanRequest, predict
from gpuserve.memory.preflight import check_fit
from gpuserve.paths import draft_record_names
from gpuserve.tune.judge import (
    Verdict,
    draft_numbers,
    risk,
    uncertainty,
)
from tests.checkpoints import scan_doc_once, scan_once

REPO = Path(__file__).resolve().parents[3]
GPUS = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())["gpus"]
H, Q, KV, INTER, DRAFT_VOCAB, VOCAB = 6144, 48 * 128, 8 * 128, 16384, 32000, 154880
HEAD = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": H, "intermediate_size": INTER, "num_hidden_layers": 1,
        "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16"}
_BYTES = {"BF16": 2, "I64": 8, "BOOL": 1}


def head_scan(directory: str = "/models/glm5-eagle3-head") -> CheckpointScan:
    """The tensors an EAGLE-3 head checkpoint holds, as checkpoint_scan.py reports them."""
    shapes = [
        ("embed_tokens.weight", "BF16", (VOCAB, H)), ("fc.weight", "BF16", (H, 3 * H)),
        ("midlayer.hidden_norm.weight", "BF16", (H,)),
        ("midlayer.input_layernorm.weight", "BF16", (H,)),
        ("midlayer.post_attention_layernorm.weight", "BF16", (H,)),
        ("midlayer.self_attn.q_proj.weight", "BF16", (Q, 2 * H)),
        ("midlayer.self_attn.k_proj.weight", "BF16", (KV, 2 * H)),
        ("midlayer.self_attn.v_proj.weight", "BF16", (KV, 2 * H)),
        ("midlayer.self_attn.o_proj.weight", "BF16", (H, Q)),
        ("midlayer.mlp.gate_proj.weight", "BF16", (INTER, H)),
        ("midlayer.mlp.up_proj.weight", "BF16", (INTER, H)),
        ("midlayer.mlp.down_proj.weight", "BF16", (H, INTER)),
        ("norm.weight", "BF16", (H,)), ("lm_head.weight", "BF16", (DRAFT_VOCAB, H)),
        ("d2t", "I64", (DRAFT_VOCAB,)), ("t2d", "BOOL", (VOCAB,)),
    ]
    tensors = tuple(TensorGroup(name, dtype, 1, math.prod(shape) * _BYTES[dtype], shape)
                    for name, dtype, shape in shapes)
    return CheckpointScan(directory, dict(HEAD), None, (), tensors)


TP8 = Layout(tp=8, speculative="EAGLE3")


def test_a_scanned_eagle3_head_is_charged_as_sglang_shards_it():
    """Everything but the shared embedding and the d2t/t2d maps, sliced over TP8; fc is a
    plain nn.Linear (replicated), the LM head has draft_vocab_size rows."""
    draft = draft_from_scan(head_scan(), algorithm="EAGLE3", layout=TP8)
    attention = (Q * 2 * H + 2 * KV * 2 * H + H * Q) / 8
    mlp, head, fc, norms = 3 * INTER * H / 8, DRAFT_VOCAB * H / 8, 3 * H * H, 4 * H
    assert draft.weights_gib * GIB == pytest.approx(2 * (attention + mlp + head + fc + norms))
    assert draft.exact and draft.weights_error_gib == 0 and draft.kv_layers == 1
    assert not any("embed" in p.name for p in draft.weights)


def test_the_config_estimate_agrees_with_the_scan():
    """The record path (config keys only) lands on the checkpoint's bytes: its layer,
    EAGLE-3's 2h-wide QKV, fc and the draft-vocabulary head, within the norms."""
    scanned = draft_from_scan(head_scan(), algorithm="EAGLE3", layout=TP8)
    estimated = draft_from_config(HEAD, name="head", source="record head", algorithm="EAGLE3",
                                  layout=TP8, file="head.yaml")
    assert estimated.weights_gib == pytest.approx(scanned.weights_gib, rel=1e-4)
    assert estimated.weights_error_gib == pytest.approx(0.1 * estimated.weights_gib)


def test_the_shipped_kimi_head_borrows_the_targets_lm_head_and_overflows_its_kv_budget():
    """No draft_vocab_size: SGLang loads the target's LM head. Its 64 KV heads are far wider
    than one MLA layer, which is all SGLang budgets for it: the rest of its pool (same
    tokens as the target's) comes out of the memory outside the static pool."""
    draft = load_draft_record("kimi-k2.5-eagle3", algorithm="EAGLE3", layout=TP8)
    assert not any("lm_head" in p.name for p in draft.weights)
    h, inter = 7168, 12288
    expected = 2 * ((2 * h * 64 * 128 + 2 * h * 64 * 128) / 8   # q/o, k/v over TP8
                    + h * (64 * 128 + 2 * 64 * 128) / 8         # the wide QKV's half
                    + 3 * h * inter / 8 + 3 * h * h + 3 * h)      # MLP, fc, norms
    assert draft.weights_gib * GIB == pytest.approx(expected)
    plan = predict(load_record("kimi-k2-instruct"), PlanRequest(gpu_memory_mib=143771, gpu_count=8,
                   layout=TP8, draft=draft))
    d = plan.draft
    assert d["kv_budget_bytes"] == 70272 // 61 and plan.kv_cell["bytes_per_token"] == 71424
    assert d["kv_real_bytes"] == 64 // 8 * (128 + 128) * 2
    assert d["kv_extra_gib"] == pytest.approx((4096 - 1152) * plan.kv_tokens / GIB, abs=1e-3)
    assert any("draft KV" in line and "beyond its budget" in line for line in plan.explanation)


def test_no_draft_without_a_drafting_algorithm():
    """No speculation, or NGRAM (no model): nothing added, no draft line, same figures."""
    arch = load_record("qwen3-30b-a3b")
    plain = predict(arch, PlanRequest(gpu_memory_mib=81559, gpu_count=1))
    ngram = predict(arch,
        PlanRequest(gpu_memory_mib=81559, gpu_count=1, layout=Layout(speculative="NGRAM")))
    for plan in (plain, ngram):
        assert plan.draft is None
        assert not any(line.startswith("draft") for line in plan.explanation)
        assert (plan.weights_gib, plan.rest_gib, plan.kv_tokens) == \
            (plain.weights_gib, plain.rest_gib, plain.kv_tokens)
    assert resolve_draft(None, layout=TP8, draft_arch="kimi-k2.5-eagle3") is None
    assert resolve_draft("NGRAM", layout=TP8, scan=head_scan()) is None


@pytest.fixture(scope="module")
def glm5():
    return scan_once("glm-5-nvfp4", shards=20)


def _profile(tmp_path: Path, bs: int, speculative: bool, mfs: float = 0.83):
    path = tmp_path / f"eagle{bs}{speculative}{mfs}.yaml"
    spec = ("speculative:\n  algorithm: EAGLE3\n  draft_model: /models/glm5-eagle3-head\n"
            if speculative else "")
    path.write_text(f"extends: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\n"
                    f"memory:\n  mem_fraction_static: {mfs}\n  cuda_graph_max_bs: {bs}\n{spec}")
    return load_profile(path)


def test_a_draft_that_fits_at_a_small_graph_size_not_at_a_large_one(glm5, tmp_path):
    """At mem_fraction_static 0.912 the reference box keeps 93.30 x 0.088 = 8.21 GiB free
    after the static pool; SGLang's own graphs and activations take 8.00 of it at decode
    graph max bs 512 and 7.25 at 128 (planner.sglang_need_mb), and the head's graphs ~0.40
    and ~0.10: the draft is named as not fitting at 512 (and loads last in a tune), fits
    at 128, and the target alone at 512 is not touched."""
    alone = check_fit(_profile(tmp_path, 512, False, 0.912), glm5, GPUS, "0.5.23")
    assert alone.ok and alone.plan.draft is None and not any("draft" in n for n in alone.notes)
    big = check_fit(_profile(tmp_path, 512, True, 0.912), glm5, GPUS, "0.5.23",
                    draft_scan=head_scan())
    small = check_fit(_profile(tmp_path, 128, True, 0.912), glm5, GPUS, "0.5.23",
                      draft_scan=head_scan())
    assert big.ok and small.ok  # the KV pool is sized either way: capture is what fails
    assert big.plan.weights_gib == pytest.approx(
        alone.plan.weights_gib + draft_from_scan(head_scan(), algorithm="EAGLE3",
                                                 layout=TP8).weights_gib)
    d = big.plan.draft
    assert (round(d["outside_pool_gib"], 2), round(d["sglang_need_gib"], 2)) == (8.21, 8.0)
    assert d["graphs_gib"] == pytest.approx(0.4) and d["room_gib"] == pytest.approx(-0.19,
                                                                                    abs=0.01)
    note = next(n for n in big.notes if "draft does not fit" in n)
    assert "room -0.19 GiB" in note and "draft CUDA graphs 0.40 GiB" in note
    assert "--cuda-graph-max-bs-decode 256" in note
    assert any(line.startswith("draft glm5-eagle3-head (checkpoint") for line in big.lines)
    assert small.plan.draft["room_gib"] == pytest.approx(0.86, abs=0.01)
    assert not any("draft does not fit" in n for n in small.notes)

    # the tune's pre-load check: 512 loads last with the draft's numbers named, 128 not
    verdicts = {}
    for name, report in (("512", big), ("128", small)):
        verdict = Verdict(numbers={"calibrated_rest_gib": 10.0, "uncertainty_gib": 1.5})
        draft_numbers(verdict, report.plan.draft)
        verdicts[name] = verdict
    why = risk(verdicts["512"])
    assert why is not None and "room outside the static pool -0.19 GiB" in why
    assert risk(verdicts["128"]) is None


def test_the_uncertainty_keeps_only_what_is_unknown_of_the_draft():
    """A scanned draft adds nothing to the calibration's error, a record its estimate's
    10 %, a draft nobody described SGLang's old flat reserve, no speculation nothing."""
    eagle = SimpleNamespace(speculative=SimpleNamespace(algorithm="EAGLE3"))
    plain = SimpleNamespace(speculative=SimpleNamespace(algorithm=None))
    assert uncertainty(plain, None) == CALIBRATION_ERROR_GIB
    assert uncertainty(eagle, {"weights_error_gib": 0.0}) == CALIBRATION_ERROR_GIB
    assert uncertainty(eagle, {"weights_error_gib": 0.2}) == CALIBRATION_ERROR_GIB + 0.2
    assert uncertainty(eagle, {"weights_error_gib": None}) == \
        CALIBRATION_ERROR_GIB + DRAFT_DEFAULT_GIB


def test_a_profile_names_a_draft_record_or_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(f"extends: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\nspeculative:\n"
                    "  algorithm: EAGLE3\n  draft_arch: kimi-k3-eagle9\n")
    with pytest.raises(InputError) as err:
        load_profile(path)
    assert "speculative.draft_arch" in str(err.value) and "kimi-k2.5-eagle3" in str(err.value)


def test_plan_cli_charges_a_draft_record(capsys):
    argv = ["plan", "--model", "kimi-k2-instruct", "--gpus", "8xH200", "--speculative",
            "EAGLE3", "--draft-arch", "kimi-k2.5-eagle3", "--json"]
    assert cli_main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["draft"]["model"] == "kimi-k2.5-eagle3"
    assert any(w["part"].startswith("draft fc") for w in plan["weights"])
    assert cli_main(["plan", "--model", "kimi-k2-instruct", "--gpus", "8xH200",
                     "--draft-arch", "kimi-k2.5-eagle3"]) == 2
    assert "--draft-arch" in capsys.readouterr().err


def write_head_checkpoint(directory: Path) -> Path:
    """``head_scan()``'s tensors as a real safetensors file (header, sparse data) with its
    config.json: what the serve preflight reads on a host."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(HEAD))
    header, offset = {}, 0
    for t in head_scan().tensors:
        header[t.pattern] = {"dtype": t.dtype, "shape": list(t.shape),
                             "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header).encode()
    with (directory / "model.safetensors").open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
    return directory


def test_the_serve_preflight_reads_the_drafts_checkpoint_on_the_host(glm5, tmp_path):
    """A local speculative.draft_model is scanned like the target's directory and its real
    weights charged; one that cannot be read is a warning, not a refusal."""
    from gpuserve.memory.checkpoint import scan_module
    from gpuserve.serve.preflight import run_preflight

    head = write_head_checkpoint(tmp_path / "glm5-eagle3-head")
    docs = {"/models/GLM-5-NVFP4": json.dumps(scan_doc_once("glm-5-nvfp4", shards=20)),
            "/models/glm5-eagle3-head": json.dumps(scan_module().scan(str(head)))}
    prof = _profile(tmp_path, 128, True)
    report = run_preflight("enforce", host="gpu1", profile=prof, version="0.5.23", gpus=GPUS,
                           checkpoint=docs.get, host_facts=None)
    line = next(i for i in report.info if "draft glm5-eagle3-head" in i)
    scanned = draft_from_scan(head_scan(), algorithm="EAGLE3", layout=TP8)
    assert f"checkpoint {head}" in line and f"weights {scanned.weights_gib:.2f} GiB" in line
    docs["/models/glm5-eagle3-head"] = "not a scan"
    report = run_preflight("enforce", host="gpu1", profile=prof, version="0.5.23", gpus=GPUS,
                           checkpoint=docs.get, host_facts=None)
    assert any("draft checkpoint" in w and "gpu1:/models/glm5-eagle3-head" in w
               and "without its weights" in w for w in report.warnings), report.warnings


def test_a_tune_reads_the_drafts_its_candidates_name_and_plans_them(glm5, tmp_path):
    """The snapshot asks for every local speculative.draft_model of the knobs (not hub ids,
    not the model's own directory); the pre-load check then plans the scanned draft: its
    real weights, and no more uncertainty than the calibration's own."""
    from gpuserve.memory.checkpoint import scan_module
    from gpuserve.tune.judge import judge
    from gpuserve.tune.predict import Comm
    from gpuserve.tune.snapshot import draft_paths, parse_snapshot

    knobs = {"speculative": ["off", {"speculative.algorithm": "EAGLE3",
                                     "speculative.draft_model": "/models/glm5-eagle3-head"},
                             {"speculative.algorithm": "EAGLE3",
                              "speculative.draft_model": "org/hub-draft"},
                             {"speculative.algorithm": "EAGLE3",
                              "speculative.draft_model": "/models/GLM-5-NVFP4"}],
             "speculative.draft_model": ["/models/other-head"]}
    assert draft_paths(knobs, "/models/incumbent-head", "/models/GLM-5-NVFP4") == \
        ["/models/glm5-eagle3-head", "/models/incumbent-head", "/models/other-head"]

    head = write_head_checkpoint(tmp_path / "glm5-eagle3-head")
    box = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
    doc = {"schema": "gpuserve.tune-snapshot/1", "host": "box", "sglang_version": "0.5.23",
           "lock": "x", "gpus": GPUS, "host_facts": box,
           "checkpoint": json.dumps(scan_doc_once("glm-5-nvfp4", shards=20)),
           "drafts": {"/models/glm5-eagle3-head": json.dumps(scan_module().scan(str(head))),
                      "/models/unreadable": None}}
    (tmp_path / "snap.json").write_text(json.dumps(doc))
    snapshot = parse_snapshot(tmp_path / "snap.json")
    assert list(snapshot.drafts) == ["/models/glm5-eagle3-head"]
    verdict = judge(_profile(tmp_path, 128, True), glm5, snapshot, calibration_gib=0.0,
                    comm=Comm(105.6, 9.59), peak_batch=8)
    scanned = draft_from_scan(head_scan(), algorithm="EAGLE3", layout=TP8)
    assert verdict.pruned is None, verdict.pruned
    assert verdict.numbers["draft_weights_gib"] == pytest.approx(scanned.weights_gib, abs=1e-3)
    assert verdict.numbers["uncertainty_gib"] == CALIBRATION_ERROR_GIB
    assert risk(verdict) is None
    doc["drafts"] = {}
    (tmp_path / "snap.json").write_text(json.dumps(doc))
    unknown = judge(_profile(tmp_path, 128, True), glm5, parse_snapshot(tmp_path / "snap.json"),
                    calibration_gib=0.0, comm=Comm(105.6, 9.59), peak_batch=8)
    assert unknown.numbers["uncertainty_gib"] == CALIBRATION_ERROR_GIB + DRAFT_DEFAULT_GIB
    assert unknown.numbers["draft_weights_gib"] is None


@pytest.mark.parametrize("value, ok", [
    (None, True), (["/models/a", "/models/b"], True), (["models/a"], False),
    ("/models/a", False), ([f"/m/{i}" for i in range(9)], False), (["/m/a\n"], False)])
def test_the_snapshot_deploy_takes_only_a_short_list_of_absolute_draft_dirs(
        monkeypatch, value, ok):
    """Host data ``tune_drafts`` as gpuserve tune sets it; anything else is refused naming
    the key before any read."""
    from gpuserve.roles.deploys import tune as role

    monkeypatch.setattr(role, "host", SimpleNamespace(data={"tune_drafts": value}))
    monkeypatch.setattr(role, "inventory_source", lambda: "inventory.py")
    if ok:
        assert role._draft_dirs() == (value or [])
    else:
        with pytest.raises(InputError, match="tune_drafts"):
            role._draft_dirs()


def test_auto_kv_dtype_is_resolved_for_the_draft_itself():
    """"auto" is resolved per model runner: a target whose checkpoint says FP8 KV keeps an
    fp8 pool, its BF16 head a bf16 one (1 KV head x (128 + 128) x 2 B at TP8); an explicit
    dtype applies to both."""
    from dataclasses import replace

    glm = load_record("glm-5-nvfp4")
    fp8_kv = replace(glm, quantization=replace(glm.quantization, kv_cache_quant_algo="FP8"))
    head = draft_from_config(HEAD, name="head", source="record head", algorithm="EAGLE3",
                             layout=TP8, file="head.yaml")
    auto = predict(fp8_kv, PlanRequest(gpu_memory_mib=97887, gpu_count=8, layout=TP8, draft=head))
    assert auto.kv_dtype == "fp8_e4m3" and auto.draft["kv_real_bytes"] == 512
    explicit = predict(glm, PlanRequest(gpu_memory_mib=97887, gpu_count=8, layout=TP8, draft=head,
                       kv_cache_dtype="fp8_e4m3"))
    assert explicit.draft["kv_real_bytes"] == 256


def test_every_suggested_fraction_leaves_the_draft_room():
    """A launch short of its context gets fractions to raise to: with an EAGLE-3 head on
    the reference box each is held where the draft's graphs and KV still fit outside the
    static pool (SGLang's own need alone would allow 0.914); where the draft's graphs are
what holds the fraction, 0.001 more would not fit."""
    layout = Layout(tp=8, speculative="EAGLE3")
    draft = draft_from_scan(head_scan(), algorithm="EAGLE3", layout=layout)
    arch = load_record("glm-5-nvfp4")
    mem = GPUS[0]["memory_total_mib"]
    plan = predict(arch, PlanRequest(gpu_memory_mib=mem, gpu_count=8, layout=layout, draft=draft,
                   mem_fraction_static=0.75, context_length=400_000))
    assert plan.verdict == "tight" and plan.max_safe_mfs == 0.914
    assert "with the EAGLE3 draft's graphs and KV allows" in plan.changes[0]
    fractions = [line for line in plan.changes if "--mem-fraction-static" in line]
    assert len(fractions) >= 5, plan.changes
    for line in fractions:
        mfs = float(re.search(r"--mem-fraction-static (?:to )?(0\.\d{3})", line)[1])
        knobs = {flag: int(value) for flag, value in re.findall(
            r"--(cuda-graph-max-bs-decode|chunked-prefill-size) (\d+)", line)}

        def room(fraction: float, knobs: dict = knobs) -> float:
            return predict(arch,
                PlanRequest(gpu_memory_mib=mem, gpu_count=8, layout=layout, draft=draft,
                           mem_fraction_static=fraction,
                           cuda_graph_max_bs=knobs.get("cuda-graph-max-bs-decode"),
                           chunked_prefill_size=knobs.get("chunked-prefill-size"))
                           ).draft["room_gib"]
        assert room(mfs) >= 0, line
        if "graph-max-bs" in line or line is fractions[0]:  # the draft's graphs hold these
            assert room(mfs + 0.001) < 0, line
    # without the draft the same launch is held by SGLang's reserve alone
    plain = predict(arch, PlanRequest(gpu_memory_mib=mem, gpu_count=8, layout=Layout(tp=8),
                    mem_fraction_static=0.75, context_length=400_000))
    assert "(the most SGLang's graph/activation need allows)" in plain.changes[0]
    assert "to 0.914 " in plain.changes[0]


@pytest.mark.parametrize(("name", "target", "layout"), [
    ("kimi-k2.5-eagle3", "kimi-k2-instruct", Layout(tp=8, speculative="EAGLE3")),
    ("deepseek-v3-eagle3", "deepseek-v3", Layout(tp=8, speculative="EAGLE3")),
    ("qwen3-235b-a22b-eagle3", "qwen3-235b-a22b-fp8", Layout(tp=4, speculative="EAGLE3")),
])
def test_every_shipped_draft_record_plans_beside_its_target(name, target, layout):
    """Each draft record loads with its sources and is charged beside its target's record:
    weights in the plan's weights, a draft section, an exact KV budget."""
    draft = load_draft_record(name, algorithm="EAGLE3", layout=layout)
    plain = predict(load_record(target), PlanRequest(gpu_memory_mib=143771, gpu_count=8,
                    layout=Layout(tp=layout.tp)))
    plan = predict(load_record(target),
        PlanRequest(gpu_memory_mib=143771, gpu_count=8, layout=layout,
                   draft=draft))
    assert plan.draft["model"] == name and plan.draft["source"] == f"record {name}"
    assert plan.weights_gib == pytest.approx(plain.weights_gib + draft.weights_gib)
    assert plan.verdict != "invalid", plan.problems
    assert name in draft_record_names()


def test_a_head_with_its_own_draft_vocabulary_carries_that_lm_head():
    """DeepSeek-V3's EAGLE-3 head (SpecForge's config): draft_vocab_size 32000, so its own
    LM head of 32000 rows, split over TP8 like SGLang's ParallelLMHead; fc replicated;
    8 KV heads x 128 at TP8 take 512 B/token, under the 1152 SGLang budgets (one MLA layer
    of the target), so nothing of its pool lies outside the static pool."""
    layout = Layout(tp=8, speculative="EAGLE3")
    draft = load_draft_record("deepseek-v3-eagle3", algorithm="EAGLE3", layout=layout)
    parts = {p.name: p.gib * GIB for p in draft.weights}
    h = 7168
    assert parts["draft lm_head"] == pytest.approx(32000 * h * 2 / 8)
    assert parts["draft fc"] == pytest.approx(3 * h * h * 2)
    assert parts["draft dense MLP x1"] == pytest.approx(3 * h * 40960 * 2 / 8)
    plan = predict(load_record("deepseek-v3"), PlanRequest(gpu_memory_mib=143771, gpu_count=8,
                   layout=layout, draft=draft))
    assert (plan.draft["kv_real_bytes"], plan.draft["kv_budget_bytes"]) == (512, 1152)
    assert plan.draft["kv_extra_gib"] == 0
