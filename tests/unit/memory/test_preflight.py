"""Memory preflight: a profile, the checkpoint on the host and its GPUs -> fits or refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuserve.cli import main as cli_main
from gpuserve.launch.profiles import load_profile
from gpuserve.memory.checkpoint import scan_directory
from gpuserve.memory.preflight import check_fit, launch_settings
from tests.checkpoints import compose_record, compose_record_once, scan_once

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
GPUS = BOX["gpus"]  # 8x RTX PRO 6000 Blackwell Server Edition, 97887 MiB


@pytest.fixture(scope="module")
def glm5_dir(tmp_path_factory) -> Path:
    return compose_record_once("glm-5-nvfp4", tmp_path_factory.mktemp("models") / "GLM-5-NVFP4",
                          shards=20)


@pytest.fixture(scope="module")
def glm5():
    return scan_once("glm-5-nvfp4", shards=20)


def _profile(tmp_path: Path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(f"extends: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\n{text}")
    return load_profile(path)


def test_shipped_profile_fits_on_the_reference_box(glm5):
    report = check_fit(load_profile("glm5-nvfp4-tp8"), glm5, GPUS, "0.5.23")
    assert report.ok and report.verdict == "fits" and report.message == ""
    assert report.lines[0].startswith("weights 55.35 GiB/GPU from the checkpoint")
    assert "rest for KV 28.62 GiB/GPU" in report.lines[1]
    assert report.lines[2].startswith(f"KV tokens {report.plan.kv_tokens:,}")
    assert report.notes == []  # composed from the record: no disagreement
    assert report.plan.weights_from == f"checkpoint {glm5.directory}"


def test_refusal_names_profile_rest_and_the_fraction_that_fits(glm5, tmp_path):
    prof = _profile(tmp_path, "memory:\n  mem_fraction_static: 0.55\n")
    report = check_fit(prof, glm5, GPUS, "0.5.23")
    assert not report.ok and report.verdict == "refused"
    assert report.message.startswith("profile p does not fit on 8x NVIDIA RTX PRO 6000")
    assert (f"memory.mem_fraction_static 0.550 leaves {report.plan.rest_gib:.2f} GiB/GPU for "
            "the KV cache") in report.message
    assert "raise --mem-fraction-static to 0.718" in report.message
    fixed = _profile(tmp_path, "memory:\n  mem_fraction_static: 0.718\n")
    assert check_fit(fixed, glm5, GPUS, "0.5.23").ok


def test_more_gpus_than_the_host_has(glm5):
    report = check_fit(load_profile("glm5-nvfp4-tp8"), glm5, GPUS[:4], "0.5.23")
    assert not report.ok and report.verdict == "too-few-gpus"
    assert "needs 8 GPUs" in report.message and "the host has 4" in report.message


def test_mixed_gpus_plan_for_the_smallest(glm5):
    gpus = [dict(g) for g in GPUS]
    gpus[3] = {**gpus[3], "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
               "compute_cap": "9.0"}
    report = check_fit(load_profile("glm5-nvfp4-tp8"), glm5, gpus, "0.5.23")
    assert report.plan.gpu == "NVIDIA H100 80GB HBM3"
    assert any("GPUs differ" in n and "81559 MiB" in n for n in report.notes)


def test_record_disagreement_is_a_note(tmp_path):
    out = compose_record("glm-5-nvfp4", tmp_path / "glm5-fewer-layers",
                         source="glm-5-nvfp4 (40 layers)", num_hidden_layers=40)
    report = check_fit(load_profile("glm5-nvfp4-tp8"), scan_directory(out), GPUS, "0.5.23")
    note = next(n for n in report.notes if n.startswith("model record glm-5-nvfp4"))
    assert "55.35 GiB/GPU" in note and f"{report.plan.weights_gib:.2f} GiB/GPU" in note


def test_launch_settings_profile_with_overrides():
    prof = load_profile("glm5-nvfp4-tp8-ep8")
    s = launch_settings(prof)
    assert (s.layout.tp, s.layout.ep, s.layout.moe_a2a_backend) == (8, 8, "flashinfer")
    assert s.knobs["mem_fraction_static"] == 0.92 and s.knobs["kv_cache_dtype"] == "fp8_e4m3"
    s = launch_settings(prof, {"ep": 1, "moe_a2a_backend": "none", "mem_fraction_static": 0.8})
    assert (s.layout.ep, s.layout.moe_a2a_backend, s.knobs["mem_fraction_static"]) == (
        1, "none", 0.8)


def test_plan_cli_model_dir(glm5_dir, capsys):
    rc = cli_main(["plan", "--model-dir", str(glm5_dir), "--profile", "glm5-nvfp4-tp8-ep8",
                   "--gpus", "8xRTX-PRO-6000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "weights per GPU (from checkpoint):" in out
    # the weights' table (gpuserve/table.py): part, right-aligned GiB, how
    assert re.search(r"^  shared experts +5\.27 GiB  replicated \(flashinfer a2a\)$", out, re.M)
    rc = cli_main(["plan", "--model-dir", str(glm5_dir), "--profile", "glm5-nvfp4-tp8",
                   "--gpus", "8xRTX-PRO-6000", "--mem-fraction-static", "0.55"])
    out = capsys.readouterr().out
    assert rc == 0 and "verdict: refused" in out and "--mem-fraction-static to 0.718" in out


def test_a_multi_node_profile_is_planned_over_the_whole_group(glm5):
    """TP16 over two 8-GPU hosts: 8 GPUs here, the weights split 16 ways (half of TP8's
    per GPU), not "tp x pp = 16 needs more than 8 GPUs"."""
    two = load_profile(str(Path(__file__).resolve().parents[2]
                           / "fixtures/profiles/two-nodes.yaml"))
    report = check_fit(two, glm5, GPUS, "0.5.23")
    tp8 = check_fit(load_profile("glm5-nvfp4-tp8"), glm5, GPUS, "0.5.23")
    assert report.ok, report.message
    assert report.plan.weights_gib < 0.6 * tp8.plan.weights_gib
    assert not check_fit(two, glm5, GPUS[:4], "0.5.23").ok  # 8 GPUs per node still needed
