"""Start-up phases from the stamps of SGLang's own lines (gpuserve/measure/start_phases.py)
and their place in start records, ``gpuserve logs`` and ``gpuserve compare``.

Real logs: tests/fixtures/sglang_logs/startup_pr11830_kv_graphs.log (sglang PR 11830,
verbatim) and startup_pr15426_llama8b.log (sglang PR 15426, verbatim); composed (their
headers say so): fieldnote_glm5_tp8.log and composed_glm5_start_phases.journal.log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.commands.logs import start_phases
from gpuserve.errors import InputError
from gpuserve.measure.start_phases import format_phases, line_time, phases
from gpuserve.measure.starts import (
    Checkpoint,
    StartSpec,
    from_log,
    parse_start,
    read_starts,
    write_start,
)
from gpuserve.memory.startup_log import parse_log

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
JOURNAL = FIXTURES / "logs" / "composed_glm5_start_phases.journal.log"


def test_every_phase_of_a_journal_start() -> None:
    found = phases(JOURNAL.read_text())
    assert found == {"to_weights": 39.7, "weights": 332.5, "kv_pool": 8.0, "graphs": 208.0,
                     "jit": 29.0, "warmup": 4.0, "first_healthy": 624.5}
    assert format_phases(found).startswith("process start to weights 39.7 s, weights load")


@pytest.mark.parametrize(("log", "expected"), [
    ("sglang_logs/startup_pr11830_kv_graphs.log", {"graphs": 5.0}),
    ("sglang_logs/startup_pr15426_llama8b.log", {"to_weights": 4.0}),
    ("logs/fieldnote_glm5_tp8.log", {"to_weights": 39.0, "weights": 332.0}),
])
def test_raw_logs_give_the_phases_their_lines_mark(log: str, expected: dict) -> None:
    assert phases((FIXTURES / log).read_text()) == expected


def test_stamps_of_each_writer() -> None:
    journal = line_time("2026-03-02T10:00:00.500000+0000 gpu1 sglang[1]: [2026-03-02 10:00:09] x")
    raw = line_time("[2026-03-02 10:00:09 TP3] Load weight begin. avail mem=1.00 GB")
    pylog = line_time("2026-03-02 10:00:09,250 - INFO - flashinfer.jit: Loading JIT ops: x")
    assert raw is not None and pylog == raw + 0.25
    assert journal == raw - 8.5  # the journal's own stamp wins, to the microsecond
    assert line_time("Capturing batches (bs=1 avail_mem=38.07 GB): 100%") is None


def test_an_unfinished_jit_span_and_a_start_without_marks() -> None:
    text = JOURNAL.read_text().replace("Finished loading JIT ops", "Still loading")
    assert phases(text)["jit"] == 8.0  # the autotuner's span alone
    assert phases("no stamps here") == {}


def test_the_start_record_keeps_the_phases_and_reads_older_records(tmp_path) -> None:
    text = JOURNAL.read_text()
    spec = StartSpec(results_dir=str(tmp_path), sglang_version="0.5.23",
                     checkpoint=Checkpoint("/models/GLM-5-NVFP4"), launch={"profile": "glm5-tp8"})
    record = from_log(parse_log(text), spec, host="gpu1", timestamp="2026-03-02T10:10:30Z",
                      server_start="2026-03-02T10:00:00.500000+0000", phases=phases(text))
    write_start(tmp_path, record)
    back = read_starts(tmp_path, "gpu1")[0]
    assert back.phases == phases(text) and back.to_dict()["schema"] == "gpuserve.start/1"
    older = {k: v for k, v in record.to_dict().items() if k != "phases"}
    assert parse_start(older, "old.json").phases is None
    with pytest.raises(InputError) as info:
        parse_start({**record.to_dict(), "phases": {"coffee": 1.0}}, "bad.json")
    assert info.value.file == "bad.json" and info.value.field == "phases.coffee"
    with pytest.raises(InputError) as info:
        parse_start({**record.to_dict(), "phases": {"weights": -1}}, "bad.json")
    assert info.value.field == "phases.weights"


def test_compare_shows_each_start_and_logs_the_last(tmp_path, capsys) -> None:
    text = JOURNAL.read_text()
    for stamp, jit in (("2026-03-02T10:10:30Z", 29.0), ("2026-03-02T11:10:30Z", 0.4)):
        spec = StartSpec(results_dir=str(tmp_path), sglang_version="0.5.23",
                         checkpoint=Checkpoint("/m"), launch={"profile": "p"})
        write_start(tmp_path, from_log(
            parse_log(text), spec, host="gpu1", timestamp=stamp, server_start=stamp,
            phases={**phases(text), "jit": jit}))
    assert main(["compare", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["phases"]["jit"] for s in doc["starts"]] == [29.0, 0.4]
    assert main(["compare", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "starts (seconds per phase" in out and "208.0" in out and "0.4" in out
    assert start_phases(text)["graphs"] == 208.0
