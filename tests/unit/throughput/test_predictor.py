"""The throughput predictor: collectives from the architecture, the calibrated field-notes
figures, speculation on a PCIe box without P2P, and the accuracy bench's summary line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import Layout
from gpuserve.throughput.hardware import gpu, link
from gpuserve.throughput.model import Box, Speculation, Workload, collectives, predict

ROOT = Path(__file__).resolve().parents[3]
NOTES = ROOT / "tests" / "fixtures" / "results" / "field-notes.jsonl"
SMALL = ROOT / "tests" / "fixtures" / "throughput" / "small.jsonl"


def test_all_reduces_per_forward_follow_sglangs_layers():
    glm5, dsv3 = load_record("glm-5-nvfp4"), load_record("deepseek-v3")
    # two per layer (attention output, MLP/MoE output) plus the embedding's; the logits
    # gather is a gather: GLM-5's 78 layers give 157, DeepSeek-V3's 61 give 123 (the notes'
    # "about 122" is DeepSeek-V3's count)
    tp8 = collectives(glm5, Layout(tp=8))
    assert (tp8.all_reduces, tp8.gathers, tp8.alltoalls) == (157, 1, 0)
    assert collectives(dsv3, Layout(tp=8)).all_reduces == 123
    # EP's all-to-all replaces the 75 MoE layers' all-reduce by a dispatch and a combine;
    # attention and GLM-5's 3 dense layers still all-reduce
    ep = collectives(glm5, Layout(tp=8, ep=8, moe_a2a_backend="flashinfer"))
    assert (ep.all_reduces, ep.alltoalls) == (78 + 3 + 1, 150)
    # EP without an all-to-all backend keeps the all-reduce
    assert collectives(glm5, Layout(tp=8, ep=8)).all_reduces == 157
    # attention DP: no attention all-reduce, tokens gathered and scattered around the MLP
    dp = collectives(dsv3, Layout(tp=8, attn_dp=8))
    assert (dp.all_reduces, dp.gathers) == (1, 2 * 61 + 1)
    assert collectives(glm5, Layout(tp=1)).total == 0


def _plan(capsys, profile: str, *extra: str) -> dict:
    rc = main(["plan", "--profile", profile, "--gpus", "8xRTX-PRO-6000", *extra, "--json"])
    assert rc == 0
    return json.loads(capsys.readouterr().out)["predicted"]


def test_calibrated_by_the_notes_tp8_predicts_89_5_and_eagle3_below(capsys):
    base = _plan(capsys, "glm5-nvfp4-tp8", "--calibrate", str(NOTES))
    eagle = _plan(capsys, "glm5-nvfp4-tp8-eagle3", "--calibrate", str(NOTES))
    assert base["calibrated_by"]["record"] == "glm5-nvfp4-tp8"
    assert abs(base["single_stream_tps"] - 89.5) <= 8.95
    # calibrated by the baseline only (the EAGLE-3 row is not the one it fits on)
    assert eagle["calibrated_by"]["record"] == "glm5-nvfp4-tp8"
    assert eagle["single_stream_tps"] < base["single_stream_tps"]
    assert eagle["accept_length"] > 1.5


def test_plan_concurrency_gives_output_and_per_user(capsys):
    one = _plan(capsys, "glm5-nvfp4-tp8")
    many = _plan(capsys, "glm5-nvfp4-tp8", "--concurrency", "16", "--output-len", "512")
    assert one["link"] == "pcie-no-p2p" and one["calibrated_by"] is None
    assert many["concurrency"] == 16
    assert many["output_tps"] > 4 * one["single_stream_tps"]
    assert many["per_user_tps"] == pytest.approx(many["output_tps"] / 16, rel=1e-3)
    with pytest.raises(SystemExit):
        main(["plan", "--profile", "glm5-nvfp4-tp8", "--gpus", "8xRTX-PRO-6000",
              "--interconnect", "infiniband"])


def _speedup(link_name: str) -> float:
    arch = load_record("glm-5-nvfp4")
    box = Box(gpu("RTX-PRO-6000"), link(link_name))
    base = predict(arch, Layout(tp=8), box, Workload(), kv_dtype="fp8_e4m3")
    spec = Speculation("EAGLE3", 3, 1, 4)
    eagle = predict(arch, Layout(tp=8, speculative="EAGLE3", draft_layers=1), box,
                    Workload(), kv_dtype="fp8_e4m3", spec=spec)
    return eagle.single_stream_tps / base.single_stream_tps


def test_eagle3_loses_on_pcie_without_p2p_and_wins_with_it():
    # the verify forward's 4 tokens per request quadruple each all-reduce's bytes, which
    # SHM carries slowly; with P2P the same verify costs little more than a decode step
    assert _speedup("pcie-no-p2p") < 1.0
    assert _speedup("pcie-p2p") > 1.1


def test_tuner_view_uses_the_hosts_measured_p2p_and_latency():
    from gpuserve.tune.predict import Comm, host_box

    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert host_box(name, Comm(), {"p2p": False}).link.name == "pcie-no-p2p"
    assert host_box(name, Comm(), None).link.name == "pcie-no-p2p"  # not measured
    measured = host_box(name, Comm(30.0, 12.0), {"p2p": True}).link
    assert measured.name == "pcie-p2p"
    assert (measured.latency_us, measured.busbw_gbs) == (30.0, 12.0)
    assert set(measured.measured) == {"latency_us", "busbw_gbs", "small_busbw_gbs"}


def test_accuracy_script_last_line_on_a_small_fixture():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "throughput_accuracy.py"),
                          str(SMALL)], capture_output=True, text=True, check=True).stdout
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"throughput accuracy: (\d+) of (\d+) measurements planned, median abs "
                     r"error ([\d.]+) % uncalibrated, ([\d.]+) % calibrated by the pair's "
                     r"baseline; pairs (\d+)/(\d+) ordered right", last)
    assert m, last
    planned, rows, _, _, right, pairs = m.groups()
    assert (int(planned), int(rows)) == (4, 5)  # the model without a record is not planned
    assert int(pairs) == 2 and int(right) >= 1
    assert "not planned: no-record-c1: no model record" in out


def test_a_hosts_measured_gates_decide_the_link(capsys, tmp_path):
    # a gpuserve.measure/1 line (as gpuserve.measure.gates writes it) of a box whose P2P
    # works: planned on PCIe with P2P at its measured figures, where EAGLE-3 wins again
    gates = tmp_path / "gates.jsonl"
    gates.write_text(json.dumps({
        "schema": "gpuserve.measure/1", "host": "gpu1", "timestamp": "2026-12-04T12:00:00Z",
        "topology_class": "pcie5-x16-p2p", "runs": [], "verdicts": [],
        "figures": {"all_reduce_latency@1024": 22.0, "all_reduce_busbw@2147483648": 38.5}}))
    base = _plan(capsys, "glm5-nvfp4-tp8", "--calibrate", str(gates))
    eagle = _plan(capsys, "glm5-nvfp4-tp8-eagle3", "--calibrate", str(gates))
    assert base["link"] == "pcie-p2p" and base["calibrated_by"]["gates"]["host"] == "gpu1"
    assert "latency_us" in base["calibrated_by"]["gates"]["measured"]
    assert eagle["single_stream_tps"] > base["single_stream_tps"]


def test_measurement_kv_dtype_names():
    from gpuserve.throughput.records import kv_dtype

    assert kv_dtype("float8_e4m3fn") == "fp8_e4m3" and kv_dtype("FP8") == "fp8"
    assert kv_dtype(None) == "auto" and kv_dtype("fp4") == "nvfp4"


def test_a_bad_measurement_is_refused_by_plan_and_skipped_by_the_bench(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    row = json.loads(SMALL.read_text().splitlines()[0])
    bad.write_text(json.dumps({**row, "tp": "eight"}) + "\n" + json.dumps(row) + "\n")
    rc = main(["plan", "--profile", "glm5-nvfp4-tp8", "--gpus", "8xRTX-PRO-6000",
               "--calibrate", str(bad), "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and "line 1: tp" in err and str(bad) in err
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "throughput_accuracy.py"),
                          str(bad)], capture_output=True, text=True, check=True).stdout
    assert "1 of 2 measurements planned" in out and "line 1: tp" in out
