"""--pre-load-free-gib is bounded by the card's memory.total (gpus.yaml)."""

from __future__ import annotations

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import Layout, PlanRequest, predict

H200 = 143771  # gpus.yaml memory_total_mib


def test_free_memory_above_the_card_is_refused():
    with pytest.raises(InputError) as exc:
        predict(load_record("llama-3.1-70b"), PlanRequest(gpu_memory_mib=H200, gpu_count=8,
                layout=Layout(tp=8), pre_load_free_gib=200))
    assert exc.value.field == "pre_load_free_gib"
    assert "more than the GPU holds (memory.total 143771 MiB = 140.40 GiB)" in str(exc.value)


def test_free_memory_up_to_the_card_is_planned():
    plan = predict(load_record("llama-3.1-70b"), PlanRequest(gpu_memory_mib=H200, gpu_count=8,
                   layout=Layout(tp=8), pre_load_free_gib=137.29))
    assert plan.pre_load_free_gib == 137.29 and plan.verdict != "invalid"


def test_cli_names_the_flag(capsys):
    rc = main(["plan", "--model", "llama-3.1-70b", "--gpus", "8xH200", "--tp", "8",
               "--pre-load-free-gib", "200"])
    assert rc == 2
    assert "--pre-load-free-gib: pre_load_free_gib: 200 GiB" in capsys.readouterr().err
