"""``gpuserve plan``: choice-valued overrides are SGLang's choices, the GPU count is
bounded, and a KV dtype the planner cannot size is an input error, not a traceback."""

from __future__ import annotations

import pytest

from gpuserve.cli import main

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
