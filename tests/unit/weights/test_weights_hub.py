"""The product's Hub side against the lab's Hub stand-in (lab/hub) on loopback, with the
product's own Hub client (hub_client.py) doing every request: ``gpuserve plan --hf`` (headers only),
``gpuserve weights`` (the host script's fetch: verify, resume after a cut, refetch of a
corrupted file, a rerun that downloads nothing), and the bad inputs (no safetensors, an
index naming a missing shard, a truncated header, a bare 404). The stand-in's counters
(``/_lab/stats``) show what crossed the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.hub.server import control as lab_control

hf = pytest.importorskip("huggingface_hub")
hub_mod = pytest.importorskip("lab.hub.server")

from gpuserve.cli import main  # noqa: E402
from gpuserve.commands.weights import fetch_module  # noqa: E402
from gpuserve.errors import InputError  # noqa: E402
from gpuserve.launch.hf_source import HfSource  # noqa: E402
from gpuserve.memory.remote import Where, read_remote  # noqa: E402
from lab.hub import publish  # noqa: E402

TINY = "gpuserve-lab/Tiny-Llama-3L"
SHARD2 = "model-00002-of-00003.safetensors"
BROKEN = ["gpuserve-lab/No-Safetensors", "gpuserve-lab/Missing-Shard",
          "gpuserve-lab/Truncated-Header"]


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory) -> Path:
    mirror = tmp_path_factory.mktemp("mirror")
    publish.publish(mirror, [TINY, *BROKEN])
    return publish.hub_root(mirror)


@pytest.fixture
def hub(hub_root):
    with hub_mod.HubServer(hub_root, prefix="/hub") as server:
        yield server


def control(hub, what: str, body: dict | None = None):
    return lab_control(hub.url, what, body, timeout=10)


def main_commit(hub, repo: str = TINY) -> str:
    return control(hub, "repos", {})[repo]["branches"]["main"]


def shard_gets(hub) -> dict[str, dict]:
    return {k.split("/", 2)[2]: v for k, v in control(hub, "stats")["files"].items()
            if k.endswith(".safetensors")}


def where(hub) -> Where:
    return Where("p.yaml:3", "model.hf", "inventory.py", "hf_endpoint", hub.url)


def test_plan_hf_reads_headers_only_and_equals_the_downloaded_checkpoint(hub, tmp_path,
                                                                         capsys):
    commit = main_commit(hub)
    assert main(["plan", "--hf", f"{TINY}@{commit}", "--hf-endpoint", hub.url,
                 "--gpus", "2xH200", "--tp", "2", "--json"]) == 0
    remote = json.loads(capsys.readouterr().out)
    stats = shard_gets(hub)
    # huggingface_hub's own order: a HEAD finds no model.safetensors, then the index
    single = stats.pop("model.safetensors")
    assert (single["head"], single["get_full"], single["get_ranged"]) == (1, 0, 0)
    assert len(stats) == 3 and all(s["get_full"] == 0 for s in stats.values())
    assert all(s["head"] == 0 for s in stats.values())  # a shard's HEAD would hash it
    assert not [r for r in control(hub, "stats")["requests"] if r["kind"] == "tree"]
    assert all(s["bytes"] <= 100_001 * s["get_ranged"] for s in stats.values())
    # the same checkpoint downloaded and verified, then planned from the local headers
    assert main(["weights", "--hf", f"{TINY}@{commit}", "--hf-endpoint", hub.url,
                 str(tmp_path)]) == 0
    capsys.readouterr()
    local_dir = tmp_path / TINY.replace("/", "--") / commit
    assert main(["plan", "--model-dir", str(local_dir), "--gpus", "2xH200", "--tp", "2",
                 "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert remote["weights_gib"] == local["weights_gib"] > 0
    assert remote["weights"] == local["weights"] and remote["kv_tokens"] == local["kv_tokens"]


def test_fetch_resumes_after_a_cut_and_refetches_a_corrupted_file(hub, tmp_path):
    wf = fetch_module()
    commit = main_commit(hub)
    files = {f.path: f for f in read_remote(HfSource(TINY, commit), where(hub), None,
                                            headers=False).files}
    size = files[SHARD2].size
    # every byte received is written to the partial file: a cut halfway resumes there
    # with a Range request
    control(hub, "faults", {"kind": "cut", "repo": TINY, "file": SHARD2,
                            "after": size // 2})
    control(hub, "faults", {"kind": "corrupt", "repo": TINY,
                            "file": "model-00001-of-00003.safetensors", "offset": 4096})
    control(hub, "stats/reset", {})
    target = str(tmp_path / "m" / commit)
    (tmp_path / "m").mkdir()
    reports: list[dict] = []
    marker = wf.fetch(TINY, commit, target, endpoint=hub.url, report=reports.append)
    assert marker["refetched"] == ["model-00001-of-00003.safetensors"]
    assert wf.verify(target, marker["files"]) == []
    stats = shard_gets(hub)
    # the cut file was resumed with a ranged GET, not fetched again from byte 0
    assert stats[SHARD2]["get_ranged"] >= 1 and stats[SHARD2]["bytes"] < 1.5 * size
    assert stats["model-00001-of-00003.safetensors"]["get_full"] == 2
    assert not Path(target + ".partial").exists()
    assert any(r.get("phase") == "refetch" for r in reports)
    # a rerun: present, verified by its marker, no request at all
    control(hub, "stats/reset", {})
    again = wf.fetch(TINY, commit, target, endpoint=hub.url, report=reports.append)
    assert again["commit"] == commit and control(hub, "stats")["requests"] == []


def test_disk_too_small_is_refused_before_any_weight_byte(hub, tmp_path, monkeypatch):
    wf = fetch_module()
    commit = main_commit(hub)
    control(hub, "stats/reset", {})
    real = wf.shutil.disk_usage
    monkeypatch.setattr(wf.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=10 * 1024 * 1024))
    with pytest.raises(wf.Refused) as e:
        wf.fetch(TINY, commit, str(tmp_path / commit), endpoint=hub.url)
    assert e.value.code == wf.EXIT_DISK and "nothing was downloaded" in str(e.value)
    assert all(s["get_full"] == 0 for s in shard_gets(hub).values())


@pytest.mark.parametrize("repo, file, field, words", [
    ("gpuserve-lab/No-Safetensors", "p.yaml:3", "model.hf", "neither model.safetensors"),
    ("gpuserve-lab/Missing-Shard", "/model.safetensors.index.json", "weight_map",
     "names shard 'model-00003-of-00003.safetensors'"),
    ("gpuserve-lab/Truncated-Header", f"/{SHARD2}", "header", ""),
])
def test_bad_repositories_name_file_and_field(hub, repo, file, field, words):
    commit = main_commit(hub, repo)
    with pytest.raises(InputError) as e:
        read_remote(HfSource(repo, commit), where(hub), None)
    assert e.value.file.endswith(file) and e.value.field == field and words in e.value.message


def test_a_bare_404_names_the_endpoint(hub):
    commit = main_commit(hub)
    control(hub, "faults", {"kind": "bare404", "repo": TINY, "times": 100})
    with pytest.raises(InputError) as e:
        read_remote(HfSource(TINY, commit), where(hub), None)
    control(hub, "faults/clear", {})
    assert (e.value.file, e.value.field) == ("inventory.py", "hf_endpoint")
    assert "404 without X-Error-Code" in e.value.message
