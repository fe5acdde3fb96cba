"""SGLang startup-log parsing and diagnosis (gpuserve.memory.startup_log, gpuserve plan --log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.memory.startup_log import diagnose, parse_log, read_log

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def test_seed_tp_leaves_about_one_gib_for_kv():
    log = read_log(LOGS / "fieldnote_glm5_tp8.log")
    assert set(log.ranks) == {"TP0", "TP1"}
    assert log.server_args["mem_fraction_static"] == 0.78
    assert log.load_type == "GlmMoeDsaForCausalLM" and log.quant == "quant=modelopt_fp4"
    d = diagnose(log)
    assert (d.pre_load_free_gib, d.avail_after_weights_gib) == (94.0, 21.7)
    assert d.slack_gib == pytest.approx(20.68)
    assert d.rest_gib == pytest.approx(1.02, abs=0.005)
    assert d.outcome == "incomplete"


@pytest.mark.parametrize("name", ["fieldnote_glm5_ep8.log", "fieldnote_glm5_ep8_oldformat.log"])
def test_seed_ep_is_refused_with_minimum_viable_fraction(name):
    d = diagnose(read_log(LOGS / name))
    assert d.outcome == "refused-no-kv"
    assert d.rest_gib == pytest.approx(-4.38, abs=0.005)
    assert d.min_viable_mfs == pytest.approx(0.8266, abs=5e-5)
    assert d.suggested_mfs == 0.827
    first = d.fixes[0]
    assert first.startswith("raise --mem-fraction-static to")
    value = float(first.split(" to ")[1].split()[0])
    assert value > 0.8266 and 16.3 - 94 * (1 - value) > 0  # the suggestion leaves KV room
    # fp8 KV is suggested only when the log does not already run it
    already_fp8 = name == "fieldnote_glm5_ep8.log"
    assert any("--kv-cache-dtype fp8_e4m3" in f for f in d.fixes) is not already_fp8


def test_refusal_error_fields_are_parsed():
    log = read_log(LOGS / "fieldnote_glm5_ep8.log")
    err = log.error("err_no_kv")
    assert (err["mfs"], err["suggested"], err["min_viable"]) == (0.78, 0.827, 0.8266)


def test_dsv4_refusal_derives_free_before_from_mem_usage():
    # InferenceX #2128: the issue quotes SGLang's minimum viable fraction 0.9113
    d = diagnose(read_log(LOGS / "inferencex_2128_dsv4_refused.log"))
    assert d.outcome == "refused-no-kv"
    assert d.pre_load_free_gib == pytest.approx(12.25 + 125.65)
    assert d.min_viable_mfs == pytest.approx(0.9113, abs=2e-4)
    assert d.rest_gib < 0


def test_verbatim_qwen3_lines_give_pool_and_cell():
    log = read_log(LOGS / "sglang_pr18263_qwen3_30b.log")
    assert log.avail_after_weights == 230.2 and log.weights_usage == 56.98
    assert log.kv_tokens == 1669816 and log.kv_gib == pytest.approx(152.88)
    d = diagnose(log, mem_fraction_static=0.911)
    # PR #18263 debug print: "initial available_bytes 219721119039 / 204.63 GB"
    assert d.rest_gib == pytest.approx(204.63, abs=0.02)  # logged figures have 2 decimals
    assert d.kv_bytes_per_token == pytest.approx(98304, rel=1e-3)
    assert d.outcome == "started"


def test_old_formats_parse():
    log = read_log(LOGS / "sglang_3416_dsv3_old.log")
    assert log.ranks["TP7"].load_end_avail == 58.12 and log.weights_usage is None
    graph = read_log(LOGS / "sglang_8538_llama4_graph.log")
    assert graph.graph_usage == 6.19 and graph.ranks["TP0"].graph_end_avail == 5.24
    sched = read_log(LOGS / "sglang_11208_glm45air_sched.log")
    assert sched.kv_tokens == 1339395 and sched.scheduler["available_gpu_mem"] == 33.74
    pool = read_log(LOGS / "sglang_4161_dsv3.log")
    assert pool.ranks["TP0"].pool_end_avail == 22.03


def test_draft_pool_is_kept_apart_from_target_pool():
    log = read_log(LOGS / "club3090_1261_draft_pool.log")
    rank = log.ranks["rank0"]
    assert rank.kv_gib == pytest.approx(6.92) and rank.draft_kv_gib == pytest.approx(2.16)
    assert rank.kv_dtype == "torch.float8_e4m3fn"


def test_capture_oom_suggests_lower_fraction_or_batch():
    d = diagnose(read_log(LOGS / "fieldnote_glm5_capture_oom.log"))
    assert d.outcome == "oom-during-capture"
    assert any("lower --mem-fraction-static to about" in f for f in d.fixes)
    assert any("--cuda-graph-max-bs-decode 256" in f for f in d.fixes)


def test_unbalanced_memory():
    text = (
        "[2026-01-01 00:00:00 TP3] RuntimeError: The memory capacity is unbalanced. Some GPUs "
        "may be occupied by other processes. pre_model_load_memory=40.5, "
        "local_gpu_memory=93.3, local_gpu_memory * 0.9=83.97\n"
    )
    d = diagnose(parse_log(text))
    assert d.outcome == "unbalanced"
    assert any("another process" in f for f in d.fixes)


def test_non_log_is_an_input_error(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(InputError, match="no SGLang startup lines"):
        read_log(bad)


def test_cli_log_json_and_table(capsys):
    assert main(["plan", "--log", str(LOGS / "fieldnote_glm5_ep8.log"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["diagnosis"]["outcome"] == "refused-no-kv"
    assert out["diagnosis"]["suggested_mfs"] == 0.827
    assert main(["plan", "--log", str(LOGS / "fieldnote_glm5_ep8.log")]) == 0
    text = capsys.readouterr().out
    assert "refused-no-kv" in text and "-4.38" in text and "0.8266" in text


def test_cli_missing_log_exits_2(capsys, tmp_path):
    assert main(["plan", "--log", str(tmp_path / "absent.log")]) == 2
    assert "gpuserve: error:" in capsys.readouterr().err


def test_cli_log_with_model_predicts_kv_tokens(capsys):
    argv = [
        "plan",
        "--log",
        str(LOGS / "fieldnote_glm5_tp8.log"),
        "--model",
        "glm-5-nvfp4",
        "--gpus",
        "8xRTX-PRO-6000",
        "--json",
    ]
    assert main(argv) == 0
    lines = json.loads(capsys.readouterr().out)["diagnosis"]["lines"]
    kv = next(x for x in lines if "KV tokens" in x and "B/token" in x)
    tokens = int(kv.split("about ")[1].split()[0].replace(",", ""))
    assert abs(tokens - int(1.02 * (1 << 30)) // 61464) <= 1  # rest 1.02 GiB / 61,464 B
    assert any("predicts 55." in x for x in lines)


def test_server_args_dict_form_of_sglang_0_5_x():
    # 0.5.x logs the resolved args as a dict (entrypoints/engine.py::_server_args_for_logging).
    line = (
        "[2026-11-29 10:00:00] server_args={'model_path': '/models/GLM-5-NVFP4', "
        "'tp_size': 8, 'mem_fraction_static': 0.833, 'kv_cache_dtype': 'fp8_e4m3', "
        "'chunked_prefill_size': 8192, 'api_key': None}"
    )
    log = parse_log(line)
    assert log.server_args["mem_fraction_static"] == 0.833
    assert log.server_args["kv_cache_dtype"] == "fp8_e4m3"
    assert log.server_args["tp_size"] == 8


def test_other_exception_before_ready_is_a_failure_with_its_text():
    d = diagnose(read_log(LOGS / "sglang_26087_dsa_unsupported_arch.log"))
    assert d.outcome == "failed"
    assert any("during start-up: RuntimeError: Assertion error (/deepgemm/csrc/apis/"
               "attention.hpp:219): Unsupported architecture" in line for line in d.lines)


def test_exception_after_ready_is_a_crash():
    # the fixture's traceback after SGLang's ready line: a crash while serving
    text = (LOGS / "sglang_26087_dsa_unsupported_arch.log").read_text().replace(
        "[2026-05-22 10:14:03 TP0] Scheduler",
        "[2026-05-22 10:14:01] The server is fired up and ready to roll!\n"
        "[2026-05-22 10:14:03 TP0] Scheduler")
    d = diagnose(parse_log(text))
    assert d.outcome == "crashed"
    assert any("after the server was ready" in line for line in d.lines)


def test_memory_errors_still_win_over_the_generic_exception():
    d = diagnose(read_log(LOGS / "fieldnote_glm5_ep8.log"))
    assert d.outcome == "refused-no-kv"


# --------------------------------------------------------------------------------------
# CUDA-graph and distributed-init lines of SGLang startup logs (gpuserve.memory.startup_log).
#
# Real lines come from tests/fixtures/logs and tests/fixtures/sglang_logs (each file names its
# source in its first line); the one reordered line is composed and says so.


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LLAMA4_LINE = (FIXTURES / "logs" / "sglang_8538_llama4_graph.log").read_text().splitlines()[1]


def test_graph_end_usage_then_avail_real_line():
    log = parse_log(LLAMA4_LINE)
    assert log.graph_usage == pytest.approx(6.19)
    assert log.ranks["TP0"].graph_end_avail == pytest.approx(5.24)


def test_graph_end_avail_before_usage():
    # Composed: the real sglang#8538 line with its two figures swapped, the order other
    # builds print them in ("avail mem=..., mem usage=..." as "Load weight end" does).
    swapped = LLAMA4_LINE.replace(
        "mem usage=6.19 GB. avail mem=5.24 GB.", "avail mem=5.24 GB, mem usage=6.19 GB."
    )
    assert swapped != LLAMA4_LINE
    log = parse_log(swapped)
    assert log.graph_usage == pytest.approx(6.19)
    assert log.ranks["TP0"].graph_end_avail == pytest.approx(5.24)


def test_graph_end_new_format_and_usage_only():
    # 0.5.2x spelling: "Capture target decode CUDA graph end. elapsed=..., mem usage=...,
    # avail mem=..." (as shared/reference/model_configs.md quotes it); and a build printing the
    # usage alone. Composed from the real figures of sglang#8538.
    new = "[2025-07-29 18:14:43 TP0] Capture target decode CUDA graph end. elapsed=19.50 s, "
    log = parse_log(new + "mem usage=6.19 GB, avail mem=5.24 GB.")
    assert (log.graph_usage, log.ranks["TP0"].graph_end_avail) == (6.19, 5.24)
    log = parse_log(LLAMA4_LINE + "\n" + new + "mem usage=1.5 GB.")
    assert log.graph_usage == pytest.approx(6.19 + 1.5)  # decode + another graph, per rank


def test_graph_end_per_rank_real_log():
    log = read_log(FIXTURES / "logs" / "sglang_pr12978_graph_end_two_ranks.log")
    assert log.ranks["TP1"].graph_usage == pytest.approx(1.04)
    assert log.ranks["TP0"].graph_usage == pytest.approx(1.00)
    assert log.graph_usage == pytest.approx(1.04)  # the worst rank
    assert log.errors == []


def test_init_torch_distributed_is_not_an_error():
    path = FIXTURES / "sglang_logs" / "startup_pr11716_tp8.log"
    lines = [line for line in path.read_text().splitlines() if "Init torch distributed" in line]
    assert lines, "fixture lost its Init torch distributed lines"
    log = read_log(path)
    assert not [e for e in log.errors if "Init torch distributed" in e["text"]]
    only_init = parse_log("\n".join(lines))
    assert only_init.errors == []


# --------------------------------------------------------------------------------------
# Startup logs as journald and ``docker logs -t`` hand them over read like the raw log.
#
# The wrapped fixtures under tests/fixtures/logs/wrapped/ are COMPOSED by tools/wrap_log.py from
# real raw fixtures (each file's header names its raw log and the documented format: journalctl(1)
# --output, docker logs --timestamps); read raw, their ranks used to merge into one ("rank0"): the
# graph usages summed and a second rank's KV line became a draft pool.


WRAPPED = FIXTURES / "logs" / "wrapped"
TP8 = FIXTURES / "sglang_logs" / "startup_pr11716_tp8.log"
GRAPHS = FIXTURES / "logs" / "sglang_pr12978_graph_end_two_ranks.log"
MODES = ["journal-short", "journal-short-precise", "journal-short-iso",
         "journal-short-iso-precise", "docker"]


def _figures(path: Path) -> dict:
    d = read_log(path).to_dict()
    d.pop("source")
    return d


@pytest.mark.parametrize("mode", MODES)
def test_wrapped_tp8_log_equals_raw(mode):
    wrapped = WRAPPED / f"startup_pr11716_tp8.{mode}.log"
    assert _figures(wrapped) == _figures(TP8)
    log = read_log(wrapped)
    assert sorted(log.ranks) == [f"TP{i}" for i in range(8)]
    assert log.ranks["TP7"].load_begin_avail == 137.52
    assert log.pre_load_free == 137.29


@pytest.mark.parametrize("mode", ["journal-short", "docker"])
def test_wrapped_graph_ends_stay_per_rank(mode):
    log = read_log(WRAPPED / f"sglang_pr12978_graph_end_two_ranks.{mode}.log")
    assert _figures(WRAPPED / f"sglang_pr12978_graph_end_two_ranks.{mode}.log") == \
        _figures(GRAPHS)
    assert (log.ranks["TP0"].graph_usage, log.ranks["TP1"].graph_usage) == (1.00, 1.04)
    assert log.graph_usage == 1.04  # the largest rank's, not the 2.04 GiB sum


@pytest.mark.parametrize("prefix", [
    "Oct  6 09:06:10 gpu01 sglang[4242]: ",  # short, day padded with a space
    "Mon 2025-10-06 09:06:10 UTC gpu01 sglang[4242]: ",  # short-full
    "2025-10-06T09:06:10+0000 gpu01 python3[17]: ",  # short-iso, older systemd zone
    "Oct 06 09:06:10 gpu01 sglang: ",  # no pid
    "2025-10-06T09:06:10.123456789+02:00 ",  # docker with a zone offset
])
def test_other_prefix_spellings_keep_the_rank(prefix):
    raw = "[2025-10-06 09:06:10 TP3] Load weight begin. avail mem=137.29 GB"
    assert parse_log(prefix + raw).to_dict() | {"source": ""} == \
        parse_log(raw).to_dict() | {"source": ""}
    assert list(parse_log(prefix + raw).ranks) == ["TP3"]
