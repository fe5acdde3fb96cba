"""The stand-in server following a performance surface (lab/surfaces/field-notes.yaml),
measured with the stand-in's benchmark client, both from the built wheel.

Servers run on 127.0.0.1 on a free port with a short simulated load; the surface's rates
are sped up (GPUSERVE_LAB_STANDIN_SURFACE_SPEEDUP) so each run takes about a second;
every client run is a subprocess with a timeout; every wait loop is bounded.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path

import pytest
from standin_server import (
    free_port,
    healthy_server,
    launch_argv,
    scheduled_steps,
    standin_env,
    steps_between,
)

from lab import surface

REPO = Path(__file__).resolve().parents[3]
FIELD_NOTES = REPO / "lab" / "surfaces" / "field-notes.yaml"
SPEEDUP = 2.0
# The launch the lab serves (profiles/base/glm5-nvfp4.yaml), as flags.
BASE = ("--tp", "8", "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.9")


@pytest.fixture(scope="module")
def site(site23) -> Path:
    return site23


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A checkpoint directory with the surface's model shape (GLM-5: MLA) as config.json."""
    d = tmp_path_factory.mktemp("models") / "glm5"
    d.mkdir()
    cfg = dict(surface.load(FIELD_NOTES).model or {})
    cfg["vocab_size"] = 154880
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _env(site: Path, **knobs: str) -> dict[str, str]:
    env = standin_env(site, GPUSERVE_LAB_STANDIN_SURFACE=str(FIELD_NOTES),
                      GPUSERVE_LAB_STANDIN_SURFACE_SPEEDUP=str(SPEEDUP))
    env.update({f"GPUSERVE_LAB_STANDIN_{k}": v for k, v in knobs.items()})
    return env


def _argv(model_dir: Path, port: int, *flags: str) -> list[str]:
    return launch_argv(model_dir, "glm-5", port, flags)


def _server(site: Path, model_dir: Path, *flags: str, log: Path, **knobs: str):
    return healthy_server(model_dir, "glm-5", flags, _env(site, **knobs), log=log)


def _bench(site: Path, port: int, model_dir: Path, out: Path, *, prompts: int,
           concurrency: int, output_len: int = 48) -> dict:
    argv = ["--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}",
            "--model", "glm-5", "--tokenizer", str(model_dir), "--dataset-name", "random-ids",
            "--random-input-len", "64", "--random-output-len", str(output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--warmup-requests", "1",
            "--output-file", str(out), "--disable-tqdm"]
    r = subprocess.run([sys.executable, "-m", "sglang.benchmark.serving", *argv],
                       env=_env(site), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text().splitlines()[-1])


def _server_info(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/server_info")
    return json.loads(conn.getresponse().read())


def _evaluate(*flags_dict: dict, concurrency: int = 1) -> surface.Evaluation:
    launch = {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3", "mem_fraction_static": 0.9}
    for d in flags_dict:
        launch.update(d)
    return surface.load(FIELD_NOTES).evaluate(launch, concurrency, input_len=64,
                                              output_len=48, speedup=SPEEDUP)


def test_single_stream_follows_the_surface(site, model_dir, tmp_path):
    """Graph max bs 128 beats the default 512 at concurrency 1, by the surface's margin,
    in the decode steps the stand-in scheduled; the benchmark client's own figures within
    what that pacing guarantees; /server_info shows the resolved launch."""
    results, steps = {}, {}
    for bs in (512, 128):
        with _server(site, model_dir, *BASE, "--enable-metrics", "--cuda-graph-max-bs-decode",
                     str(bs), log=tmp_path / f"bs{bs}.log") as port:
            before = scheduled_steps(port)
            results[bs] = _bench(site, port, model_dir, tmp_path / f"bs{bs}.jsonl",
                                 prompts=4, concurrency=1)
            steps[bs] = steps_between(before, scheduled_steps(port))
            info = _server_info(port)
        assert info["cuda_graph_config"]["decode"]["max_bs"] == bs
        assert info["mem_fraction_static"] == 0.9
    want = {bs: _evaluate({"cuda_graph_max_bs": bs}) for bs in (512, 128)}
    assert want[128].per_stream_tps > want[512].per_stream_tps  # 89.5 vs 82 (x SPEEDUP)
    for bs, line in results.items():
        # every step the server scheduled is the surface's single-stream decode step: 47
        # per request and 31 for the client's warm-up (32 tokens). Its pacing, not the
        # machine's load: a busy machine stretches what the client sees, and a late
        # token's successors come in a burst that shrinks the client's median ITL.
        step = 1 / want[bs].per_stream_tps
        assert steps[bs] == pytest.approx((step, 4 * 47 + 31), rel=1e-6), (bs, steps[bs])
        # what the pacing guarantees the client: no request sooner than its 47 steps, no
        # stream faster than the surface's rate
        assert line["median_e2e_latency_ms"] >= 47 * 1000 * step, (bs, line)
        assert line["output_throughput"] <= want[bs].per_stream_tps * 48 / 47, (bs, line)
    # the surface's margin (+9 %), in the server's schedule
    assert steps[128][0] < 0.96 * steps[512][0]


def test_ep_at_mfs_078_fails_at_start_with_sglangs_value_error(site, model_dir, tmp_path):
    """FN-oom's figure: EP8 at mem_fraction_static 0.78 leaves a rest of -4.4 GB."""
    r = subprocess.run(_argv(model_dir, free_port(), "--tp", "8", "--ep", "8",
                             "--mem-fraction-static", "0.78"),
                       env=_env(site), capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "mem usage=77.70 GB" in r.stderr  # 72.3 + 5.4 per GPU
    assert ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.78. Raise --mem-fraction-static above 0.827") in r.stderr
    assert "Received sigquit from a child process." in r.stderr
    assert "fired up" not in r.stderr
    ev = _evaluate({"ep_size": 8, "mem_fraction_static": 0.78})
    assert ev.failed == "start" and ev.error.startswith("ValueError: Loaded weights")
    assert round(ev.memory["kv_rest_gb"], 1) == -4.4


def test_surface_start_failure_rule_dies_with_its_text(site, model_dir, tmp_path):
    # the surface by name: the wheel bundles lab/surfaces/*.yaml
    r = subprocess.run(_argv(model_dir, free_port(), *BASE, "--dsa-decode-backend",
                             "trtllm"),
                       env=_env(site, SURFACE="field-notes"), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    assert ("RuntimeError: Assertion error (/deepgemm/csrc/apis/attention.hpp:219): "
            "Unsupported architecture") in r.stderr
    assert 'File "sglang/srt/layers/attention/dsa_backend.py", line 402, in ' \
           "init_forward_metadata" in r.stderr
    assert "Capture target decode CUDA graph begin" in r.stderr
    assert "fired up" not in r.stderr


def test_crash_rule_kills_the_server_after_it_served(site, model_dir, tmp_path):
    """EAGLE-3 tree decoding: healthy, serves one request, dies on the second."""
    log = tmp_path / "crash.log"
    flags = (*BASE, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8")
    with _server(site, model_dir, *flags, log=log) as port:
        info = _server_info(port)
        assert info["max_running_requests"] == 48  # EAGLE caps it when unset
        body = json.dumps({"text": "a b c", "sampling_params": {"max_new_tokens": 4}})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/generate", body=body)
        assert conn.getresponse().status == 200
        with pytest.raises((OSError, http.client.HTTPException)):
            for _ in range(3):  # the 2nd request dies with the process
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("POST", "/generate", body=body)
                conn.getresponse().read()
    text = log.read_text()
    assert text.index("fired up") < text.index("Scheduler hit an exception")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in text


def test_bad_surface_file_refuses_to_start(site, model_dir, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: 1\nname: x\ndescription: y\nbase: {decode_tps: 10, speed: 3}\n")
    r = subprocess.run(_argv(model_dir, free_port(), *BASE), env=_env(site, SURFACE=str(bad)),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"{bad}: base.speed: unknown key" in r.stderr


def test_concurrency_and_admission_follow_the_surface(site, model_dir, tmp_path):
    """Four streams share the batch cap; with --max-running-requests 2 only two decode
    (each faster) while the others wait in the queue."""
    lines, steps = {}, {}
    for mrr in (None, 2):
        flags = (*BASE, "--enable-metrics", "--cuda-graph-max-bs-decode", "128")
        flags += ("--max-running-requests", str(mrr)) if mrr else ()
        with _server(site, model_dir, *flags, log=tmp_path / f"mrr{mrr}.log") as port:
            before = scheduled_steps(port)
            lines[mrr] = _bench(site, port, model_dir, tmp_path / f"mrr{mrr}.jsonl",
                                prompts=8, concurrency=4, output_len=32)
            steps[mrr] = steps_between(before, scheduled_steps(port))
            assert _server_info(port)["max_running_requests"] == (mrr or 2048)
    free = _evaluate({"cuda_graph_max_bs": 128}, concurrency=4)
    capped = _evaluate({"cuda_graph_max_bs": 128, "max_running_requests": 2}, concurrency=4)
    assert (free.running, capped.running) == (4, 2)
    # Bounds the stand-in's pacing guarantees, whatever the machine's load (the client's
    # TPOT and TTFT on a busy machine are the machine's, and how long a queued request
    # waits depends on when the client sent it): no stream faster than the surface's
    # rate for the requests running together, and the two running decode each faster
    # than four (the steps the server scheduled). The queue shows in SGLang's decode line.
    for line, ev in ((lines[None], free), (lines[2], capped)):
        assert line["output_throughput"] <= ev.running * ev.per_stream_tps * 32 / 31, line
    assert steps[2][0] < steps[None][0], steps
    # SGLang's decode line shows the two running and the two waiting
    decode = [line for line in (tmp_path / "mrr2.log").read_text().splitlines()
              if "Decode batch, #running-req: " in line]
    assert any("#running-req: 2," in d and d.endswith("#queue-req: 2") for d in decode), decode
    assert all(", cuda graph: True, " in d for d in decode)
