"""One planner path: huggingface_hub's parsed safetensors headers become the very scan
document the local checkpoint scan gives, so ``check_fit`` and ``gpuserve plan`` plan a
Hub checkpoint exactly as the downloaded one. The headers here are parsed by the real
client's own parser (``get_local_safetensors_metadata``, which shares
``_parse_safetensors_header`` with the remote ``parse_safetensors_file_metadata``);
the HTTP side is exercised against the lab's Hub stand-in (tests/lab/test_weights.py).
Also: huggingface_hub's own error mapping of real responses (``hf_raise_for_status``)
turned into errors naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.hf_source import HfSource
from gpuserve.launch.profiles import load_profile
from gpuserve.memory.checkpoint import parse_scan, scan_directory
from gpuserve.memory.preflight import check_fit
from gpuserve.memory.remote import Where, hub_errors, scan_document
from tests.checkpoints import compose_tool

hf = pytest.importorskip("huggingface_hub")

H200 = [{"name": "NVIDIA H200", "memory_total_mib": 143771, "compute_cap": "9.0"}] * 2


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    import yaml

    from gpuserve.memory.models import MODELS_DIR

    data = yaml.safe_load((MODELS_DIR / "qwen3-30b-a3b.yaml").read_text())
    out = tmp_path_factory.mktemp("hub") / "qwen-mini"
    compose_tool().compose({**data["config"], "num_hidden_layers": 2}, out, shards=3,
                           source="qwen3-30b-a3b (2 layers)")
    return out


def _remote_doc(directory: Path) -> dict:
    meta = hf.get_local_safetensors_metadata(directory)
    shards = dict(meta.files_metadata)
    config = json.loads((directory / "config.json").read_text())
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    return scan_document("hf:Qwen/mini@" + "0" * 40, config, None, index, shards)


def test_headers_give_the_local_scans_records(qwen):
    local = scan_directory(qwen)
    remote = parse_scan(json.dumps(_remote_doc(qwen)), "hub")
    assert remote.tensors == local.tensors
    assert [(f.name, f.tensors) for f in remote.files] == \
        [(f.name, f.tensors) for f in local.files]
    assert remote.index_total_size == local.index_total_size
    assert remote.total_bytes == local.total_bytes > 0


def test_the_preflight_plans_both_alike(qwen, tmp_path):
    prof = tmp_path / "mini.yaml"
    prof.write_text("model:\n  hf: Qwen/mini@" + "0" * 40 + "\nparallel:\n  tp: 2\n")
    profile = load_profile(prof)
    local = check_fit(profile, scan_directory(qwen), H200, "0.5.10.post1")
    remote = check_fit(profile, parse_scan(json.dumps(_remote_doc(qwen)), "hub"), H200,
                       "0.5.10.post1")
    assert remote.plan.weights_gib == pytest.approx(local.plan.weights_gib, rel=1e-12)
    assert remote.plan.kv_tokens == local.plan.kv_tokens and remote.ok == local.ok


def test_a_truncated_header_names_the_shard(qwen, tmp_path):
    """A shard cut inside its header: the client's parser refuses it, and the error
    names the Hub file and its header."""
    bad = tmp_path / "bad"
    bad.mkdir()
    shard = sorted(qwen.glob("*.safetensors"))[0]
    raw = shard.read_bytes()
    (bad / shard.name).write_bytes(raw[: 8 + 40])  # the length says more
    where = Where("p.yaml", "model.hf", "inventory.py", "hf_endpoint", None)
    src = HfSource("Qwen/mini", "0" * 40)
    with pytest.raises(InputError) as e, hub_errors(where, src, shard.name):
        hf.parse_local_safetensors_file_metadata(bad / shard.name)
    assert e.value.file == f"hf:Qwen/mini@{'0' * 40}/{shard.name}"
    assert e.value.field == "header"


def _response(status: int, url: str, headers: dict | None = None):
    from huggingface_hub.utils import _http

    httpx = _http.httpx2 if hasattr(_http, "httpx2") else _http.httpx
    request = httpx.Request("HEAD", url)
    return httpx.Response(status, request=request, headers=headers or {})


def _raise(status: int, url: str, headers: dict | None = None) -> None:
    from huggingface_hub.utils import hf_raise_for_status

    hf_raise_for_status(_response(status, url, headers))


WHERE = Where("profiles/x.yaml:3", "model.hf", "inventory/lab.py", "hf_endpoint",
              "http://mirror.internal")
SRC = HfSource("org/name", "1" * 40)
URL = "http://mirror.internal/org/name/resolve/" + "1" * 40 + "/model.safetensors"


def test_404_without_x_error_code_names_the_endpoint_key():
    with pytest.raises(InputError) as e, hub_errors(WHERE, SRC):
        _raise(404, URL)
    assert (e.value.file, e.value.field) == ("inventory/lab.py", "hf_endpoint")
    assert "404 without X-Error-Code" in e.value.message and "mirror.internal" in e.value.message


@pytest.mark.parametrize("code, field, file, words", [
    ("EntryNotFound", None, f"hf:org/name@{'1' * 40}/x.safetensors", "not in the repository"),
    ("RevisionNotFound", "model.hf", "profiles/x.yaml:3", "no revision"),
    ("RepoNotFound", "model.hf", "profiles/x.yaml:3", "no repository org/name"),
])
def test_hub_error_codes_name_what_to_fix(code, field, file, words):
    with pytest.raises(InputError) as e, hub_errors(WHERE, SRC, "x.safetensors"):
        _raise(404, URL, {"X-Error-Code": code})
    assert (e.value.file, e.value.field) == (file, field) and words in e.value.message


def test_not_a_safetensors_repo_names_model_hf():
    with pytest.raises(InputError) as e, hub_errors(WHERE, SRC):
        raise hf.errors.NotASafetensorsRepoError("'org/name' is not a safetensors repo.")
    assert e.value.field == "model.hf" and "safetensors checkpoints only" in e.value.message
