"""``gpuserve doctor --calibrate FILE``: the memory rules judge the plan calibrated by the
host's measured start (a startup log, or a start record the serve deploy kept), so the
field notes' failing launch (EP8 at mem_fraction_static 0.78) is an ERROR on their box.

The start is tests/fixtures/logs/fieldnote_glm5_tp8.log (SGLang 0.5.23's line formats
with the field notes' TP8 figures: 94 GiB free before weights, 21.7 after); the host is
tests/fixtures/hostfacts/reference-box-kvm.json."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuserve.cli import main
from gpuserve.launch.profiles import PROFILES_DIR
from gpuserve.measure.starts import Checkpoint, StartSpec, from_log, write_start
from gpuserve.memory.startup_log import read_log

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
REF = str(FIXTURES / "hostfacts" / "reference-box-kvm.json")
TP8_LOG = FIXTURES / "logs" / "fieldnote_glm5_tp8.log"


def ep8_at(tmp_path: Path, fraction: float) -> str:
    path = tmp_path / f"ep8-{fraction}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(PROFILES_DIR / "glm5-nvfp4-tp8-ep8.yaml"),
                                    "memory": {"mem_fraction_static": fraction}}))
    return str(path)


def doctor(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["doctor", "--facts", REF, "--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


def memory_plan(doc: dict) -> dict | None:
    return next((f for f in doc["findings"] if f["id"] == "memory-plan"), None)


def test_the_notes_failing_launch_is_an_error_once_calibrated_by_their_start(tmp_path,
                                                                             capsys):
    profile = ep8_at(tmp_path, 0.78)
    rc, doc = doctor(capsys, "--profile", profile)
    assert memory_plan(doc) is None  # the record alone: no refusal
    rc, doc = doctor(capsys, "--profile", profile, "--calibrate", str(TP8_LOG))
    found = memory_plan(doc)
    assert rc == 1 and found and found["severity"] == "error"
    assert "21.70 GiB free after weights measured" in found["evidence"]
    assert "16.29 +- 1.50 GiB" in found["evidence"] and "minimum viable 0.843" in found["evidence"]


def test_a_start_record_calibrates_too_and_0_83_passes(tmp_path, capsys):
    record = write_start(
        tmp_path / "results",
        from_log(
            read_log(TP8_LOG),
            StartSpec(
                results_dir="",
                sglang_version="0.5.23",
                checkpoint=Checkpoint("/models/GLM-5-NVFP4"),
                launch={"profile": "glm5-nvfp4-tp8"},
            ),
            host="gpu1",
            timestamp="2026-12-06T07:00:00Z",
            server_start="2026-12-06T07:00:00Z",
        ),
    )
    rc, doc = doctor(capsys, "--profile", ep8_at(tmp_path, 0.78), "--calibrate", str(record))
    assert rc == 1 and "16.29 +- 1.50" in memory_plan(doc)["evidence"]
    rc, doc = doctor(capsys, "--profile", ep8_at(tmp_path, 0.83), "--calibrate", str(record))
    assert memory_plan(doc) is None


def test_a_start_of_another_version_is_bad_input(tmp_path, capsys):
    record = write_start(
        tmp_path / "results",
        from_log(
            read_log(TP8_LOG),
            StartSpec(
                results_dir="",
                sglang_version="0.5.19",
                checkpoint=Checkpoint("/models/GLM-5-NVFP4"),
                launch={"profile": "glm5-nvfp4-tp8"},
            ),
            host="gpu1",
            timestamp="2026-12-06T07:00:00Z",
            server_start="2026-12-06T07:00:00Z",
        ),
    )
    assert main(["doctor", "--facts", REF, "--profile", ep8_at(tmp_path, 0.78),
                 "--calibrate", str(record)]) == 2
    err = capsys.readouterr().err
    assert "cannot calibrate this launch" in err and "0.5.19" in err, err
