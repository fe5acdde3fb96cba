"""``gpuserve quality``: the printed verdict (the document roles/deploys/quality.py writes)."""

from __future__ import annotations

from gpuserve.commands.quality import report


def test_a_failed_check_names_the_metric_and_the_reference():
    doc = {"host": "gpu1", "profile": "p", "passed": False, "reference": "m@r.json",
           "summary": "KLD mean 0.9 p99 4.1, 2.3 s",
           "failures": ["kld_mean 0.9 (limit 0.02): 1024 positions [reference m@r.json]"]}
    lines = report(doc)
    assert lines[0] == "gpu1: quality of profile p: FAILED"
    assert "reference: m@r.json" in lines[1]
    assert lines[-1].startswith("  failed: kld_mean 0.9 (limit 0.02)")


def test_a_check_that_could_not_run_says_why():
    doc = {"host": "gpu1", "profile": "p", "passed": False,
           "error": "the quality script printed nothing (is python3 on the host?)"}
    assert report(doc) == ["gpu1: quality of profile p: not measured: the quality script "
                           "printed nothing (is python3 on the host?)"]


def test_a_pass_without_reference_says_it_becomes_one():
    doc = {"host": "gpu1", "profile": "p", "passed": True, "reference": None,
           "summary": "arithmetic 0.93 [0.80, 0.97], 1.1 s", "failures": []}
    lines = report(doc)
    assert lines[0].endswith("passed") and "a pass becomes the reference" in lines[1]
