"""The serve deploy's preflight (gpuserve/serve/preflight.py) through plan_serve: memory
fit from a real-format checkpoint's headers (composed by tools/compose_checkpoint.py,
scanned by the very command the ModelCheckpoint fact runs on a host), and the doctor's
rules on a recorded host-facts document; refusals before any operation exists."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.facts.host import ModelCheckpoint
from gpuserve.launch.lock_choice import HostRuntime, PreflightError
from tests import bounded
from tests.checkpoints import compose_record_once
from tests.serve_plans import plan_of

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
GPUS = tuple(BOX["gpus"])  # 8x RTX PRO 6000 Blackwell Server Edition (recorded)
DOES_NOT_FIT = REPO / "tests/fixtures/profiles/lab-does-not-fit.yaml"


def runtime(gpus=GPUS):
    return lambda home: HostRuntime(name="gpu1", python="3.11.2", glibc="2.36",
                                    driver="580.126.20", cuda_toolkit="13.0",
                                    free_bytes=500 * 1024**3, gpus=len(gpus), gpu_list=gpus)


@pytest.fixture(scope="module")
def glm5_dir(tmp_path_factory) -> Path:
    return compose_record_once("glm-5-nvfp4", tmp_path_factory.mktemp("models") / "GLM-5-NVFP4",
                          shards=20)


def scan_on_host(directory: Path):
    """What host.get_fact(ModelCheckpoint, path=...) returns, run in a local shell."""
    calls = []

    def checkpoint(path: str) -> str:
        calls.append(path)
        cmd = ModelCheckpoint().command(str(directory))
        return bounded.run(["sh", "-c", cmd], capture_output=True, text=True,
                              check=True).stdout
    return checkpoint, calls


def test_fitting_profile_passes_and_says_why(glm5_dir):
    checkpoint, calls = scan_on_host(glm5_dir)
    p = plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", runtime(), checkpoint=checkpoint,
                   host_facts=lambda: BOX)
    assert calls == ["/models/GLM-5-NVFP4"]
    info = "\n".join(p.preflight.info)
    assert "weights 55.35 GiB/GPU from the checkpoint" in info
    assert "profile glm5-nvfp4-tp8 fits" in info
    assert not any("doctor error" in w for w in p.preflight.warnings)


def test_profile_that_cannot_fit_is_refused_with_the_fraction_that_would(glm5_dir):
    checkpoint, _ = scan_on_host(glm5_dir)
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": str(DOES_NOT_FIT)}, "inv.py", runtime(), checkpoint=checkpoint)
    msg = str(e.value)
    assert msg.startswith("gpu1: preflight: profile lab-does-not-fit does not fit")
    assert "memory.mem_fraction_static 0.500 leaves -8.70 GiB/GPU for the KV cache" in msg
    assert "nothing on the host was changed" in msg
    assert_readable(msg, fix="raise --mem-fraction-static to 0.718")


def assert_readable(msg: str, fix: str) -> None:
    """A refusal a person reads: a few lines, none over 200 characters before the fix,
    one minimum fraction below 1, no negative term written after a minus, one fix."""
    lines = msg.split("\n")
    fix_at = next(i for i, line in enumerate(lines) if line.strip().startswith("fix: "))
    assert len(lines) <= 8 and all(len(line) <= 200 for line in lines[:fix_at]), msg
    assert lines[fix_at].strip().startswith(f"fix: {fix}"), msg
    assert sum(line.strip().startswith("fix: ") for line in lines) == 1, msg
    minimums = re.findall(r"minimum viable\D*(\d+\.\d+)", msg)
    assert len(set(minimums)) <= 1 and all(float(m) < 1 for m in minimums), msg
    assert not re.search(r"-\s*-\s*\d", msg), msg
    suggested = re.findall(r"mem.fraction.static (?:to )?(\d+\.\d+)", msg)
    assert all(float(f) < 1 for f in suggested), msg


def test_weights_over_the_gpu_are_refused_without_a_fraction(glm5_dir, tmp_path):
    """GLM-5 NVFP4 at TP4 on 96 GB cards: 106.78 GiB/GPU of weights, -13.47 GiB free
    after them; no fraction fits, the refusal says what would instead."""
    tp4 = tmp_path / "tp4.yaml"
    tp4.write_text(f"extends: {REPO}/profiles/glm5-nvfp4-tp8.yaml\nparallel:\n  tp: 4\n")
    checkpoint, _ = scan_on_host(glm5_dir)
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": str(tp4)}, "inv.py", runtime(), checkpoint=checkpoint)
    msg = str(e.value)
    assert "free after weights -13.47 of 93.30 GiB/GPU" in msg, msg
    assert_readable(msg, fix="no mem_fraction_static fits (weights leave -13.47 GiB")
    assert "larger --tp" in msg and "minimum viable" not in msg, msg


def test_warn_mode_deploys_anyway_and_off_reads_nothing(glm5_dir):
    checkpoint, calls = scan_on_host(glm5_dir)
    p = plan_of({"profile": str(DOES_NOT_FIT), "preflight": "warn"}, "inv.py", runtime(),
                   checkpoint=checkpoint)
    assert any("does not fit" in w for w in p.preflight.warnings)
    calls.clear()
    p = plan_of({"profile": str(DOES_NOT_FIT), "preflight": "off"}, "inv.py", runtime(),
                   checkpoint=checkpoint)
    assert calls == [] and p.preflight.info == [] and p.preflight.warnings == []
    with pytest.raises(InputError, match="inv.py: preflight: must be one of enforce, warn, off"):
        plan_of({"profile": "glm5-nvfp4-tp8", "preflight": "maybe"}, "inv.py", runtime())


def test_truncated_header_is_refused_naming_the_file(glm5_dir, tmp_path):
    bad = tmp_path / "GLM-5-NVFP4"
    bad.mkdir()
    (bad / "config.json").write_bytes((glm5_dir / "config.json").read_bytes())
    shard = sorted(glm5_dir.glob("*.safetensors"))[0]
    with shard.open("rb") as f:
        (bad / shard.name).write_bytes(f.read(4000))  # 8-byte length + part of the header
    checkpoint, _ = scan_on_host(bad)
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", runtime(), checkpoint=checkpoint)
    assert shard.name in str(e.value) and "nothing on the host was changed" in str(e.value)


def test_directory_without_safetensors_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    checkpoint, _ = scan_on_host(tmp_path)
    with pytest.raises(PreflightError, match="safetensors"):
        plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", runtime(), checkpoint=checkpoint)


def test_no_gpu_visible_is_said_not_refused(glm5_dir):
    checkpoint, calls = scan_on_host(glm5_dir)
    p = plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", runtime(gpus=()),
                   checkpoint=checkpoint)
    assert calls == [] and any("no GPU visible" in w for w in p.preflight.warnings)


def test_doctor_errors_stop_and_warnings_print():
    four = copy.deepcopy(BOX)
    four["gpus"] = four["gpus"][:4]
    with pytest.raises(PreflightError, match="doctor error gpu-count: profile needs 8 GPUs"):
        plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", runtime(), host_facts=lambda: four)
    h200 = json.loads((REPO / "tests/fixtures/hostfacts/h200-nvlink.json").read_text())
    p = plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", runtime(), host_facts=lambda: h200)
    assert any("doctor warn nvfp4-weights-arch" in w for w in p.preflight.warnings)
