"""lab/models.py: the composed GLM-5 NVFP4 checkpoint for the guest (no VM needed)."""

from __future__ import annotations

import subprocess

from gpuserve.memory.checkpoint import scan_directory
from lab import models


def test_compose_is_cached_by_its_inputs(tmp_path):
    out, digest, built = models.compose_cached(tmp_path, layers=4, shards=2)
    assert built and (out / "COMPOSED.md").is_file() and out.name == "GLM-5-NVFP4"
    shard = sorted(out.glob("*.safetensors"))[0]
    mtime = shard.stat().st_mtime_ns
    again, same, rebuilt = models.compose_cached(tmp_path, layers=4, shards=2)
    assert (again, same, rebuilt) == (out, digest, False)
    assert shard.stat().st_mtime_ns == mtime
    _, other, rebuilt = models.compose_cached(tmp_path, layers=4, shards=3)
    assert rebuilt and other != digest
    assert len(list(out.glob("*.safetensors"))) == 3  # old shards do not linger


def test_guest_receives_headers_and_restores_sparse_shards(tmp_path):
    src, digest, _ = models.compose_cached(tmp_path / "cache", layers=4, shards=2)
    archive = models.upload_archive(src)
    assert len(archive) < 2_000_000  # headers only, not the ~12 GB of sparse data
    dest = tmp_path / "guest" / "models" / "GLM-5-NVFP4"
    dest.parent.mkdir(parents=True)
    (dest).mkdir()
    (dest / "stale.safetensors").write_bytes(b"x")
    subprocess.run(["bash", "-c", models.guest_script(str(dest), digest)], input=archive,
                   check=True)
    assert (dest / models.STAMP).read_text().strip() == digest
    assert not (dest / "stale.safetensors").exists() and not (dest / models.SIZES).exists()
    for shard in src.glob("*.safetensors"):
        assert (dest / shard.name).stat().st_size == shard.stat().st_size
    there, here = scan_directory(dest), scan_directory(src)
    assert there.tensors == here.tensors and there.total_bytes == here.total_bytes
