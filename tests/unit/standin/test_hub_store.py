"""The Hub stand-in's repository store (lab/hub/store.py, publish.py): reruns are
no-ops, commit ids follow content, lazy files are hashed on the first request that needs
their id (and only then), nested paths and private repositories as the real client sees
them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, hf_hub_download  # noqa: E402
from huggingface_hub.errors import RepositoryNotFoundError  # noqa: E402

from lab.hub import publish, store  # noqa: E402
from lab.hub.server import HubServer  # noqa: E402

SMALL = ["gpuserve-lab/Tiny-Llama-3L", "gpuserve-lab/Truncated-Header"]


def test_publish_rerun_is_a_noop_and_commit_ids_follow_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert publish.publish(a, SMALL) == SMALL
    assert publish.publish(a, SMALL) == []  # inputs unchanged: nothing recomposed
    publish.publish(b, SMALL)
    for name in SMALL:
        ra = store.Repo(publish.hub_root(a), name)
        rb = store.Repo(publish.hub_root(b), name)
        assert ra.commit_ids() == rb.commit_ids()
        assert all(len(c) == 40 for c in ra.commit_ids())
    tiny = store.Repo(publish.hub_root(a), SMALL[0])
    first, later = tiny.commit_ids()
    assert tiny.commit(later).parent == first and tiny.branches == {"main": first}
    changed = {p for p, e in tiny.commit(later).files.items()
               if e.blob != tiny.commit(first).files[p].blob}
    assert changed == {"generation_config.json"}
    # the broken copy shares the good shards by hard link, never writes into them
    broken = store.Repo(publish.hub_root(a), SMALL[1])
    c = broken.commit(broken.commit_ids()[0])
    shard = "model-00002-of-00003.safetensors"
    assert c.files[shard].size < tiny.commit(first).files[shard].size
    assert tiny.file_path(first, shard).stat().st_nlink >= 2


def _repo(root: Path, repo_id: str, files: dict[str, bytes], access: str = "public",
          token: str | None = None) -> str:
    tree = root / repo_id / ".staging"
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    (tree / ".gitattributes").write_text(store.GITATTRIBUTES)
    commit = store.write_commit(root / repo_id, tree, title="t", date="2026-01-05T00:00:00.000Z",
                                parent=None, eager_max=0)  # nothing hashed at publish
    meta = {"id": repo_id, "access": access, "created": "2026-01-05T00:00:00.000Z",
            "branches": {"main": commit},
            "commits": [{"id": commit, "parent": None, "title": "t",
                         "date": "2026-01-05T00:00:00.000Z"}]}
    if token:
        meta["token_sha256"] = store.token_digest(token)
    store.write_repo_json(root / repo_id, meta)
    return commit


def _safetensors(data: bytes) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [len(data)],
                               "data_offsets": [0, len(data)]}}).encode()
    header = header.ljust(-(-len(header) // 8) * 8)  # padded to 8 bytes
    return len(header).to_bytes(8, "little") + header + data


def test_lazy_files_are_hashed_on_the_first_request_that_needs_their_id(tmp_path):
    weights = _safetensors(bytes(range(256)) * 4096)
    commit = _repo(tmp_path, "org/lazy", {"w.safetensors": weights, "sub/dir/a b.json": b"{}"})
    hashes = tmp_path / "org/lazy/commits" / f"{commit}.hashes.json"
    with HubServer(tmp_path, prefix="/hub") as hub:
        api = HfApi(endpoint=hub.url, token=False)
        meta = api.model_info("org/lazy")  # no blobs: nothing to hash
        assert {s.rfilename for s in meta.siblings} == {".gitattributes", "w.safetensors",
                                                         "sub/dir/a b.json"}
        assert not hashes.exists()
        deep = [f.path for f in api.list_repo_tree("org/lazy", path_in_repo="sub",
                                                   recursive=True)]
        assert deep == ["sub/dir", "sub/dir/a b.json"]
        path = hf_hub_download("org/lazy", "sub/dir/a b.json", endpoint=hub.url,
                               cache_dir=tmp_path / "cache", token=False)
        assert Path(path).read_bytes() == b"{}"
        assert set(json.loads(hashes.read_text())) == {"sub/dir/a b.json"}  # listed, HEADed
        meta = api.parse_safetensors_file_metadata("org/lazy", "w.safetensors")
        assert meta.parameter_count == {"U8": 256 * 4096}  # ranged GETs ...
        assert set(json.loads(hashes.read_text())) == {"sub/dir/a b.json"}  # ... hash nothing
        top = {f.path: type(f).__name__ for f in api.list_repo_tree("org/lazy")}
        assert top == {"sub": "RepoFolder", ".gitattributes": "RepoFile",
                       "w.safetensors": "RepoFile"}
        assert set(json.loads(hashes.read_text())) == {
            "sub/dir/a b.json", ".gitattributes", "w.safetensors"}
        path = hf_hub_download("org/lazy", "w.safetensors", endpoint=hub.url,
                               cache_dir=tmp_path / "cache", token=False)
    got = json.loads(hashes.read_text())
    assert got["w.safetensors"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert Path(path).parent.parent.name == "snapshots"


def test_private_repository_reads_as_missing_without_its_token(tmp_path):
    _repo(tmp_path, "org/private", {"config.json": b"{}"}, access="private", token="t0k")
    with HubServer(tmp_path) as hub:
        with pytest.raises(RepositoryNotFoundError) as anon:
            HfApi(endpoint=hub.url, token=False).model_info("org/private")
        with pytest.raises(RepositoryNotFoundError) as wrong:
            HfApi(endpoint=hub.url, token="nope").model_info("org/private")
        assert (anon.value.response.status_code, wrong.value.response.status_code) == (401, 404)
        assert HfApi(endpoint=hub.url, token="t0k").model_info("org/private").private is True
