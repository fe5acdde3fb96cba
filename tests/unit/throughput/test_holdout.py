"""Leave-one-source-out scoring of the throughput predictor's fitted constants
(bench/throughput_fit.py, through bench/throughput_accuracy.py --holdout source)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SMALL = ROOT / "tests" / "fixtures" / "throughput" / "small.jsonl"
sys.path.insert(0, str(ROOT / "bench"))

import throughput_fit as tf  # noqa: E402


def test_rows_group_by_their_source_document():
    blob = ("https://github.com/local-inference-lab/rtx6kpro/blob/"
            "f9de90e19d7223c9c11ee96ad14d28c2032483a4/models/qwen35-397b.md (section x)")
    run = "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/26306422380/attempts/1 ; x"
    assert tf.source_group({"source": blob}) == \
        "github.com/local-inference-lab/rtx6kpro/blob/models/qwen35-397b.md"
    assert tf.source_group({"source": run}) == \
        "github.com/SemiAnalysisAI/InferenceX/actions/runs/26306422380"
    notes = "/work/shared/field-notes/ep-oom-memory-arithmetic.txt (first paragraph)"
    assert tf.source_group({"source": notes}) == \
        "/work/shared/field-notes/ep-oom-memory-arithmetic.txt"


def test_holdout_prints_before_the_summary_and_names_what_one_source_alone_fits():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "throughput_accuracy.py"),
                          str(SMALL), "--holdout", "source"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert lines[-1].startswith("throughput accuracy: 4 of 5 measurements planned")
    held = [x for x in lines if x.startswith("holdout: leave-one-source-out")]
    assert held and re.search(r"\(2 sources\).*pairs \d/2 ordered right", held[0])
    # only the field notes run without P2P: without them nothing fits that bandwidth
    assert any("field-notes" in x and "links.pcie-no-p2p.small_busbw_gbs" in x
               and "not out of sample" in x for x in lines)
