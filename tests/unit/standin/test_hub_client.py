"""The lab's Hub stand-in (lab/hub) answering the REAL huggingface_hub client, on loopback.

Every call here is huggingface_hub's own (snapshot_download, hf_hub_download, HfApi);
the stand-in's counters (GET /hub/_lab/stats) show what crossed the wire."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lab.hub.server import control as lab_control

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    NotASafetensorsRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)

from lab.hub import publish, store  # noqa: E402
from lab.hub.server import HubServer  # noqa: E402

TINY = "gpuserve-lab/Tiny-Llama-3L"
SINGLE = "gpuserve-lab/Tiny-Llama-1L-single"
GLM = "gpuserve-lab/GLM-5-NVFP4"
GATED = "gpuserve-lab/Tiny-Llama-3L-gated"
TOKEN = "lab-hub-token-not-a-secret-0001"
SHARD1 = "model-00001-of-00003.safetensors"
#: huggingface_hub's header reads wait 10 s by default; the stand-in answers in this
#: process, which a loaded CI machine can starve that long (80 shards' reads): what is
#: asserted is which requests were made, not how fast they were answered
HEADER_TIMEOUT = 120


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory) -> Path:
    mirror = tmp_path_factory.mktemp("mirror")
    publish.publish(mirror)
    return publish.hub_root(mirror)


@pytest.fixture
def hub(hub_root):
    # mounted under /hub as on the lab mirror: HF_ENDPOINT with a path prefix
    with HubServer(hub_root, prefix="/hub") as server:
        yield server


def control(hub, what: str, body: dict | None = None):
    return lab_control(hub.url, what, body, timeout=10)


def files_served(hub) -> dict:
    return control(hub, "stats")["files"]


def served_bytes(hub_root: Path, repo: str, path: str, rev: str | None = None) -> bytes:
    r = store.Repo(hub_root, repo)
    return r.file_path(rev or r.branches["main"], path).read_bytes()


def api(hub, token=False) -> HfApi:
    return HfApi(endpoint=hub.url, token=token)


def test_snapshot_dry_run_then_download_then_rerun_fetches_nothing(hub, hub_root, tmp_path):
    main = store.Repo(hub_root, TINY).branches["main"]
    plan = snapshot_download(TINY, endpoint=hub.url, cache_dir=tmp_path, dry_run=True,
                             token=False)
    sizes = {p.filename: p.file_size for p in plan}
    commit = store.Repo(hub_root, TINY).commit(main)
    assert sizes == {path: e.size for path, e in commit.files.items()}
    assert all(p.will_download and p.commit_hash == main for p in plan)
    assert not any(f["get_full"] for f in files_served(hub).values())  # a dry run: HEADs only

    folder = Path(snapshot_download(TINY, endpoint=hub.url, cache_dir=tmp_path, token=False))
    assert folder.name == main
    for path, entry in commit.files.items():
        data = (folder / path).read_bytes()
        assert len(data) == entry.size
        if entry.lfs:
            assert hashlib.sha256(data).hexdigest() == entry.sha256
        else:
            assert store.git_blob_sha1(data) == entry.blob

    control(hub, "stats/reset", {})
    again = snapshot_download(TINY, revision=main, endpoint=hub.url, cache_dir=tmp_path,
                              token=False)
    assert Path(again) == folder
    assert control(hub, "stats")["requests"] == []  # pinned and complete: no Hub call at all
    plan = snapshot_download(TINY, revision=main, endpoint=hub.url, cache_dir=tmp_path,
                             dry_run=True, token=False)
    assert not any(p.will_download for p in plan)


def test_download_cut_midway_resumes_with_a_range(hub, hub_root, tmp_path, caplog):
    # the client writes whole 10 MiB chunks (DOWNLOAD_CHUNK_SIZE): a cut after the first
    # one resumes from its end; a cut before it restarts from byte 0
    chunk = hf.constants.DOWNLOAD_CHUNK_SIZE
    size = len(served_bytes(hub_root, TINY, SHARD1))
    assert chunk < 11_000_000 < size
    control(hub, "faults", {"kind": "cut", "repo": TINY, "file": SHARD1, "after": 11_000_000})
    with caplog.at_level(logging.WARNING, logger="huggingface_hub"):
        path = hf_hub_download(TINY, SHARD1, endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert "Trying to resume download" in caplog.text
    assert Path(path).read_bytes() == served_bytes(hub_root, TINY, SHARD1)
    gets = [r for r in control(hub, "stats")["requests"]
            if r["file"] == SHARD1 and r["method"] == "GET"]
    assert [(g["range"], g["bytes"]) for g in gets] == [
        (None, 11_000_000), (f"bytes={chunk}-", size - chunk)]
    assert gets[0]["fault"] == "cut at 11000000" and gets[1]["status"] == 206


def test_corrupted_bytes_are_caught_by_the_checksums_and_a_refetch_fixes_them(hub, tmp_path):
    control(hub, "faults", {"kind": "corrupt", "repo": TINY, "file": SHARD1})
    api(hub).snapshot_download(TINY, local_dir=tmp_path)
    first = api(hub).verify_repo_checksums(TINY, local_dir=tmp_path)
    assert [m["path"] for m in first.mismatches] == [SHARD1]
    hf_hub_download(TINY, SHARD1, endpoint=hub.url, local_dir=tmp_path, force_download=True,
                    token=False)
    again = api(hub).verify_repo_checksums(TINY, local_dir=tmp_path)
    assert again.mismatches == [] and again.missing_paths == []


def test_info_and_tree_hashes_are_those_of_the_served_bytes(hub, hub_root):
    info = api(hub).model_info(TINY, files_metadata=True)
    tree = {f.path: f for f in api(hub).list_repo_tree(TINY, recursive=True, expand=True)}
    assert {s.rfilename for s in info.siblings} == set(tree)
    for s in info.siblings:
        data = served_bytes(hub_root, TINY, s.rfilename)
        assert s.size == tree[s.rfilename].size == len(data)
        if s.rfilename.endswith(".safetensors"):
            sha = hashlib.sha256(data).hexdigest()
            assert s.lfs.sha256 == tree[s.rfilename].lfs.sha256 == sha
            pointer = store.lfs_pointer(sha, len(data))
            assert s.blob_id == tree[s.rfilename].blob_id == store.git_blob_sha1(pointer)
            assert s.lfs.pointer_size == len(pointer)
        else:
            assert s.lfs is None and tree[s.rfilename].lfs is None
            assert s.blob_id == tree[s.rfilename].blob_id == store.git_blob_sha1(data)
        assert tree[s.rfilename].last_commit.oid == info.sha
    assert info.sha == store.Repo(hub_root, TINY).branches["main"]


def test_tree_pages_follow_the_link_header(hub_root):
    with HubServer(hub_root, prefix="/hub", page_size=4) as small:
        files = HfApi(endpoint=small.url, token=False).list_repo_files(TINY)
        pages = [r for r in small.hub.state.stats()["requests"] if r["kind"] == "api"]
    assert len(files) == len(store.Repo(hub_root, TINY).commit(
        store.Repo(hub_root, TINY).branches["main"]).files) == 11
    assert len(pages) == 3  # 11 entries, 4 a page


def test_sharded_header_read_fetches_headers_only(hub, hub_root):
    meta = api(hub).get_safetensors_metadata(GLM, timeout=HEADER_TIMEOUT)
    stats = files_served(hub)
    shards = sorted({*meta.weight_map.values()})
    assert len(shards) == 80 and meta.sharded
    for shard in shards:
        f = stats[f"{GLM}/{shard}"]
        shard_file = store.Repo(hub_root, GLM).file_path(meta_commit(hub_root, GLM), shard)
        with shard_file.open("rb") as fh:
            header = struct.unpack("<Q", fh.read(8))[0]
        assert f["get_full"] == 0 and f["head"] == 0 and f["get_ranged"] in (1, 2)
        assert f["bytes"] <= 100_001 + header + 8
    # most GLM-5 headers are over the client's first 100 kB read: a second ranged GET
    assert sum(stats[f"{GLM}/{s}"]["get_ranged"] == 2 for s in shards) == 75
    total = sum(f["bytes"] for f in stats.values())
    assert total < 60_000_000 < sum(
        e.size for e in store.Repo(hub_root, GLM).commit(meta_commit(hub_root, GLM)).files.values()
    ) // 1000
    # nothing had to be hashed for it: the sparse shards keep their lazy sha256
    assert not list((hub_root / GLM / "commits").glob("*.hashes.json"))
    # the per-dtype counts are those of the composed headers
    assert meta.parameter_count == sum_params(hub_root, GLM)


def meta_commit(hub_root: Path, repo: str) -> str:
    return store.Repo(hub_root, repo).branches["main"]


def sum_params(hub_root: Path, repo: str) -> dict[str, int]:
    out: dict[str, int] = {}
    r = store.Repo(hub_root, repo)
    for path in r.commit(meta_commit(hub_root, repo)).files:
        if not path.endswith(".safetensors"):
            continue
        with r.file_path(meta_commit(hub_root, repo), path).open("rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                out[t["dtype"]] = out.get(t["dtype"], 0) + count
    return out


def test_single_file_header_read(hub, hub_root):
    meta = api(hub).get_safetensors_metadata(SINGLE, timeout=HEADER_TIMEOUT)
    assert not meta.sharded and meta.parameter_count == sum_params(hub_root, SINGLE)
    f = files_served(hub)[f"{SINGLE}/model.safetensors"]
    assert f["get_full"] == 0 and f["get_ranged"] == 1 and f["bytes"] == 100_001


def test_each_404_raises_the_clients_own_error(hub, tmp_path):
    with pytest.raises(RepositoryNotFoundError):
        api(hub).model_info("gpuserve-lab/Nope")
    with pytest.raises(RepositoryNotFoundError) as exc:
        api(hub, token="some-token").model_info("gpuserve-lab/Nope")
    assert exc.value.response.status_code == 404
    with pytest.raises(RevisionNotFoundError):
        api(hub).model_info(TINY, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(TINY, "config.json", revision="f" * 40, endpoint=hub.url, token=False)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(TINY, "nope.json", endpoint=hub.url, token=False,
                        cache_dir=tmp_path / "never-written")
    assert not api(hub).file_exists(TINY, "model.safetensors")
    with pytest.raises(GatedRepoError):
        api(hub).model_info(GATED)
    with pytest.raises(GatedRepoError) as exc:
        api(hub, token="wrong").model_info(GATED)
    assert exc.value.response.status_code == 403
    assert api(hub, token=TOKEN).model_info(GATED).gated == "manual"


def test_bare_404_is_not_mistaken_for_a_missing_file(hub):
    control(hub, "faults", {"kind": "bare404", "repo": TINY, "times": 2})
    with pytest.raises(HfHubHTTPError) as exc:
        api(hub).file_exists(TINY, "model.safetensors")
    assert type(exc.value) is HfHubHTTPError and exc.value.response.status_code == 404
    with pytest.raises(HfHubHTTPError) as exc:
        api(hub).model_info(TINY)
    assert type(exc.value) is HfHubHTTPError
    assert api(hub).model_info(TINY).sha  # two times, then the repository answers again


def test_broken_checkpoints_fail_in_the_client(hub):
    with pytest.raises(NotASafetensorsRepoError):
        api(hub).get_safetensors_metadata("gpuserve-lab/No-Safetensors", timeout=HEADER_TIMEOUT)
    with pytest.raises(EntryNotFoundError):
        api(hub).get_safetensors_metadata("gpuserve-lab/Missing-Shard", timeout=HEADER_TIMEOUT)
    with pytest.raises(SafetensorsParsingError):
        api(hub).get_safetensors_metadata("gpuserve-lab/Truncated-Header", timeout=HEADER_TIMEOUT)


def test_a_branch_moves_to_a_later_commit(hub, hub_root, tmp_path):
    repo = store.Repo(hub_root, TINY)
    first, later = repo.commit_ids()
    assert api(hub).model_info(TINY).sha == first
    old = json.loads(Path(hf_hub_download(TINY, "generation_config.json", endpoint=hub.url,
                                          cache_dir=tmp_path, token=False)).read_text())
    control(hub, "refs", {"repo": TINY, "branch": "main", "commit": later})
    assert api(hub).model_info(TINY).sha == later
    assert [b.target_commit for b in api(hub).list_repo_refs(TINY).branches] == [later]
    new = json.loads(Path(hf_hub_download(TINY, "generation_config.json", endpoint=hub.url,
                                          cache_dir=tmp_path, token=False)).read_text())
    assert (old["temperature"], new["temperature"]) == (1.0, 0.6)
    assert api(hub).model_info(TINY, revision=first).sha == first  # a commit stays pinned


def test_the_lab_mirror_serves_the_hub_under_hub(hub_root, tmp_path):
    """lab/mirror.py's server: static files as before, the stand-in under /hub."""
    from lab import mirror

    pid, port = mirror.start(hub_root.parent, tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/hub"
        info = HfApi(endpoint=url, token=False).model_info(TINY)
        assert info.sha == store.Repo(hub_root, TINY).branches["main"]
        assert HfApi(endpoint=url, token=False).file_exists(SINGLE, "model.safetensors")
        # the server logs a request once its answer is written: the client may ask for the
        # stats first, so they are read until both are in (bounded: 50 reads, 5 s)
        for _ in range(50):
            with urllib.request.urlopen(f"{url}/_lab/stats", timeout=10) as resp:
                logged = len(json.loads(resp.read())["requests"])
            if logged >= 2:
                break
            time.sleep(0.1)
        assert logged == 2
        static = f"http://127.0.0.1:{port}/hub/{TINY}/repo.json"
        with pytest.raises(urllib.error.HTTPError):  # the raw tree is not served
            urllib.request.urlopen(static, timeout=10)
    finally:
        mirror.stop(pid)


def test_ranges_as_the_hub_answers_them(hub, hub_root):
    data = served_bytes(hub_root, TINY, "config.json")
    url = f"{hub.url}/{TINY}/resolve/main/config.json"

    def get(spec: str):
        req = urllib.request.Request(url, headers={"Range": spec})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.headers.get("Content-Range"), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("Content-Range"), b""

    assert get("bytes=-10") == (206, f"bytes {len(data) - 10}-{len(data) - 1}/{len(data)}",
                                data[-10:])
    assert get("bytes=5-9") == (206, f"bytes 5-9/{len(data)}", data[5:10])
    assert get("bytes=5-999999") == (206, f"bytes 5-{len(data) - 1}/{len(data)}", data[5:])
    assert get(f"bytes={len(data)}-") == (416, f"bytes */{len(data)}", b"")


def test_a_hub_in_trouble_answers_the_status_asked_for(hub):
    control(hub, "faults", {"kind": "status", "repo": TINY, "status": 503, "times": 1})
    with pytest.raises(HfHubHTTPError) as exc:
        api(hub).model_info(TINY)
    assert exc.value.response.status_code == 503
    control(hub, "faults", {"kind": "status", "repo": TINY, "status": 429, "times": 1})
    with pytest.raises(HfHubHTTPError) as exc:  # paginate's first call is not retried
        api(hub).list_repo_files(TINY)
    assert exc.value.response.status_code == 429
    assert exc.value.response.headers["Retry-After"] == "1"
    assert api(hub).list_repo_files(TINY)  # once only


def test_lfs_files_through_a_cdn_redirect_as_the_hub_sends_them(hub, hub_root, tmp_path):
    """With the CDN knob the Hub answers LFS files 302 to another host (here "localhost"
    for 127.0.0.1): HEAD metadata comes from the 302, the bytes from the CDN, the token
    stays on the Hub, header reads follow the redirect with their Range."""
    control(hub, "config", {"cdn_host": "localhost"})
    path = hf_hub_download(GATED, SHARD1, endpoint=hub.url, cache_dir=tmp_path, token=TOKEN)
    assert Path(path).read_bytes() == served_bytes(hub_root, GATED, SHARD1)
    reqs = [(r["kind"], r["method"], r["status"], r["auth"])
            for r in control(hub, "stats")["requests"] if r["file"] == SHARD1]
    assert reqs == [("resolve", "HEAD", 302, True), ("cdn", "GET", 200, False)]
    control(hub, "stats/reset", {})
    meta = api(hub).get_safetensors_metadata(TINY, timeout=HEADER_TIMEOUT)
    assert meta.parameter_count == sum_params(hub_root, TINY)
    files = files_served(hub)
    for shard in sorted(set(meta.weight_map.values())):
        f = files[f"{TINY}/{shard}"]
        assert (f["redirects"], f["get_ranged"], f["get_full"]) == (1, 1, 0)
        assert f["bytes"] == 100_001
    control(hub, "config", {"cdn_host": None})


def test_paths_info_lists_the_paths_asked_for(hub, hub_root):
    got = api(hub).get_paths_info(TINY, [SHARD1, "config.json", "nope.bin"], expand=True)
    assert [f.path for f in got] == [SHARD1, "config.json"]
    assert got[0].lfs.sha256 == hashlib.sha256(served_bytes(hub_root, TINY, SHARD1)).hexdigest()
    assert got[1].blob_id == store.git_blob_sha1(served_bytes(hub_root, TINY, "config.json"))
    assert got[0].last_commit.oid == store.Repo(hub_root, TINY).branches["main"]
