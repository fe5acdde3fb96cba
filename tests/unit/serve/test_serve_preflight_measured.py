"""The serve preflight calibrated by the host's own measured start (gpuserve.start/1
records under host data ``results_dir``, gpuserve/measure/starts.py): the last start of
the same checkpoint and SGLang version decides, others are ignored; a launch it refuses
is refused naming the measured figures, one that fits shows its margin.

The measured start is tests/fixtures/logs/fieldnote_glm5_tp8.log (SGLang 0.5.23's line
formats with the field notes' TP8 figures: 94 GiB free before weights, 21.7 after); the
checkpoint is GLM-5 NVFP4's composed one (tests/checkpoints.py), whose headers alone put
some 38 GiB free after TP8's weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuserve.facts.host import ModelCheckpoint
from gpuserve.launch.lock_choice import HostRuntime, PreflightError
from gpuserve.measure.starts import (
    Checkpoint,
    StartSpec,
    checkpoint_digest,
    from_log,
    write_start,
)
from gpuserve.memory.checkpoint import parse_scan
from gpuserve.memory.startup_log import read_log
from tests import bounded
from tests.checkpoints import compose_record_once
from tests.serve_plans import plan_of
from tests.unit.serve.test_serve_preflight import assert_readable

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
GPUS = tuple(BOX["gpus"])
TP8_LOG = REPO / "tests/fixtures/logs/fieldnote_glm5_tp8.log"
EP8 = REPO / "profiles/glm5-nvfp4-tp8-ep8.yaml"
LAUNCH = {"profile": "glm5-nvfp4-tp8", "tp": 8, "ep": 1}


def runtime(home: str) -> HostRuntime:
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=len(GPUS),
                       gpu_list=GPUS)


@pytest.fixture(scope="module")
def glm5_dir(tmp_path_factory) -> Path:
    return compose_record_once("glm-5-nvfp4", tmp_path_factory.mktemp("models") / "GLM-5-NVFP4",
                          shards=20)


@pytest.fixture(scope="module")
def scan(glm5_dir):
    """What host.get_fact(ModelCheckpoint, path=...) returns, run in a local shell."""
    cmd = ModelCheckpoint().command(str(glm5_dir))
    text = bounded.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    return lambda path: text


@pytest.fixture(scope="module")
def version(scan) -> str:
    return plan_of({"profile": "glm5-nvfp4-tp8", "results_dir": ""}, "inv.py", runtime,
                      checkpoint=scan).version


def digest(scan) -> str:
    return checkpoint_digest([(f.name, f.size) for f in parse_scan(scan("")).files])


def measured(results: Path, stamp: str, version: str, checkpoint: Checkpoint,
             log: Path = TP8_LOG) -> Path:
    return write_start(
        results,
        from_log(
            read_log(log),
            StartSpec(results_dir="", sglang_version=version, checkpoint=checkpoint, launch=LAUNCH),
            host="gpu1",
            timestamp=stamp,
            server_start=stamp,
        ),
    )


def ep8_at(tmp: Path, fraction: float) -> str:
    path = tmp / f"ep8-mfs{int(fraction * 100)}.yaml"
    path.write_text(f"extends: {EP8}\nmemory:\n  mem_fraction_static: {fraction}\n")
    return str(path)


def plan(tmp: Path, profile: str, results: Path, scan):
    return plan_of({"profile": profile, "results_dir": str(results)}, "inv.py", runtime,
                      checkpoint=scan)


def test_ep8_at_0_78_is_refused_naming_the_host_s_measured_figures(tmp_path, scan, version):
    results = tmp_path / "results"
    measured(results, "2026-12-06T07:00:00Z", version, Checkpoint("/models/GLM-5-NVFP4",
                                                                  digest(scan)))
    with pytest.raises(PreflightError) as e:
        plan(tmp_path, ep8_at(tmp_path, 0.78), results, scan)
    msg = str(e.value)
    assert "does not fit" in msg and "21.70 GiB free after weights measured" in msg
    assert "16.2" in msg and "+- 1.50" in msg, msg
    assert "nothing on the host was changed" in msg
    assert_readable(msg, fix="set mem_fraction_static to 0.843 or more")


def test_without_a_measured_start_the_headers_alone_do_not_refuse_it(tmp_path, scan):
    p = plan(tmp_path, ep8_at(tmp_path, 0.78), tmp_path / "results", scan)
    assert not any("calibrated by this host" in line for line in p.preflight.info)


def test_ep8_at_0_83_proceeds_showing_its_margin(tmp_path, scan, version):
    results = tmp_path / "results"
    measured(results, "2026-12-06T07:00:00Z", version, Checkpoint("/models/GLM-5-NVFP4"))
    p = plan(tmp_path, ep8_at(tmp_path, 0.83), results, scan)
    text = "\n".join(p.preflight.info + p.preflight.warnings)
    assert "calibrated by this host's start of 2026-12-06T07:00:00Z" in text
    assert "margin +0.3" in text, text


def test_starts_of_another_checkpoint_or_version_are_ignored(tmp_path, scan, version):
    results = tmp_path / "results"
    measured(results, "2026-12-06T09:00:00Z", version,
             Checkpoint("/models/GLM-5-NVFP4", "sha256:" + "0" * 32))  # other files
    measured(results, "2026-12-06T10:00:00Z", "0.5.10.post1",
             Checkpoint("/models/GLM-5-NVFP4", digest(scan)))
    p = plan(tmp_path, ep8_at(tmp_path, 0.78), results, scan)  # not refused
    assert not any("calibrated by this host" in line for line in p.preflight.info)
    measured(results, "2026-12-06T08:00:00Z", version,
             Checkpoint("/models/GLM-5-NVFP4", digest(scan)))
    with pytest.raises(PreflightError, match=r"21.70 GiB free after weights measured\n"
                       r"\s+start record: \S+20261206T080000Z-start-glm5-nvfp4-tp8.json"):
        plan(tmp_path, ep8_at(tmp_path, 0.78), results, scan)


def test_the_plan_says_what_its_start_record_will_carry(tmp_path, scan, version):
    p = plan(tmp_path, ep8_at(tmp_path, 0.83), tmp_path / "results", scan)
    assert p.start is not None and p.start.sglang_version == version
    assert p.start.checkpoint == Checkpoint("/models/GLM-5-NVFP4", digest(scan))
    assert p.start.launch["ep"] == 8 and p.start.launch["mem_fraction_static"] == 0.83
    assert p.start.gpu["count"] == 8 and p.start.gpu["memory_total_mib"] == 97887
    off = plan_of({"profile": "glm5-nvfp4-tp8", "results_dir": ""}, "inv.py", runtime,
                     checkpoint=scan)
    assert off.start is None


def test_the_doctor_in_the_preflight_judges_the_same_calibrated_plan(tmp_path, scan,
                                                                     version):
    results = tmp_path / "results"
    measured(results, "2026-12-06T07:00:00Z", version, Checkpoint("/models/GLM-5-NVFP4"))
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": ep8_at(tmp_path, 0.78), "results_dir": str(results)},
                   "inv.py", runtime, checkpoint=scan, host_facts=lambda: BOX)
    # one problem, one refusal: the doctor's memory-plan finding would repeat the memory
    # fit's (the same calibrated plan), so only the memory fit's, with its fix, is shown
    msg = str(e.value)
    assert msg.count("does not fit") == 1 and "doctor error memory-plan" not in msg, msg
    assert_readable(msg, fix="set mem_fraction_static to 0.843 or more")
    p = plan_of({"profile": ep8_at(tmp_path, 0.83), "results_dir": str(results)},
                   "inv.py", runtime, checkpoint=scan, host_facts=lambda: BOX)
    risky = [w for w in p.preflight.warnings if "memory-plan-risky" in w]
    # the host's own start decides, not the record's two disagreeing public figures
    assert risky and "36.93" not in risky[0] and "inside the uncertainty" in risky[0], risky


def test_a_start_that_contradicts_the_host_is_skipped_with_a_warning(tmp_path, scan,
                                                                     version):
    """A record whose figures no card of the host holds (138 GiB free before weights on a
    96 GB card) measured something else: the deploy plans without it and says so, instead
    of failing on the record."""
    results = tmp_path / "results"
    record = from_log(
        read_log(TP8_LOG),
        StartSpec(
            results_dir="",
            sglang_version=version,
            checkpoint=Checkpoint("/models/GLM-5-NVFP4"),
            launch=LAUNCH,
        ),
        host="gpu1",
        timestamp="2026-12-06T07:00:00Z",
        server_start="2026-12-06T07:00:00Z",
    )
    ranks = tuple(dataclasses.replace(r, free_before_weights_gib=138.4) for r in record.ranks)
    write_start(results, dataclasses.replace(record, ranks=ranks))
    p = plan(tmp_path, ep8_at(tmp_path, 0.78), results, scan)  # planned without it
    assert not any("calibrated by this host" in line for line in p.preflight.info)
    assert any("cannot calibrate this launch" in w and "138.40" in w
               for w in p.preflight.warnings), p.preflight.warnings


def test_the_start_closest_to_the_new_launch_calibrates_it(tmp_path, scan, version):
    """A newer start of a drafting launch and an older plain one: a plain EP8 launch is
    planned from the plain start (the planner's delta bridges the least)."""
    results = tmp_path / "results"
    check = Checkpoint("/models/GLM-5-NVFP4")
    plain = {**LAUNCH, "attn_dp": 1, "moe_a2a_backend": None, "speculative": None}
    write_start(
        results,
        from_log(
            read_log(TP8_LOG),
            StartSpec(results_dir="", sglang_version=version, checkpoint=check, launch=plain),
            host="gpu1",
            timestamp="2026-12-06T07:00:00Z",
            server_start="2026-12-06T07:00:00Z",
        ),
    )
    write_start(
        results,
        from_log(
            read_log(TP8_LOG),
            StartSpec(
                results_dir="",
                sglang_version=version,
                checkpoint=check,
                launch={**plain, "speculative": "EAGLE3"},
            ),
            host="gpu1",
            timestamp="2026-12-06T09:00:00Z",
            server_start="2026-12-06T09:00:00Z",
        ),
    )
    p = plan(tmp_path, ep8_at(tmp_path, 0.83), results, scan)
    assert any("calibrated by this host's start of 2026-12-06T07:00:00Z" in line
               for line in p.preflight.info), p.preflight.info
