"""Plans calibrated by a measured start (gpuserve.memory.calibration, .measured), and
plans without one checked against the real starts a model record quotes.

The startup logs are tests/fixtures/logs/fieldnote_glm5_tp8.log and _ep8.log (SOURCE in
their headers: SGLang 0.5.23 line formats filled with the field notes' figures from
/work/shared/field-notes/ep-oom-memory-arithmetic.txt: 94 GB free before weights, 21.7
after TP8 weights, 16.3 after EP8 weights on 8x RTX PRO 6000). The record's second
measurement (36.93 GiB) is a public guide's startup log, cited in glm-5-nvfp4.yaml.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuserve.cli import main as cli_main
from gpuserve.doctor.rules import diagnose
from gpuserve.errors import InputError
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.profiles import load_profile
from gpuserve.memory import calibration
from gpuserve.memory.measured import MeasuredStart, parse_record_measurements
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import FitVerdict
from gpuserve.memory.preflight import check_fit
from gpuserve.tune import judge
from tests.checkpoints import scan_once

REPO = Path(__file__).resolve().parents[3]
LOGS = REPO / "tests/fixtures/logs"
TP8_LOG, EP8_LOG = LOGS / "fieldnote_glm5_tp8.log", LOGS / "fieldnote_glm5_ep8.log"
FACTS = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
EP8 = ["plan", "--profile", "glm5-nvfp4-tp8-ep8", "--gpus", "8xRTX-PRO-6000"]


def start(path: Path) -> MeasuredStart:
    return MeasuredStart.from_log(path.read_text(), str(path))


def plan_json(capsys, argv: list[str]) -> dict:
    assert cli_main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------ the measured start


def test_a_startup_log_becomes_a_measured_start_and_round_trips():
    m = start(TP8_LOG)
    assert (m.free_before_weights_gib, m.free_after_weights_gib) == (94.0, 21.7)
    assert [r.rank for r in m.ranks] == ["TP0", "TP1"]
    assert m.checkpoint == "/models/GLM-5-NVFP4"
    assert m.overrides()["tp"] == 8 and m.overrides()["ep"] == 1
    assert m.overrides()["moe_a2a_backend"] == "none"  # not in server_args: SGLang's default
    assert MeasuredStart.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    ep8 = start(EP8_LOG)
    assert ep8.overrides()["ep"] == 8 and ep8.overrides()["moe_a2a_backend"] == "flashinfer"


def test_a_bad_measured_start_names_its_field():
    good = start(TP8_LOG).to_dict()
    with pytest.raises(InputError, match="free_after_weights_gib"):
        MeasuredStart.from_dict({**good, "free_after_weights_gib": "21.7"}, "host:last.json")
    with pytest.raises(InputError, match="schema"):
        MeasuredStart.from_dict({**good, "schema": "other/1"}, "host:last.json")
    with pytest.raises(InputError, match="Load weight end"):
        MeasuredStart.from_log("[2026-03-02 10:00:40 TP0] Load weight begin. avail mem=94.00 GB",
                               "short.log")


def test_a_start_of_another_checkpoint_or_version_does_not_calibrate():
    m = start(TP8_LOG)
    assert m.mismatch(checkpoint="/models/GLM-5-NVFP4/", sglang_version="0.5.23") is None
    assert "other" in m.mismatch(checkpoint="/models/other", sglang_version=None)
    m.sglang_version = "0.5.10.post1"
    assert "0.5.10.post1" in m.mismatch(checkpoint=None, sglang_version="0.5.23")


# ------------------------------------------------------------- gpuserve plan --calibrate


def test_calibrated_ep8_plan_lands_on_what_the_box_measured_under_ep8(capsys):
    """From the TP8 start, EP8 plans the notes' EP8 figure within its uncertainty."""
    cal = plan_json(capsys, EP8 + ["--calibrate", str(TP8_LOG)])["calibrated"]
    measured_ep8 = start(EP8_LOG).free_after_weights_gib
    assert abs(cal["free_after_weights_gib"] - measured_ep8) <= cal["uncertainty_gib"]
    assert cal["uncertainty_gib"] == calibration.CALIBRATION_ERROR_GIB
    assert cal["measured_after_gib"] == start(TP8_LOG).free_after_weights_gib


def test_the_notes_failing_launch_is_refused_naming_the_measured_numbers(capsys):
    plan = plan_json(capsys, EP8 + ["--calibrate", str(TP8_LOG), "--mem-fraction-static",
                                    "0.78"])
    assert plan["verdict"] == "refused"
    text = "\n".join(plan["explanation"])
    assert "21.70" in text and "94.00" in text and str(TP8_LOG) in text
    # SGLang refused that very launch, and says which fraction it needed
    ep8_error = EP8_LOG.read_text().split("above ")[1][:5]
    assert plan["calibrated"]["min_viable_mfs"] == pytest.approx(float(ep8_error), abs=0.002)
    assert plan["changes"][0].startswith("set mem_fraction_static to")


def test_a_launch_above_the_measured_minimum_goes_ahead_with_its_margin(capsys):
    plan = plan_json(capsys, EP8 + ["--calibrate", str(TP8_LOG), "--mem-fraction-static",
                                    "0.83"])
    cal = plan["calibrated"]
    assert plan["verdict"] != "refused" and cal["rest_gib"] > 0
    assert plan["verdict"] == ("risky" if cal["rest_gib"] < cal["uncertainty_gib"] else "fits")
    assert cli_main(EP8 + ["--calibrate", str(TP8_LOG), "--mem-fraction-static", "0.83"]) == 0
    table = capsys.readouterr().out
    assert f"calibrated by the measured start {TP8_LOG}" in table
    assert "rest for KV / margin" in table and "+0.31" in table


def test_bench_records_given_to_calibrate_are_not_a_startup_log(capsys, tmp_path):
    records = tmp_path / "bench.jsonl"  # the notes' own bench records, a blank line first
    records.write_text("\n" + Path("tests/fixtures/results/field-notes.jsonl").read_text())
    plan = plan_json(capsys, EP8 + ["--calibrate", str(records)])
    assert plan["calibrated"] is None
    both = plan_json(capsys, EP8 + ["--calibrate", str(records), "--calibrate", str(TP8_LOG)])
    assert both["calibrated"]["source"] == str(TP8_LOG)


def test_a_log_of_another_checkpoint_is_refused_as_calibration(capsys, tmp_path):
    other = tmp_path / "other.log"
    other.write_text(TP8_LOG.read_text().replace("/models/GLM-5-NVFP4", "/models/Other"))
    assert cli_main(EP8 + ["--calibrate", str(other)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "/models/Other" in err


# ------------------------------------------------------ without a measurement: the record


def test_without_a_measurement_the_notes_launch_is_risky_with_both_figures(capsys):
    plan = plan_json(capsys, EP8 + ["--mem-fraction-static", "0.78"])
    assert plan["verdict"] == "risky"
    figures = sorted(m["measurement"]["free_after_weights_gib"] for m in plan["measured"])
    assert figures == [21.7, 36.93]
    risky = [line for line in plan["explanation"] if line.startswith("risky")]
    assert "21.70" in risky[0] and "36.93" in risky[0]
    assert any(line.startswith("load-time overhead this plan cannot see")
               for line in plan["explanation"])


def test_launches_every_measurement_clears_still_fit(capsys):
    for argv in (["plan", "--profile", "glm5-nvfp4-tp8", "--gpus", "8xRTX-PRO-6000",
                  "--mem-fraction-static", "0.92"], EP8):
        plan = plan_json(capsys, argv)
        assert plan["verdict"] == "fits"
        assert min(m["rest_gib"] for m in plan["measured"]) >= calibration.CALIBRATION_ERROR_GIB


def test_a_plan_on_another_gpu_is_not_judged_by_these_measurements(capsys):
    plan = plan_json(capsys, ["plan", "--model", "glm-5-nvfp4", "--gpus", "8xB200"])
    assert plan["measured"] == []
    assert any(line.startswith("load-time overhead") for line in plan["explanation"])


def test_record_measurements_are_validated_naming_file_and_field():
    assert len(load_record("glm-5-nvfp4").measured) == 2
    good = {"gpu": "RTX-PRO-6000", "tp": 8, "free_after_weights_gib": 21.7, "source": "x"}
    assert parse_record_measurements([good], "r.yaml")[0].ep == 1
    for bad, field in (({**good, "tp": 0}, "measured[0].tp"),
                       ({**good, "free_after_weights_gib": None},
                        "measured[0].free_after_weights_gib"),
                       ({**good, "source": ""}, "measured[0].source"),
                       ({**good, "gpus": "x"}, "measured[0].gpus")):
        with pytest.raises(InputError, match=re.escape(f"r.yaml: {field}")):
            parse_record_measurements([bad], "r.yaml")


# ---------------------------------------------------------- the serve preflight, doctor


@pytest.fixture(scope="module")
def glm5():
    return scan_once("glm-5-nvfp4", shards=20)


def ep8_at(tmp_path: Path, mfs: float):
    path = tmp_path / f"ep8-{mfs}.yaml"
    path.write_text(f"extends: {REPO / 'profiles/glm5-nvfp4-tp8-ep8.yaml'}\n"
                    f"memory:\n  mem_fraction_static: {mfs}\n")
    return load_profile(path)


def test_check_fit_refuses_from_the_hosts_measured_start(glm5, tmp_path):
    fit = check_fit(ep8_at(tmp_path, 0.78), glm5, FACTS["gpus"], "0.5.23",
                    measured=start(TP8_LOG))
    assert not fit.ok and fit.verdict == FitVerdict.REFUSED
    assert "21.70 GiB free after weights measured" in fit.message
    ahead = check_fit(ep8_at(tmp_path, 0.83), glm5, FACTS["gpus"], "0.5.23",
                      measured=start(TP8_LOG))
    assert ahead.ok and ahead.plan.calibrated["rest_gib"] > 0


def test_check_fit_without_a_measurement_warns_of_a_risky_launch(glm5, tmp_path):
    fit = check_fit(ep8_at(tmp_path, 0.78), glm5, FACTS["gpus"], "0.5.23")
    assert fit.ok and fit.verdict == FitVerdict.RISKY
    assert any("risky" in note and "36.93" in note for note in fit.notes)


def test_the_doctor_warns_of_a_risky_launch(tmp_path):
    facts = HostFacts.from_dict(FACTS, "reference-box-kvm.json")
    found = {f.id: f for f in diagnose(ep8_at(tmp_path, 0.78), facts, "0.5.23")}
    assert found["memory-plan-risky"].severity == "warn"
    assert "21.70" in found["memory-plan-risky"].evidence
    assert "memory-plan-risky" not in {f.id for f in diagnose(
        load_profile("glm5-nvfp4-tp8"), facts, "0.5.23")}


def test_the_tuner_calibrates_with_the_same_code(glm5, tmp_path):
    fit = check_fit(ep8_at(tmp_path, 0.78), glm5, FACTS["gpus"], "0.5.23")
    offset = start(TP8_LOG).free_after_weights_gib - 37.95
    shared = calibration.offset_fit(fit.plan, offset, uncertainty_gib=1.5)
    assert shared.rest_gib == pytest.approx(
        fit.plan.rest_gib + offset)  # the tuner's rest: planned rest + measured offset
    assert judge.uncertainty(ep8_at(tmp_path, 0.78)) == calibration.CALIBRATION_ERROR_GIB


def test_a_measured_graph_capture_is_set_against_this_launchs_room(capsys, tmp_path):
    """The TP8 start with the two graph-capture ends of sglang PR 12978's fixture (real
    line format) appended: their largest 'mem usage' is the start's graph figure."""
    graphs = [line for line in (LOGS / "sglang_pr12978_graph_end_two_ranks.log").read_text()
              .splitlines() if "graph end" in line]
    log = tmp_path / "tp8_graphs.log"
    log.write_text(TP8_LOG.read_text() + "\n".join(graphs) + "\n")
    m = start(log)
    assert m.graph_gib == max(r.graph_gib for r in m.ranks) == 1.04
    plan = plan_json(capsys, EP8 + ["--calibrate", str(log)])
    line = next(x for x in plan["explanation"] if "CUDA graphs took" in x)
    outside = plan["calibrated"]["free_before_weights_gib"] * (1 - plan["mem_fraction_static"])
    assert "1.04 GiB" in line and f"{outside:.2f} GiB outside the static pool" in line


def test_a_start_measured_on_a_larger_gpu_is_refused_as_calibration(capsys, tmp_path):
    """More free memory before weights than the planned GPU holds: another GPU's start."""
    h200 = tmp_path / "h200.log"
    h200.write_text(TP8_LOG.read_text().replace("avail mem=94.00 GB", "avail mem=137.00 GB"))
    assert cli_main(EP8 + ["--calibrate", str(h200)]) == 2
    err = capsys.readouterr().err
    assert str(h200) in err and "free_before_weights_gib" in err and "137.00" in err
