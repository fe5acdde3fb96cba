"""One planner path: the shards' safetensors headers, as hub_client reads them, become
the very scan document the local checkpoint scan gives, so ``check_fit`` and ``gpuserve
plan`` plan a Hub checkpoint exactly as the downloaded one. The headers here are read
from the composed files by the safetensors format (8-byte length, JSON); the HTTP side
is exercised against the lab's Hub stand-in (tests/unit/weights/test_weights_hub.py).
Also: hub_client's errors (an HTTP answer with the Hub's X-Error-Code, a truncated
header) turned into errors naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.hf_source import HfSource
from gpuserve.launch.profiles import load_profile
from gpuserve.memory.checkpoint import parse_scan, scan_directory
from gpuserve.memory.preflight import check_fit
from gpuserve.memory.remote import Where, hub_errors, hub_module, scan_document
from tests.checkpoints import compose_tool

HUB = hub_module()

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


def _header(path: Path) -> dict:
    with path.open("rb") as f:  # the header only: the data is sparse
        return json.loads(f.read(int.from_bytes(f.read(8), "little")))


def _remote_doc(directory: Path) -> dict:
    shards = {p.name: _header(p) for p in sorted(directory.glob("*.safetensors"))}
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


def test_a_truncated_header_names_the_shard():
    """hub_client's refusal of a shard cut inside its header names the Hub file and its
    header."""
    where = Where("p.yaml", "model.hf", "inventory.py", "hf_endpoint", None)
    src = HfSource("Qwen/mini", "0" * 40)
    with pytest.raises(InputError) as e, hub_errors(where, src, "s.safetensors"):
        raise HUB.HubError("header", "truncated: fewer than 8 bytes")
    assert e.value.file == f"hf:Qwen/mini@{'0' * 40}/s.safetensors"
    assert e.value.field == "header" and "truncated" in e.value.message


def _raise(status: int, url: str, headers: dict | None = None) -> None:
    code = (headers or {}).get("X-Error-Code")
    raise HUB.HubError("http", f"HTTP {status}", status=status, code=code)


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
    ("GatedRepo", "model.hf", "profiles/x.yaml:3", "gated"),
])
def test_hub_error_codes_name_what_to_fix(code, field, file, words):
    with pytest.raises(InputError) as e, hub_errors(WHERE, SRC, "x.safetensors"):
        _raise(404, URL, {"X-Error-Code": code})
    assert (e.value.file, e.value.field) == (file, field) and words in e.value.message
