"""Start-up phases recorded, and the JIT cache reused by the next start, on a container
host.

The serve unit places FlashInfer's workspace under the host's one JIT cache directory
(gpuserve/serve/jit_cache.py). The lab's SGLang stand-in builds a FlashInfer-style op
there on a start that does not find it (composed: lab/sglang_standin/src/sglang/_standin/
jit.py, keyed like FlashInfer by the CUDA arch and the op's dtypes) and reuses it on the
next. Three restarts of the inventory profile: the first builds the op, the second
reuses it, the third, under another arch (FLASHINFER_CUDA_ARCH_LIST), builds its own.
Every start is recorded with its phases; ``gpuserve compare`` shows them. Timing is
never compared between starts (a loaded machine could flip it): the JIT phase of a
build is at least the stand-in's sleep.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from labhelpers import UNIT, clean, serve_inventory_profile

pytestmark = pytest.mark.lab

JIT_SECONDS = 4
FLASHINFER = "/opt/gpuserve/cache/jit/sglang-*/flashinfer/.cache/flashinfer"


def restart(lab, results: Path, **env: str) -> tuple[dict, str]:
    """A serve deploy whose env changes (so the server restarts); the start record it
    wrote and the journal of that start."""
    extra = json.dumps({"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "1",
                        "GPUSERVE_LAB_STANDIN_JIT_SECONDS": str(JIT_SECONDS),
                        "GPUSERVE_LAB_START": str(time.time_ns()), **env})
    lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", "--data",
                    f"results_dir={results}", "--data", f"sglang_extra_env={extra}")
    docs = [json.loads(p.read_text()) for p in sorted((results / "lab-gpu").glob("*-start-*.json"))]
    assert docs, "the serve deploy recorded no start"
    journal = lab.ssh(f"journalctl -u {UNIT} -o short-iso-precise --no-pager -n 400",
                      check=True).stdout
    return docs[-1], journal[journal.rfind("Started gpuserve-sglang"):]


def ops(lab) -> set[str]:
    out = lab.ssh(f"ls -d {FLASHINFER}/*/cached_ops/*", check=False).stdout
    return set(out.split())


def test_a_second_start_reuses_the_jit_cache_and_reports_its_phases(lab, tmp_path) -> None:
    serve_inventory_profile(lab)
    lab.ssh(f"rm -rf {FLASHINFER}", check=False)
    first, journal = restart(lab, tmp_path)
    assert "JIT cache miss" in journal
    assert first["outcome"] == "ready"
    for phase in ("to_weights", "weights", "kv_pool", "graphs", "jit", "first_healthy"):
        assert phase in first["phases"], phase
    assert first["phases"]["jit"] >= JIT_SECONDS - 0.1  # the build's sleep, at least
    built = ops(lab)
    assert len(built) == 1 and "/120/cached_ops/" in next(iter(built))

    second, journal = restart(lab, tmp_path)
    assert "JIT cache hit" in journal and "JIT cache miss" not in journal
    assert second["server_start"] != first["server_start"] and "jit" in second["phases"]
    assert ops(lab) == built

    _, journal = restart(lab, tmp_path, FLASHINFER_CUDA_ARCH_LIST="10.0")
    assert "JIT cache miss" in journal
    assert len(ops(lab)) == 2 and built < ops(lab)

    r = lab.run_tool("gpuserve", "compare", str(tmp_path))
    out = clean(r.stdout)
    assert r.returncode == 0 and "starts (seconds per phase" in out
    assert out.count("glm5-nvfp4-tp8") >= 3
