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
