"""The lab's SGLang stand-in, built into a real wheel and run as a subprocess.

Each server test starts ``python -m sglang.launch_server`` from the unpacked wheel on a
free loopback port with a short simulated load (GPUSERVE_LAB_STANDIN_LOAD_SECONDS).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import http.client
import importlib.util
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from gpuserve.launch.catalog import load_catalog
from lab import sglang_standin

REPO = Path(__file__).resolve().parents[3]
GIB_PER_MIB = 1 / 1024


def _env(site: Path, **knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSERVE_LAB_STANDIN_")}
    env["PYTHONPATH"] = str(site)
    env["GPUSERVE_LAB_STANDIN_LOAD_SECONDS"] = "0.2"
    env["GPUSERVE_LAB_STANDIN_WARMUP_SECONDS"] = "0.1"
    env.update({f"GPUSERVE_LAB_STANDIN_{k}": v for k, v in knobs.items()})
    return env


def _run(site: Path, args: list[str], timeout: float = 30, **knobs: str):
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args],
                          env=_env(site, **knobs), capture_output=True, text=True,
                          timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, headers: dict | None = None, body: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        method = "POST" if body is not None else "GET"
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


# -- the wheel -------------------------------------------------------------------


def test_publish_writes_one_wheel_per_catalog(sglang_wheels):
    wheels = sglang_wheels
    names = sorted(p.name for p in wheels.glob("*.whl"))
    # and the PD fleet's Mooncake stand-in (lab/sglang_standin/mooncake.py)
    assert names == ["mooncake_transfer_engine-0.3.11.post1+lab-py3-none-any.whl",
                     "sglang-0.5.19+lab-py3-none-any.whl", "sglang-0.5.23+lab-py3-none-any.whl"]


def test_wheel_metadata_entry_points_and_record(sglang_wheels):
    wheels = sglang_wheels
    path = wheels / "sglang-0.5.23+lab-py3-none-any.whl"
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        dist = "sglang-0.5.23+lab.dist-info"
        meta = zf.read(f"{dist}/METADATA").decode()
        assert "Name: sglang\n" in meta and "Version: 0.5.23+lab\n" in meta
        assert "Tag: py3-none-any" in zf.read(f"{dist}/WHEEL").decode()
        assert "sglang = sglang.cli.main:main" in zf.read(f"{dist}/entry_points.txt").decode()
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist}/RECORD").decode())))
        recorded = {r[0] for r in rows}
        assert recorded == set(names)
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + want.decode() and int(size) == len(data)
        # One parser builder, shared: the vendored module is gpuserve's file verbatim.
        assert zf.read("sglang/_standin/flagparser.py") == (
            REPO / "gpuserve" / "launch" / "flagparser.py").read_bytes()
        bundled = json.loads(zf.read("sglang/_standin/flags.json"))
        assert bundled == load_catalog("0.5.23").data


def test_publish_skips_unchanged_and_rebuilds_stale(tmp_path):
    sglang_standin.publish(tmp_path)
    wheel = tmp_path / "wheels" / "sglang-0.5.23+lab-py3-none-any.whl"
    first = wheel.stat().st_mtime_ns
    time.sleep(0.01)
    sglang_standin.publish(tmp_path)
    assert wheel.stat().st_mtime_ns == first  # nothing changed: not rewritten
    stamp = tmp_path / "wheels" / f".{wheel.name}.inputs"
    stamp.write_text("stale\n")
    sglang_standin.publish(tmp_path)
    assert wheel.stat().st_mtime_ns != first
    # Deterministic bytes: a rebuild of the same inputs is the same wheel.
    assert wheel.read_bytes() == sglang_standin.build_wheel_bytes("0.5.23+lab")


# -- argument parsing ------------------------------------------------------------


def test_unknown_flag_exits_2_like_argparse(site23):
    r = _run(site23, ["--model-path", "m", "--nsa-prefill-backend", "flashmla_sparse"])
    assert r.returncode == 2
    assert "sglang serve: error: unrecognized arguments: --nsa-prefill-backend" in r.stderr


def test_ambiguous_prefix_exits_2(site23):
    r = _run(site23, ["--model-path", "m", "--cuda-graph-max-bs", "128"])
    assert r.returncode == 2
    assert ("ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
            "--cuda-graph-max-bs-prefill") in r.stderr


def test_console_script_entry_point_parses_the_same(site23):
    code = ("import sys; from sglang.cli.main import main; "
            "sys.argv = ['sglang', 'serve', 'm', '--quantization', 'nvfp4']; main()")
    r = subprocess.run([sys.executable, "-c", code], env=_env(site23), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert "argument --quantization: invalid choice: 'nvfp4'" in r.stderr


def test_old_flag_is_accepted_by_the_0519_standin(site19):
    # Parsing succeeds (no exit 2); the oom knob then ends the start-up.
    r = _run(site19, ["--model-path", "m", "--cuda-graph-max-bs", "128"], FAIL="oom")
    assert "error: " not in r.stderr.split("server_args=")[0]
    assert "'cuda_graph_max_bs_decode': 128" in r.stderr
    assert "is deprecated and will be removed in a future release. Use " \
           "'--cuda-graph-max-bs-decode' instead." in r.stderr


def test_config_must_be_yaml_like_sglang(site23, tmp_path):
    cfg = tmp_path / "serve.json"
    cfg.write_text('{"tp-size": 2}')
    r = _run(site23, ["--model-path", "m", "--config", str(cfg)])
    assert r.returncode == 1
    assert "ValueError: Config file must be YAML format, got: .json" in r.stderr


def _load_config_module():
    path = REPO / "lab" / "sglang_standin" / "src" / "sglang" / "_standin" / "config.py"
    spec = importlib.util.spec_from_file_location("standin_config_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_yaml_subset_and_merge_order():
    config = _load_config_module()
    data = config.safe_load(
        "# serve\napi-key: 's3:cret # not a comment'\nenable-metrics: true\n"
        "mem_fraction_static: 0.85\nport: 30001\nskip: null\ncuda-graph-bs-decode:\n"
        "  - 1\n  - 8\n")
    assert data == {"api-key": "s3:cret # not a comment", "enable-metrics": True,
                    "mem_fraction_static": 0.85, "port": 30001, "skip": None,
                    "cuda-graph-bs-decode": [1, 8]}
    assert config.safe_load('{"tp-size": 4}') == {"tp-size": 4}
    with pytest.raises(ValueError, match="line 2"):
        config.safe_load("a: 1\n  nested: 2\n")


# -- the running server ----------------------------------------------------------


def test_server_lifecycle_auth_streaming_and_metrics(site23, tmp_path):
    port = _free_port()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("api-key: lab-secret-key\nenable-metrics: true\n")
    cfg.chmod(0o600)
    log = tmp_path / "server.log"
    sink = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/tiny",
         "--host", "127.0.0.1", "--port", str(port), "--config", str(cfg)],
        env=_env(site23, LOAD_SECONDS="0.3", WARMUP_SECONDS="1.5", DECODE_TPS="400"),
        stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        codes = []
        deadline = time.monotonic() + 120  # a bound on a hang, not on speed
        while time.monotonic() < deadline:
            try:
                status, body = _get(port, "/health")
            except OSError:
                time.sleep(0.05)
                continue
            codes.append(status)
            if status == 200:
                assert body == ""
                break
            time.sleep(0.1)
        assert codes and codes[0] == 503 and codes[-1] == 200, codes

        assert _get(port, "/v1/models")[0] == 401
        auth = {"Authorization": "Bearer lab-secret-key"}
        assert _get(port, "/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
        status, body = _get(port, "/v1/models", auth)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "/models/tiny"

        status, body = _get(port, "/v1/completions", auth, {
            "model": "tiny", "prompt": "one two three four", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}})
        assert status == 200
        events = [e.removeprefix("data: ") for e in body.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
        assert len(texts) == 5
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"] == {"prompt_tokens": 4, "total_tokens": 9,
                                       "completion_tokens": 5, "reasoning_tokens": 0}

        status, body = _get(port, "/generate", auth, {
            "text": "hi", "sampling_params": {"max_new_tokens": 3}})
        meta = json.loads(body)["meta_info"]
        assert meta["completion_tokens"] == 3 and meta["finish_reason"] == {
            "type": "length", "length": 3}

        status, info = _get(port, "/server_info", auth)
        info = json.loads(info)
        # SGLang's auto mem_fraction_static for TP1 on a 97,887 MiB card:
        # reserve = 512 + 1.5*8192 + 1/8*1024 + (2*256 + 58*8) = 13,904 MiB.
        assert info["mem_fraction_static"] == round((97887 - 13904) / 97887, 3)
        assert info["version"] == "0.5.23+lab" and info["max_total_num_tokens"] > 0
        assert "--api-key lab-secret-key" in info["launch_command"]  # as SGLang reports it

        status, metrics = _get(port, "/metrics")  # exempt from auth
        assert status == 200
        assert 'sglang:generation_tokens_total{engine_type="unified",is_streaming="false",' \
               'model_name="/models/tiny"} 8.0' in metrics
    finally:
        # The decode line comes from a logger thread each decode-log-interval steps:
        # wait for it (bounded) rather than race the stop against it.
        deadline = time.monotonic() + 10
        while "Decode batch" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.terminate()
        proc.wait(timeout=10)
        sink.close()
    out = log.read_text()
    assert "lab-secret-key" not in " ".join(proc.args)  # the key travelled in the file
    assert "Load weight begin. avail mem=" in out
    assert "The server is fired up and ready to roll!" in out
    decode = [line for line in out.splitlines() if "Decode batch, #running-req: " in line]
    assert decode and ", cuda graph: True, gen throughput (token/s): " in decode[0]
    sched = [line for line in out.splitlines() if "max_total_num_tokens=" in line][0]
    assert sched.startswith("[") and " TP0] max_total_num_tokens=" in sched
    assert ", available_gpu_mem=" in sched and sched.endswith(" GB")


def test_oom_knob_gives_sglang_capture_oom_and_nonzero_exit(site23):
    r = _run(site23, ["--model-path", "m"], FAIL="oom")
    assert r.returncode != 0
    assert "Scheduler hit an exception: Traceback" in r.stderr
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" \
        in r.stderr
    assert "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)" in r.stderr
    assert "Received sigquit from a child process. It usually means the child failed." \
        in r.stderr
    assert "fired up" not in r.stderr


def test_too_low_mem_fraction_gives_sglangs_value_error(site23):
    r = _run(site23, ["--model-path", "m", "--mem-fraction-static", "0.1"], WEIGHTS_GB="10")
    assert r.returncode != 0
    pre = 97887 * GIB_PER_MIB - 1.6  # free before weights: card minus context (INIT_GB)
    minimum = 1 - (pre - 10) / pre
    suggested = math.ceil(minimum * 1000) / 1000
    assert (f"ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static=0.1. Raise --mem-fraction-static above {suggested:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
            f"decoding, draft weights are now counted.") in r.stderr


def test_crash_knob_dies_after_becoming_healthy(site23):
    r = _run(site23, ["--model-path", "m", "--port", str(_free_port())], FAIL="crash",
             CRASH_AFTER_SECONDS="0.3")
    assert r.returncode != 0
    ready = r.stderr.index("The server is fired up and ready to roll!")
    died = r.stderr.index("Scheduler hit an exception")
    assert ready < died
    assert "Received sigquit from a child process." in r.stderr[died:]


def _load_sim_module():
    path = REPO / "lab" / "sglang_standin" / "src" / "sglang" / "_standin" / "sim.py"
    spec = importlib.util.spec_from_file_location("standin_sim_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("args", "mla", "expected"), [
    # SGLang 0.5.23 memory_hook.py on a 97,887 MiB card, cps 8192 (58 prefill sizes).
    # TP8 MLA: R = 512 + 1.5*8192 + 8/8*1024 + 2*512 + 1536 = 16,384 -> 0.833
    (["--tp-size", "8"], True, 0.833),
    (["--tp-size", "8"], False, 0.844),
    (["--tp-size", "8", "--cuda-graph-max-bs-decode", "256"], True, 0.838),
    # attention DP adds 3*max_bs*attn_dp (+1.5*... above 300): R = 34,816 -> 0.644
    (["--tp-size", "8", "--attn-dp-size", "8"], True, 0.644),
    (["--tp-size", "8", "--attn-dp-size", "8", "--cuda-graph-max-bs-decode", "128"], True,
     0.809),
    (["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], True, 0.644),
])
def test_auto_mem_fraction_static_follows_sglangs_formula(args, mla, expected):
    sim = _load_sim_module()
    ns = load_catalog("0.5.23").parse(["--model-path", "m", *args])
    shape = sim.ModelShape()
    shape.is_mla = mla
    plan = sim.plan(ns, shape)
    assert plan.mem_fraction_static == expected
    assert plan.chunked_prefill_size == 8192 // (8 if "--attn-dp-size" in args
                                                 or "--enable-dp-attention" in args else 1)


@pytest.mark.parametrize("text", [
    'api-key: "sk-\\u003cx\\u003e #1: y"\n',
    "# comment\n\ntp-size: 2\nmem-fraction-static: 0.85\nenable-metrics: true\n",
    "served-model-name: 'it''s'\nhost: 0.0.0.0\nport: 30000\nlog-level: null\n",
    "cuda-graph-bs-decode: [1, 2, 4]\ndisable-custom-all-reduce: false\n",
    "lora-paths:\n  - a\n  - b\n",
    '{"api-key": "k", "tp-size": 8}',
])
def test_yaml_subset_reads_like_pyyaml(text):
    assert _load_config_module().safe_load(text) == yaml.safe_load(text)
