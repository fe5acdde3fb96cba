"""plan_serve with a ``model.hf`` profile: the preflight plans from the Hub's headers
(the shards' raw headers turned into the local scan's records), a profile that
cannot fit is refused before any operation exists, a revision complete on the host is
planned from its directory without a Hub call, and the unit points at the revision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.lock_choice import HostRuntime, PreflightError
from gpuserve.memory.checkpoint import scan_directory
from gpuserve.memory.remote import RemoteCheckpoint, RepoFile, scan_document
from tests.checkpoints import compose_record_once
from tests.serve_plans import plan_of

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
COMMIT = "5" * 40
TARGET = f"/opt/gpuserve/models/zai-org--GLM-5-NVFP4/{COMMIT}"


def runtime(home):
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8,
                       gpu_list=tuple(BOX["gpus"]))


@pytest.fixture(scope="module")
def glm5(tmp_path_factory) -> Path:
    return compose_record_once("glm-5-nvfp4", tmp_path_factory.mktemp("hub") / "GLM-5-NVFP4",
                          shards=20)


@pytest.fixture(scope="module")
def remote_doc(glm5) -> dict:
    shards = {}
    for shard in sorted(glm5.glob("*.safetensors")):
        with shard.open("rb") as f:  # the header only: the data is sparse and large
            shards[shard.name] = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    index = json.loads((glm5 / "model.safetensors.index.json").read_text())
    quant = glm5 / "hf_quant_config.json"
    return scan_document(f"hf:zai-org/GLM-5-NVFP4@{COMMIT}",
                         json.loads((glm5 / "config.json").read_text()),
                         json.loads(quant.read_text()) if quant.exists() else None,
                         index, shards)


def _profile(tmp_path: Path, mfs: float | None = None) -> Path:
    p = tmp_path / "glm5-hf.yaml"
    p.write_text(f"extends: {REPO}/profiles/glm5-nvfp4-tp8.yaml\nmodel:\n  path: null\n"
                 f"  hf: zai-org/GLM-5-NVFP4@{COMMIT}\n"
                 + (f"memory:\n  mem_fraction_static: {mfs}\n" if mfs else ""))
    return p


class Reads:
    def __init__(self, doc: dict, glm5: Path, complete: bool, free: int = 10**13):
        self.doc, self.glm5, self.complete, self.free = doc, glm5, complete, free
        self.hub: list[bool] = []
        self.scanned: list[str] = []

    def remote(self, source, where, token, headers=True, files=True, max_files=None,
               timeout=None):
        self.hub.append("headers" if headers else "files")
        size = sum(f.stat().st_size for f in self.glm5.iterdir())
        listed = (RepoFile("all", size, "0" * 64, "0" * 40),) if files else ()
        return RemoteCheckpoint(source, COMMIT, listed, self.doc if headers else None)

    def state(self, target, ref, models_dir):
        return json.dumps({"schema": "gpuserve.weights/1", "complete": self.complete,
                           "free_bytes": self.free, "staged_bytes": 0, "recorded": None})

    def checkpoint(self, path):
        self.scanned.append(path)
        scan = scan_directory(self.glm5)
        return json.dumps({"schema": "gpuserve.checkpoint_scan/1", "dir": path,
                           "config": scan.config, "hf_quant_config": scan.hf_quant_config,
                           "files": [{"name": f.name, "size": f.size, "tensors": f.tensors}
                                     for f in scan.files],
                           "tensors": [[t.pattern, t.dtype, t.count, t.nbytes, list(t.shape)]
                                       for t in scan.tensors], "errors": []})


def _plan(tmp_path, reads: Reads, mfs=None, **data):
    return plan_of({"profile": str(_profile(tmp_path, mfs)), **data}, "inv.py", runtime,
                      checkpoint=reads.checkpoint, host_facts=lambda: BOX,
                      weights_state=reads.state, remote=reads.remote)


def test_first_deploy_plans_from_the_hub_headers_and_points_the_unit_at_the_revision(
        tmp_path, remote_doc, glm5):
    reads = Reads(remote_doc, glm5, complete=False)
    plan = _plan(tmp_path, reads)
    # headers for the preflight, then the file list; nothing on the host to scan yet
    assert reads.hub == ["headers", "files"] and reads.scanned == []
    info = "\n".join(plan.preflight.info)
    assert f"weights 55.35 GiB/GPU from the checkpoint (hf:zai-org/GLM-5-NVFP4@{COMMIT}" in info
    assert plan.weights is not None and plan.weights.target == TARGET
    assert not plan.weights.complete and plan.weights.to_fetch > 0
    assert f"--model-path {TARGET}" in plan.service.env_text
    assert "--served-model-name" in plan.service.env_text


def test_a_profile_that_cannot_fit_is_refused_from_the_headers(tmp_path, remote_doc, glm5):
    reads = Reads(remote_doc, glm5, complete=False)
    with pytest.raises(PreflightError) as e:
        _plan(tmp_path, reads, mfs=0.5)
    assert "does not fit" in str(e.value) and "nothing on the host was changed" in str(e.value)
    assert reads.hub == ["headers"]  # refused before the file list is even read


def test_disk_too_small_is_refused_before_any_change(tmp_path, remote_doc, glm5):
    reads = Reads(remote_doc, glm5, complete=False, free=10 * 1024**3)
    with pytest.raises(PreflightError) as e:
        _plan(tmp_path, reads)
    assert str(e.value).startswith("disk: /opt/gpuserve/models has 10.00 GiB")


def test_a_complete_revision_is_planned_from_the_host_without_a_hub_call(tmp_path,
                                                                          remote_doc, glm5):
    reads = Reads(remote_doc, glm5, complete=True)
    plan = _plan(tmp_path, reads)
    assert reads.hub == [] and reads.scanned == [TARGET] and plan.weights.complete
    assert "weights 55.35 GiB/GPU from the checkpoint" in "\n".join(plan.preflight.info)


def test_check_without_host_or_hub_checks_the_host_data_only(tmp_path):
    plan = plan_of({"profile": str(_profile(tmp_path))}, "inv.py", runtime)
    assert plan.weights is None
    with pytest.raises(InputError) as e:
        plan_of({"profile": str(_profile(tmp_path)), "models_dir": "rel"}, "inv.py",
                   runtime)
    assert e.value.field == "models_dir"


def test_first_batch_knows_a_pinned_revision_directory(tmp_path):
    from gpuserve.plans.serve import read_input

    inputs = read_input({"profile": str(_profile(tmp_path)), "models_dir": "/srv/m"}, "inv.py")
    target = f"/srv/m/zai-org--GLM-5-NVFP4/{COMMIT}"
    assert inputs.weights_target == (target, "/srv/m")
    assert inputs.checkpoint_path == target
    assert read_input({"profile": "glm5-nvfp4-tp8"}, "inv.py").weights_target is None
