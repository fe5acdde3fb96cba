"""``gpuserve plan`` in predict mode (records, directories, profiles, overrides)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.cli import main

MODELS = Path(__file__).resolve().parents[2] / "fixtures" / "models"


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_predict_default_fraction_for_tp8_mla(capsys):
    rc, plan = _json(
        capsys, ["plan", "--model", "deepseek-v3", "--gpus", "8xRTX-PRO-6000", "--tp", "8"]
    )
    assert rc == 0
    assert plan["mem_fraction_static"] == 0.833
    assert plan["defaults"]["decode_max_bs"] == 512
    assert plan["kv_cell"]["bytes_per_token"] == 70272
    # 79 GiB of FP8 weights leave no KV on a 96 GB card at the default fraction
    assert plan["verdict"] == "refused"
    assert plan["changes"]


def test_overrides_change_the_defaults(capsys):
    rc, plan = _json(
        capsys,
        [
            "plan",
            "--model",
            "deepseek-v3",
            "--gpus",
            "8xRTX-PRO-6000",
            "--tp",
            "8",
            "--attn-dp",
            "8",
        ],
    )
    assert rc == 0 and plan["mem_fraction_static"] == 0.644
    rc, plan = _json(
        capsys,
        [
            "plan",
            "--model",
            "deepseek-v3",
            "--gpus",
            "8xH200",
            "--tp",
            "8",
            "--cuda-graph-max-bs",
            "128",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--sglang-version",
            "0.5.19",
        ],
    )
    assert rc == 0 and plan["version"] == "0.5.19"
    assert plan["defaults"]["decode_max_bs"] == 128
    assert plan["kv_cell"]["bytes_per_token"] == 35136
    assert plan["verdict"] == "fits"


def test_profile_is_read_and_cli_wins(capsys):
    rc, plan = _json(
        capsys, ["plan", "--profile", "glm5-nvfp4-tp8-ep8", "--gpus", "8xRTX-PRO-6000"]
    )
    assert rc == 0
    assert plan["model"] == "glm-5-nvfp4"
    assert plan["layout"]["ep"] == 8 and plan["layout"]["moe_a2a_backend"] == "flashinfer"
    assert plan["mem_fraction_static"] == 0.92
    assert plan["kv_dtype"] == "fp8_e4m3"
    rc, plan = _json(
        capsys,
        [
            "plan",
            "--profile",
            "glm5-nvfp4-tp8-ep8",
            "--gpus",
            "8xRTX-PRO-6000",
            "--mem-fraction-static",
            "0.5",
        ],
    )
    assert plan["mem_fraction_static"] == 0.5 and plan["verdict"] == "refused"


def test_model_directory_and_table_output(capsys):
    rc = main(
        [
            "plan",
            "--model",
            str(MODELS / "glm5-nvfp4-mini"),
            "--gpus",
            "2xRTX-PRO-6000",
            "--tp",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "glm5-nvfp4-mini on 2xRTX-PRO-6000" in out
    assert "routed experts x2 layers" in out and "verdict:" in out
    # hf_quant_config.json says kv_cache_quant_algo FP8, so "auto" KV is fp8
    assert "fp8_e4m3" in out
    assert "checkpoint total_size 20.0 GiB" in out  # model.safetensors.index.json


def test_bad_input_exits_2(capsys):
    assert main(["plan", "--model", "deepseek-v3", "--gpus", "8xTPU"]) == 2
    assert "unknown GPU 'TPU'" in capsys.readouterr().err
    assert main(["plan", "--model", "deepseek-v3"]) == 2
    assert (
        main(["plan", "--model", "deepseek-v3", "--gpus", "8xH200", "--sglang-version", "0.4.0"])
        == 2
    )
    assert "no memory rules for SGLang 0.4.0" in capsys.readouterr().err
    assert main(["plan", "--model", "deepseek-v3", "--gpus", "4xH200", "--tp", "8"]) == 2


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--tp", "0"], "tp"),
        (["--tp", "-2"], "tp"),
        (["--ep", "0"], "ep"),
        (["--attn-dp", "0"], "attn_dp"),
        (["--mem-fraction-static", "2"], "mem_fraction_static"),
        (["--mem-fraction-static", "0"], "mem_fraction_static"),
        (["--chunked-prefill-size", "0"], "chunked_prefill_size"),
        (["--num-redundant-experts", "-1"], "num_redundant_experts"),
    ],
)
def test_out_of_range_overrides_are_input_errors(capsys, flags, field):
    # tp 0 used to plan silently as tp 1, a negative tp or mfs 2 as a "refused" plan
    assert main(["plan", "--model", "deepseek-v3", "--gpus", "8xH200", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuserve: error: {flags[0]}: {field}: "), err


def test_profile_without_a_plannable_model_names_the_profile(capsys, tmp_path):
    profile = tmp_path / "hub.yaml"
    profile.write_text("model:\n  path: zai-org/GLM-5\n")
    assert main(["plan", "--profile", str(profile), "--gpus", "8xH200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuserve: error: {profile}:2: model.path: no record "), err


# --------------------------------------------------------------------------------------
# ``gpuserve plan``: choice-valued overrides are SGLang's choices, the GPU count is bounded, and a
# KV dtype the planner cannot size is an input error, not a traceback.


BASE = ["plan", "--model", "llama-3.1-70b", "--gpus", "8xH200"]


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main([*BASE, *argv] if argv[:1] != ("plan",) else list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out + err


@pytest.mark.parametrize("flag,value", [("--kv-cache-dtype", "nope"),
                                        ("--moe-a2a-backend", "$(reboot)")])
def test_values_outside_sglang_choices_are_refused(capsys, flag, value) -> None:
    code, text = run(capsys, flag, value)
    assert code == 2 and f"{flag}: {flag[2:].replace('-', '_')}: " in text
    assert "is not a choice of SGLang's" in text


def test_a_kv_dtype_the_planner_cannot_size_names_the_flag(capsys) -> None:
    code, text = run(capsys, "--kv-cache-dtype", "nvfp4")  # GQA: not modelled
    assert code == 2 and "--kv-cache-dtype: kv_cache_dtype: 'nvfp4' is not modelled" in text


def test_valid_choices_still_plan(capsys) -> None:
    code, _ = run(capsys, "--kv-cache-dtype", "fp8_e4m3", "--moe-a2a-backend", "none")
    assert code == 0


@pytest.mark.parametrize("gpus", ["1025xH200", "9" * 5000 + "xH200", "0xH200"])
def test_gpu_count_is_bounded(capsys, gpus) -> None:
    code, text = run(capsys, "plan", "--model", "llama-3.1-70b", "--gpus", gpus)
    assert code == 2 and "--gpus: gpus: GPU count must be 1 to 1024" in text


def plan_json(capsys, *argv: str) -> dict:
    import json

    assert main(["plan", *argv, "--json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out) | {"stderr": err}


def test_gpus_count_is_the_tp_unless_told_otherwise(capsys) -> None:
    """8xH100 plans TP8 (TP1 refused a model that fits the box); the block-wise fp8 MoE
    whose expert slice SGLang cannot split at TP8 gets whole experts (EP8)."""
    plan = plan_json(capsys, "--model", "qwen3-235b-a22b-fp8", "--gpus", "8xH100")
    assert (plan["layout"]["tp"], plan["layout"]["ep"], plan["verdict"]) == (8, 8, "fits")
    assert "tp 8 (one rank per GPU of --gpus 8xH100" in plan["stderr"]
    assert "ep 8 (whole experts" in plan["stderr"]
    dense = plan_json(capsys, "--model", "llama-3.1-70b", "--gpus", "4xH200")
    assert (dense["layout"]["tp"], dense["layout"]["ep"]) == (4, 1)
    told = plan_json(capsys, "--model", "llama-3.1-70b", "--gpus", "8xH200", "--tp", "2")
    assert told["layout"]["tp"] == 2 and told["stderr"] == ""
    # told --ep 1: planned as given, and invalid (exit 2) with the fix named
    assert main(["plan", "--model", "qwen3-235b-a22b-fp8", "--gpus", "8xH100", "--ep",
                 "1"]) == 2
    assert "use --ep 8 (whole experts)" in capsys.readouterr().out


def test_a_profile_keeps_its_own_tp(capsys) -> None:
    plan = plan_json(capsys, "--profile", "glm5-nvfp4-tp8", "--gpus", "16xH200")
    assert plan["layout"]["tp"] == 8 and plan["stderr"] == ""
