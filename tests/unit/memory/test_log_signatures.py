"""Crash texts of a start-up log mapped to the doctor rule that explains them
(gpuserve/data/rules/log_signatures.yaml), in ``gpuserve plan --log`` and ``gpuserve logs``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpuserve import safeload
from gpuserve.cli import main
from gpuserve.commands.logs import last_start, print_report
from gpuserve.errors import InputError
from gpuserve.memory.startup_log import (
    DOCTOR_RULES_PATH,
    diagnose,
    load_signatures,
    parse_log,
    read_log,
)

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
SYMM = LOGS / "composed_torch_symm_mem_sm120.log"


def rules_of(text_or_path) -> list[str]:
    log = read_log(text_or_path) if isinstance(text_or_path, Path) else parse_log(text_or_path)
    return [r["id"] for r in diagnose(log).rules]


def test_every_signature_names_a_doctor_rule_and_compiles():
    ids = {r["id"] for r in safeload.load_yaml_file(DOCTOR_RULES_PATH)["rules"]}
    sigs = load_signatures()
    assert sigs and {s.rule for s in sigs} <= ids
    assert {"torch-symm-mem-sm120", "kernel-arch-unsupported", "nan-at-decode",
            "graph-capture-oom", "allreduce-fusion-sm120"} <= {s.rule for s in sigs}


def test_a_bad_signature_names_its_entry(tmp_path):
    bad = tmp_path / "sigs.yaml"
    bad.write_text("signatures:\n  - {rule: x, line: '(', says: s, source: s}\n")
    with pytest.raises(InputError, match=r"signatures\[0\].*bad regular expression"):
        load_signatures(bad)
    bad.write_text("signatures:\n  - {rule: x, line: y, says: s}\n")
    with pytest.raises(InputError, match=r"signatures\[0\]\.source"):
        load_signatures(bad)


def test_torch_symm_mem_key_error_names_the_rule_and_its_fix():
    d = diagnose(read_log(SYMM))
    assert d.outcome == "failed"
    (rule,) = d.rules
    assert rule["id"] == "torch-symm-mem-sm120" and rule["severity"] == "error"
    assert rule["evidence"].startswith("line 20 (rank0): KeyError: 12 -- ")
    assert d.fixes[0] == "torch-symm-mem-sm120: drop --enable-torch-symm-mem"
    assert "explained by doctor rule torch-symm-mem-sm120" in d.lines[-1]


@pytest.mark.parametrize("key", ["'12.0'", "12", "'12.1'"])
def test_key_error_spellings_under_enable_torch_symm_mem(key):
    # SGLang's table is keyed by the major (KeyError: 12); vLLM-style tables by "12.0"
    text = ("[2026-06-20 11:02:14] server_args={'tp_size': 8, 'enable_torch_symm_mem': True}\n"
            "[2026-06-20 11:02:31 TP0] Scheduler hit an exception: Traceback (most recent "
            f"call last):\nKeyError: {key}\n")
    assert rules_of(text) == ["torch-symm-mem-sm120"]


def test_a_key_error_without_torch_symm_mem_is_not_blamed_on_it():
    text = ("[2026-06-20 11:02:14] server_args={'tp_size': 8, 'enable_torch_symm_mem': False}\n"
            "[2026-06-20 11:02:31 TP0] Scheduler hit an exception: Traceback (most recent "
            "call last):\nKeyError: 12\n")
    d = diagnose(parse_log(text))
    assert d.outcome == "failed" and d.rules == []


def test_newer_sglang_turning_symm_mem_off_is_named_too():
    # 0.5.19+: torch_symm_mem.py logs this warning and serves on (no crash)
    text = ("[2026-06-20 11:02:31 TP0] TorchSymmMemCommunicator: Device capability 12 not "
            "supported, communicator is not available.\n"
            "[2026-06-20 11:09:00] The server is fired up and ready to roll!\n")
    d = diagnose(parse_log(text))
    assert d.outcome == "ready" and [r["id"] for r in d.rules] == ["torch-symm-mem-sm120"]
    assert "went on" in d.rules[0]["evidence"]


def test_cli_plan_log_names_the_rule_and_its_fix(capsys):
    assert main(["plan", "--log", str(SYMM)]) == 0
    out = capsys.readouterr().out
    assert "ERROR torch-symm-mem-sm120: torch symmetric memory requested on SM120" in out
    assert "* torch-symm-mem-sm120: drop --enable-torch-symm-mem" in out
    assert main(["plan", "--log", str(SYMM), "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)["diagnosis"]["rules"]
    assert [r["id"] for r in rules] == ["torch-symm-mem-sm120"]


def test_flashinfer_jit_without_an_sm120_build_is_not_an_oom():
    d = diagnose(read_log(LOGS / "sglang_15650_allreduce_fusion_sm120.log"))
    # a capture that failed on a kernel build, not on memory: no OOM advice
    assert d.outcome == "failed"
    assert not any("mem-fraction-static" in f for f in d.fixes)
    assert [r["id"] for r in d.rules] == ["kernel-arch-unsupported"]
    assert "[9, 10]" in d.rules[0]["evidence"]


@pytest.mark.parametrize("args, rule", [
    ("ServerArgs(tp_size=8, enable_flashinfer_allreduce_fusion=True)",
     "allreduce-fusion-sm120"),
    ("{'tp_size': 8, 'enable_flashinfer_allreduce_fusion': True}", "allreduce-fusion-sm120"),
    ("{'tp_size': 8, 'enable_flashinfer_allreduce_fusion': False}", "kernel-arch-unsupported"),
])
def test_the_fusion_flag_in_the_launch_names_the_fusion_rule(args, rule):
    text = (f"[2025-12-22 10:00:00] server_args={args}\n"
            + (LOGS / "sglang_15650_allreduce_fusion_sm120.log").read_text())
    assert rules_of(text) == [rule]


def test_dsa_kernel_without_sm120_build_names_the_dsa_rule():
    assert rules_of(LOGS / "sglang_26087_dsa_unsupported_arch.log") == ["dsa-backend-sm120"]


def test_nan_at_decode():
    d = diagnose(read_log(LOGS / "sglang_1953_nan_logits.log"))
    assert [r["id"] for r in d.rules] == ["nan-at-decode"]
    assert d.rules[0]["evidence"].startswith("line 15 (TP1): Detected errors during sampling!")
    # 0.5.23's texts (utils/async_probe.py) and torch.multinomial's
    for line in ("NaN detected in sampler: next_token_logits; values were sanitized before "
                 "sampling.",
                 "RuntimeError: probability tensor contains either `inf`, `nan` or "
                 "element < 0"):
        assert rules_of(f"[2026-11-01 10:00:00 TP0] {line}\n") == ["nan-at-decode"]


@pytest.mark.parametrize("name", ["sglang_5285_capture_oom.log",
                                  "fieldnote_glm5_capture_oom.log"])
def test_capture_oom(name):
    d = diagnose(read_log(LOGS / name))
    assert d.outcome == "oom-during-capture"
    assert [r["id"] for r in d.rules] == ["graph-capture-oom"]
    assert d.fixes[0].startswith("graph-capture-oom: lower memory.cuda_graph_max_bs")


def test_a_clean_start_names_no_rule():
    assert rules_of(LOGS / "fieldnote_glm5_tp8.log") == []
    assert rules_of(LOGS / "sglang_pr18263_qwen3_30b.log") == []


def journal(path: Path) -> str:
    """The fixture as journalctl -o short-iso-precise prints the unit's lines."""
    lines = [x for x in path.read_text().splitlines() if x and not x.startswith("#")]
    body = "\n".join(f"2026-12-05T01:19:{i:02d}.000000+0000 gpu1 sglang[680]: {x}"
                     for i, x in enumerate(lines))
    return ("2026-12-05T01:18:26.318730+0000 gpu1 systemd[1]: Started "
            "gpuserve-sglang.service - SGLang server (gpuserve).\n" + body)


def test_gpuserve_logs_names_the_rule(capsys):
    start, d = last_start(journal(SYMM))
    assert d is not None and [r["id"] for r in d.rules] == ["torch-symm-mem-sm120"]
    print_report("gpu1", start, d, "", argparse.Namespace(since=None, lines=200))
    out = capsys.readouterr().out
    assert "last start 2026-12-05T01:18:26.318730+0000: failed" in out
    assert "ERROR torch-symm-mem-sm120" in out and "drop --enable-torch-symm-mem" in out
