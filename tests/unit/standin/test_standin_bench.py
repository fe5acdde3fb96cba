"""The stand-in's benchmark client against the stand-in server, both from the built wheel.

Every server runs on 127.0.0.1 on a free port with a short simulated load; every client
run is a subprocess with a timeout; every wait loop is bounded in count and time.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_server import (
    free_port,
    healthy_server,
    scheduled_steps,
    standin_env,
    steps_between,
)

from gpuserve.measure.bench_catalog import load_bench_catalog

DECODE_TPS = 400.0


@pytest.fixture(scope="module")
def site(site23) -> Path:
    return site23


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models") / "qwen"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                               "vocab_size": 151936}))
    return d


def _env(site: Path, **extra: str) -> dict[str, str]:
    return standin_env(site, **extra)


def _server(site: Path, model_dir: Path, *args: str, **knobs: str):
    return healthy_server(model_dir, "qwen", args, _env(
        site, **{f"GPUSERVE_LAB_STANDIN_{k}": v for k, v in knobs.items()}))


@pytest.fixture(scope="module")
def server(site, model_dir) -> Iterator[int]:
    with _server(site, model_dir, "--enable-metrics", DECODE_TPS=str(DECODE_TPS),
                 BATCH_DECODE_TPS="4000", PREFILL_TPS="100000") as port:
        yield port


def _argv(port: int, model_dir: Path, out: Path, *, prompts: int = 6, concurrency: int = 1,
          output_len: int = 16, tag: str = "t", extra: tuple[str, ...] = ()) -> list[str]:
    """The command line the serve deploy builds."""
    return ["--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}", "--model", "qwen",
            "--tokenizer", str(model_dir), "--dataset-name", "random-ids",
            "--random-input-len", "32", "--random-output-len", str(output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--warmup-requests", "1",
            "--output-file", str(out), "--tag", tag, *extra]


def _bench(site: Path, argv: list[str], timeout: float = 60, **env: str):
    return subprocess.run([sys.executable, "-m", "sglang.benchmark.serving", *argv],
                          env=_env(site, **env), capture_output=True, text=True,
                          timeout=timeout)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]



def test_wheel_bundles_the_bench_catalog(site):
    bundled = json.loads((site / "sglang" / "_standin" / "bench.json").read_text())
    assert bundled == load_bench_catalog("0.5.23").data


def test_two_runs_append_lines_with_the_real_keys(site, server, model_dir, tmp_path):
    out = tmp_path / "bench.jsonl"
    keys = load_bench_catalog("0.5.23").output_keys
    r1 = _bench(site, _argv(server, model_dir, out, concurrency=1, tag="c1", output_len=64))
    assert r1.returncode == 0, r1.stderr
    assert "============ Serving Benchmark Result ============" in r1.stdout
    assert re.search(r"Successful requests:\s+6\s", r1.stdout)
    assert re.search(r"100%\|██████████\| 6/6 \[\d\d:\d\d<00:00, +[\d.]+it/s\]", r1.stderr)
    before = scheduled_steps(server)
    r2 = _bench(site, _argv(server, model_dir, out, concurrency=3, tag="c3", output_len=64))
    assert r2.returncode == 0, r2.stderr
    steps3 = steps_between(before, scheduled_steps(server))
    assert out.read_text().count("\n") == 2
    assert '"request_rate": Infinity' in out.read_text()  # json.dumps(float("inf"))
    one, three = _lines(out)
    for line in (one, three):
        assert tuple(line) == keys  # exactly the client's keys, in its order
        assert line["completed"] == 6
        assert line["total_output_tokens"] == 6 * 64  # fixed lengths (ratio 1.0)
        assert line["total_input_tokens"] == 6 * 32
        assert line["server_info"]["served_model_name"] == "qwen"
        assert math.isinf(line["request_rate"])
    assert (one["tag"], one["max_concurrency"], three["max_concurrency"]) == ("c1", 1, 3)
    # Bounds the stand-in's pacing guarantees, whatever the machine's load: it sends
    # token i+1 no sooner than its step after token i (a late token is followed by the
    # next one's own deadline, never sooner), so no request ends sooner than 63 steps
    # after its first token, a stream never outruns DECODE_TPS, and the client never has
    # more requests in flight than its --max-concurrency. How far below those a busy
    # machine pulls the figures is the machine's, not asserted.
    floor_ms = 63 * 1000 / DECODE_TPS
    for line, streams in ((one, 1), (three, 3)):
        assert line["median_e2e_latency_ms"] >= floor_ms, (streams, line)
        assert line["output_throughput"] <= streams * DECODE_TPS * 64 / 63, (streams, line)
        assert 0 < line["concurrency"] <= streams + 0.05, (streams, line)
    assert one["median_tpot_ms"] > 0 and three["median_tpot_ms"] > 0
    # Three streams under a cap far above them decode each at one stream's rate: every
    # step the server scheduled during the three-stream run was 1/DECODE_TPS (its own
    # inter-token histogram; the client's TPOT adds the machine's scheduling delays), 63
    # for each of the six requests and 31 for the client's warm-up (32 tokens).
    assert steps3 == pytest.approx((1 / DECODE_TPS, 6 * 63 + 31), rel=1e-6), steps3


def test_batch_cap_saturates_throughput(site, model_dir, tmp_path):
    out = tmp_path / "b.jsonl"
    with _server(site, model_dir, "--enable-metrics", DECODE_TPS="400",
                 BATCH_DECODE_TPS="400", PREFILL_TPS="100000") as port:
        before = scheduled_steps(port)
        r = _bench(site, _argv(port, model_dir, out, prompts=8, concurrency=4))
        mean_step, _ = steps_between(before, scheduled_steps(port))
    assert r.returncode == 0, r.stderr
    line = _lines(out)[0]
    # Four streams share 400 tok/s: each sees ~100 tok/s (TPOT ~10 ms, not 2.5 ms). The
    # pacing guarantees the cap (never faster than it) and that requests ran at once:
    # a step stretches past 1/400 s only while more than one decodes (the server's own
    # schedule, not the client's timing). A busy machine only slows the client's figures.
    assert line["output_throughput"] <= 400 * 16 / 15
    assert mean_step > 1 / 400, mean_step
    assert line["median_tpot_ms"] > 1000 / 400


def test_openai_backend_and_stream_interval(site, model_dir, tmp_path):
    out = tmp_path / "oai.jsonl"
    with _server(site, model_dir, "--stream-interval", "4", DECODE_TPS="400",
                 PREFILL_TPS="100000") as port:
        argv = _argv(port, model_dir, out, prompts=4, concurrency=2, output_len=9)
        argv[1] = "sglang-oai"
        r = _bench(site, argv)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/generate", body=json.dumps(
            {"text": "a b", "stream": True, "sampling_params": {"max_new_tokens": 8}}))
        chunks = [c for c in conn.getresponse().read().decode().split("\n\n") if c]
    assert r.returncode == 0, r.stderr
    line = _lines(out)[0]
    assert line["completed"] == 4 and line["backend"] == "sglang-oai"
    assert line["total_output_tokens"] == 4 * 9
    # SGLang's send rule: the first token at once, then every 4 unsent, then the end.
    counts = [json.loads(c[6:])["meta_info"]["completion_tokens"] for c in chunks[:-1]]
    assert counts == [1, 5, 8] and chunks[-1] == "data: [DONE]"


def test_bad_argv_exits_2_like_argparse(site, tmp_path):
    r = _bench(site, ["--num-prompts", "4", "--max-concurency", "3"], timeout=30)
    assert r.returncode == 2
    assert r.stderr.startswith("usage: serving.py [-h]")
    assert "serving.py: error: unrecognized arguments: --max-concurency 3" in r.stderr
    r = _bench(site, ["--rust-worker-threads", "2"], timeout=30)
    assert r.returncode == 2
    assert "serving.py: error: --rust-worker-threads requires --rust-client" in r.stderr


def test_standin_parser_agrees_with_gpuserve(site):
    probes = [["--dataset-name", "random-idz"], ["--goodput", "itl:5"],
              ["--flush-cache-timeout", "nan"], ["--random-"],
              ["--profile-prefill-url", "a", "--profile-decode-url", "b"],
              ["--rust-client", "--backend", "trt"], ["--num-prompt", "3"]]
    code = ("import json, sys\nfrom sglang._standin import bench_args as b\n"
            "data = b.load_catalog()\nout = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    p = b.build_bench_parser(data)\n"
            "    def error(msg): raise ValueError(msg)\n"
            "    p.error = error\n"
            "    try:\n        ns = p.parse_args(argv)\n"
            "        msg = b.post_parse_error(data, ns)\n"
            "        out.append(msg or 'ok')\n"
            "    except ValueError as e:\n        out.append(str(e))\n"
            "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(probes)], env=_env(site),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    cat = load_bench_catalog("0.5.23")
    expected = []
    for argv in probes:
        try:
            cat.parse(argv)
            expected.append("ok")
        except ValueError as e:
            expected.append(str(e))
    assert json.loads(r.stdout) == expected
    assert expected[-1] == "ok" and expected[0] != "ok"


def test_api_key_only_through_openai_api_key(site, model_dir, tmp_path):
    out = tmp_path / "auth.jsonl"
    with _server(site, model_dir, "--api-key", "s3cret", DECODE_TPS="1000",
                 PREFILL_TPS="100000") as port:
        argv = _argv(port, model_dir, out, prompts=2, output_len=4,
                     extra=("--ready-check-timeout-sec", "1"))
        denied = _bench(site, argv)
        raw = _bench(site, argv, API_KEY="s3cret")  # sent without "Bearer"
        ok = _bench(site, argv, OPENAI_API_KEY="s3cret")
    for r in (denied, raw):
        assert r.returncode == 1
        assert f"Server at http://127.0.0.1:{port}/v1/models is not ready. Exiting." in r.stdout
    assert ok.returncode == 0, ok.stderr
    assert len(_lines(out)) == 1 and _lines(out)[0]["completed"] == 2


def test_offline_tokenizer_must_be_a_local_dir(site, server, tmp_path):
    argv = _argv(server, Path("Qwen/Qwen3-0.6B"), tmp_path / "x.jsonl")
    r = _bench(site, argv)
    assert r.returncode == 1
    assert "OSError: We couldn't connect to 'https://huggingface.co'" in r.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_unreachable_server_exits_non_zero(site, model_dir, tmp_path):
    port = free_port()  # nothing listens there
    argv = _argv(port, model_dir, tmp_path / "x.jsonl",
                 extra=("--ready-check-timeout-sec", "1"))
    r = _bench(site, argv)
    assert r.returncode == 1 and "is not ready. Exiting." in r.stdout
    # gave up after its own timeout (its words; a wall-clock bound would be the load's)
    assert "Server did not become ready within 1s timeout." in r.stdout
    r = _bench(site, _argv(port, model_dir, tmp_path / "x.jsonl",
                           extra=("--ready-check-timeout-sec", "0")))
    assert r.returncode == 1 and "ValueError: Warmup failed" in r.stderr


def test_unsimulated_dataset_is_refused(site, server, model_dir, tmp_path):
    argv = _argv(server, model_dir, tmp_path / "x.jsonl")
    argv[argv.index("random-ids")] = "sharegpt"
    r = _bench(site, argv)
    assert r.returncode == 1
    assert "--dataset-name sharegpt is not simulated" in r.stderr


def test_every_version_runs_the_deploy_argv(site19, site23, model_dir, tmp_path):
    """Each stand-in wheel's client (its own version's catalog) completes the argv the
    serve deploy builds (gpuserve.launch.bench.client_argv); 0.5.19 lacks --goodput."""
    from gpuserve.launch.bench import Scenario, client_argv

    for version, site in (("0.5.19+lab", site19), ("0.5.23+lab", site23)):
        out = tmp_path / f"{version}.jsonl"
        with _server(site, model_dir, DECODE_TPS="400", BATCH_DECODE_TPS="4000") as port:
            argv = client_argv(Scenario("s", concurrency=2, prompts=2, input_len=16,
                                        output_len=8, warmup=1), port=port,
                               served_name="qwen", tokenizer=str(model_dir),
                               output_file=str(out), tag="t")
            r = _bench(site, argv)
        assert r.returncode == 0, (version, r.stdout[-2000:], r.stderr[-2000:])
        (line,) = _lines(out)
        assert line["completed"] == 2
