"""SGLang's metrics are on by default: the serve plan adds --enable-metrics (and the
per-rank flag under attention-DP) to the unit's arguments, and host data turns it off."""

from __future__ import annotations

import pytest

from gpuserve.env_names import ARGS_VAR
from gpuserve.errors import InputError
from gpuserve.launch.catalog import load_catalog
from gpuserve.serve.metrics import attention_dp, metrics_flags
from tests.serve_plans import plan_of
from tests.unit.serve.test_serve_plan import R580


def _args_line(plan) -> str:
    return next(line for line in plan.service.env_text.splitlines()
                if line.startswith(f"{ARGS_VAR}="))


def test_metrics_are_on_by_default_and_once() -> None:
    plan = plan_of({"profile": "deepseek-v3-fp8-h200-tp8", "sglang_version": "0.5.23"},
                      "inv.py", R580)
    line = _args_line(plan)
    assert line.count("--enable-metrics") == 1
    # no attention-DP: rank 0 is every rank, the per-rank flag is not needed
    assert "--enable-metrics-for-all-schedulers" not in line


def test_attention_dp_records_every_scheduler() -> None:
    plan = plan_of({"profile": "deepseek-v3-fp8-h200-tp8-dpattn",
                       "sglang_version": "0.5.23"}, "inv.py", R580)
    line = _args_line(plan)
    assert "--enable-metrics-for-all-schedulers" in line
    assert line.split().count("--enable-metrics") == 1


def test_host_data_turns_metrics_off() -> None:
    plan = plan_of({"profile": "deepseek-v3-fp8-h200-tp8", "sglang_version": "0.5.23",
                       "sglang_metrics": False}, "inv.py", R580)
    assert "--enable-metrics" not in _args_line(plan)


def test_bad_switch_names_inventory_and_key() -> None:
    with pytest.raises(InputError) as info:
        plan_of({"profile": "deepseek-v3-fp8-h200-tp8", "sglang_metrics": "yes"},
                   "inv.py", R580)
    assert (info.value.file, info.value.field) == ("inv.py", "sglang_metrics")


@pytest.mark.parametrize(("args", "expected"), [
    (["--enable-dp-attention", "--dp-size", "8"], True),
    (["--attn-dp-size", "8"], True),
    (["--attn-dp-size=4"], True),
    (["--attn-dp-size", "1"], False),
    (["--tp-size", "8"], False),
])
def test_attention_dp_spellings(args, expected) -> None:
    assert attention_dp(args) is expected


def test_flags_the_args_already_have_are_not_repeated() -> None:
    catalog = load_catalog("0.5.23")
    assert metrics_flags(["--enable-metrics"], True, catalog, "inv.py") == []
    assert metrics_flags(["--enable-dp-attention"], True, catalog, "inv.py") == [
        "--enable-metrics", "--enable-metrics-for-all-schedulers"]
