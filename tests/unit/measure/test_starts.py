"""Start records (gpuserve/measure/starts.py): SGLang's memory lines of one start kept
per rank with the checkpoint, version and launch, checked when read back, and the last
one of the same checkpoint and version chosen for calibration.

The logs are tests/fixtures/logs/fieldnote_glm5_{tp8,ep8}.log (SGLang 0.5.23's line
formats with the field notes' figures; their headers say so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.measure import starts
from gpuserve.measure.starts import (
    Checkpoint,
    StartSpec,
    from_log,
    last_measured,
    read_starts,
    write_start,
)
from gpuserve.memory.startup_log import read_log

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
GLM5 = Checkpoint("/models/GLM-5-NVFP4", "sha256:aaaa")
GPU = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_total_mib": 97887.0,
       "compute_cap": "12.0", "count": 8}
LAUNCH = {"profile": "glm5-nvfp4-tp8", "tp": 8, "ep": 1, "mem_fraction_static": 0.9}


def record(log: str = "fieldnote_glm5_tp8.log", *, stamp: str = "2026-12-06T07:00:00Z",
           version: str = "0.5.23", checkpoint: Checkpoint = GLM5, host: str = "gpu1"):
    return from_log(read_log(LOGS / log), StartSpec("", version, checkpoint, LAUNCH, GPU),
                    host=host, timestamp=stamp, server_start=stamp.replace("Z", "+00:00"))


def test_a_start_keeps_every_rank_and_the_launch_sglang_resolved():
    r = record()
    assert [x.rank for x in r.ranks] == ["TP0", "TP1"]
    assert r.free_before_weights_gib == 94.0 and r.free_after_weights_gib == 21.7
    assert r.ranks[0].weights_gib == 72.3
    # the log's server_args say 0.78 (SGLang's resolved fraction), not the profile's 0.9
    assert r.launch["mem_fraction_static"] == 0.78 and r.launch["tp"] == 8
    ep = record("fieldnote_glm5_ep8.log")
    assert ep.outcome == "refused-no-kv" and ep.launch["ep"] == 8
    assert ep.launch["moe_a2a_backend"] == "flashinfer" and ep.free_after_weights_gib == 16.3


def test_written_and_read_back_unchanged(tmp_path):
    r = record()
    path = write_start(tmp_path, r)
    assert path.parent == tmp_path / "gpu1" and "-start-glm5-nvfp4-tp8" in path.name
    back = read_starts(tmp_path, "gpu1")
    assert back == [r] and back[0].source == str(path)


@pytest.mark.parametrize(("field", "value", "named"), [
    ("ranks", [], "ranks"),
    ("ranks", [{"rank": "TP0", "free_after_weights_gib": "21.7"}],
     "ranks[0].free_after_weights_gib"),
    ("ranks", [{"rank": "TP0", "free_after_weights_gib": float("inf")}], "ranks[0]"),
    ("launch", {"mem_fraction_static": 1.7}, "launch.mem_fraction_static"),
    ("launch", {"tp": True}, "launch.tp"),
    ("checkpoint", {"path": 3}, "checkpoint"),
    ("sglang_version", "", "sglang_version"),
    ("gpu", {"name": "x", "memory_total_mib": -1, "compute_cap": "12.0", "count": 8}, "gpu"),
])
def test_a_bad_field_is_named_and_the_file_skipped(tmp_path, field, value, named):
    doc = record().to_dict()
    doc[field] = value
    with pytest.raises(InputError) as e:
        starts.parse_start(json.loads(json.dumps(doc, allow_nan=True)), "f.json")
    assert named in str(e.value)
    folder = tmp_path / "gpu1"
    folder.mkdir()
    (folder / "20261206T070000Z-start-x.json").write_text(json.dumps(doc, allow_nan=True))
    skipped: list[str] = []
    assert read_starts(tmp_path, "gpu1", skipped) == [] and "20261206T070000Z-start-x" in skipped[0]


def test_a_record_over_the_size_bound_is_skipped(tmp_path):
    folder = tmp_path / "gpu1"
    folder.mkdir()
    (folder / "20261206T070000Z-start-x.json").write_text(" " * (starts.MAX_BYTES + 1))
    skipped: list[str] = []
    assert read_starts(tmp_path, "gpu1", skipped) == [] and skipped


def test_the_last_start_of_the_same_checkpoint_and_version_is_chosen():
    old = record(stamp="2026-12-05T07:00:00Z")
    new = record(stamp="2026-12-06T07:00:00Z")
    other_version = record(stamp="2026-12-06T08:00:00Z", version="0.5.19")
    other_weights = record(stamp="2026-12-06T09:00:00Z",
                           checkpoint=Checkpoint("/models/GLM-5-NVFP4", "sha256:bbbb"))
    other_dir = record(stamp="2026-12-06T10:00:00Z", checkpoint=Checkpoint("/models/other"))
    records = [old, other_version, new, other_weights, other_dir]
    assert last_measured(records, GLM5, "0.5.23") == new
    assert last_measured(records, GLM5, "0.5.19") == other_version
    # a checkpoint read without a scan (gpuserve check) matches by its directory
    assert last_measured(records, Checkpoint("/models/GLM-5-NVFP4"), "0.5.23") == other_weights
    assert last_measured(records, GLM5, "0.5.10.post1") is None


def test_a_start_on_other_cards_does_not_calibrate_the_host_it_has_now():
    """A host whose GPUs changed (another box, a card swapped) has not measured this
    launch yet: its older start is skipped, not refused as if measured wrong."""
    ref = record()
    h100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559.0,
            "compute_cap": "9.0", "count": 8}
    assert last_measured([ref], GLM5, "0.5.23", GPU) == ref
    assert last_measured([ref], GLM5, "0.5.23", h100) is None
    assert last_measured([ref], GLM5, "0.5.23", {**GPU, "count": 4}) is None
    unknown = starts.StartRecord(**{**ref.__dict__, "gpu": None})
    assert last_measured([unknown], GLM5, "0.5.23", h100) == unknown


def test_a_start_that_logged_no_weights_figures_calibrates_nothing():
    r = record()
    bare = starts.StartRecord(**{**r.__dict__, "ranks": (starts.RankFigures("TP0"),)})
    assert last_measured([bare], GLM5, "0.5.23") is None


def test_the_checkpoint_digest_is_the_files_not_their_order():
    a = starts.checkpoint_digest([("a.safetensors", 10), ("b.safetensors", 20)])
    assert a == starts.checkpoint_digest([("b.safetensors", 20), ("a.safetensors", 10)])
    assert a != starts.checkpoint_digest([("a.safetensors", 10), ("b.safetensors", 21)])


def test_compare_reads_a_results_directory_with_start_records_without_noise(tmp_path,
                                                                           capsys):
    import shutil

    from gpuserve.cli import main

    results = tmp_path / "results"
    shutil.copy(LOGS.parent / "results" / "field-notes.jsonl", tmp_path / "notes.jsonl")
    (results / "gpu1").mkdir(parents=True)
    shutil.copy(tmp_path / "notes.jsonl", results / "gpu1" / "notes.jsonl")
    write_start(results, record())
    assert main(["compare", str(results)]) == 0
    out = capsys.readouterr().out
    assert "skipped" not in out and "glm5-nvfp4-tp8" in out


def test_the_start_of_the_closest_launch_wins_over_a_newer_one():
    plain = record(stamp="2026-12-06T07:00:00Z")
    drafting = starts.StartRecord(**{**record(stamp="2026-12-06T09:00:00Z").__dict__,
                                     "launch": {**LAUNCH, "speculative": "EAGLE3"}})
    ep8 = {**LAUNCH, "ep": 8, "speculative": None}
    assert last_measured([plain, drafting], GLM5, "0.5.23", launch=ep8) == plain
    assert last_measured([plain, drafting], GLM5, "0.5.23",
                         launch={**ep8, "speculative": "EAGLE3"}) == drafting
    assert last_measured([plain, drafting], GLM5, "0.5.23") == drafting  # newest
