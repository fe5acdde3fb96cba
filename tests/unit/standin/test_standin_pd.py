"""The stand-in's PD roles on loopback: the prefill's bootstrap server answers SGLang's
routes (0.5.23 srt/disaggregation/common/conn.py, CommonKVBootstrapServer), and a
request dual-dispatched the way smg's PD router does it (bootstrap_host, bootstrap_port
and bootstrap_room added, the same body to both; smg model_gateway/src/routers/http/
pd_router.rs, inject_bootstrap_into_value) is answered by the decode server once it has
pulled the request's KV bytes from the prefill (the stand-in transfer over TCP). The
real smg routes this in the lab (tests/lab/test_pd.py)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from standin_server import free_port, healthy_server, standin_env

WORDS = "one two three four five six seven eight"  # 8 prompt tokens for the stand-in


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models") / "qwen"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                               "vocab_size": 151936}))
    return d


def _open(url: str, body: dict | None = None, timeout: float = 20):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    return opener.open(request, timeout=timeout)


def _status(url: str) -> tuple[int, str]:
    try:
        with _open(url) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _roles(site23, model_dir, tmp_path, **env):
    bootstrap = free_port()
    environment = standin_env(site23, GPUSERVE_LAB_STANDIN_KV_TRANSFER_TIMEOUT="2", **env)
    prefill = healthy_server(model_dir, "qwen", (
        "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl",
        "--disaggregation-bootstrap-port", str(bootstrap), "--enable-metrics"), environment,
        log=tmp_path / "prefill.log")
    decode = healthy_server(model_dir, "qwen", (
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
        "--enable-metrics"), environment, log=tmp_path / "decode.log")
    return bootstrap, prefill, decode


def test_the_bootstrap_server_answers_sglangs_routes(site23, model_dir, tmp_path) -> None:
    bootstrap, prefill, _ = _roles(site23, model_dir, tmp_path)
    with prefill as http_port:
        base = f"http://127.0.0.1:{bootstrap}"
        assert _status(f"{base}/health") == (200, "OK")
        assert _status(f"{base}/route")[0] == 400
        query = "prefill_dp_rank={0}&prefill_cp_rank={0}&target_tp_rank={0}&target_pp_rank={0}"
        code, text = _status(f"{base}/route?" + query.format(-1))
        layout = json.loads(text)
        assert code == 200 and layout["attn_tp_size"] == 1 and layout["dp_size"] == 1
        assert layout["prefill_http_port"] == http_port
        code, text = _status(f"{base}/route?" + query.format(0))
        assert code == 200 and set(json.loads(text)) == {"rank_ip", "rank_port"}
        assert _status(f"{base}/route?" + query.format(3))[0] == 404


def test_a_dual_dispatched_request_is_answered_after_the_kv_hand_off(site23, model_dir,
                                                                     tmp_path) -> None:
    bootstrap, prefill, decode = _roles(site23, model_dir, tmp_path)
    with prefill as p_port, decode as d_port:
        body = {"text": WORDS, "sampling_params": {"max_new_tokens": 4},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap,
                "bootstrap_room": 4242}
        answers: dict[str, dict] = {}

        def send(role: str, port: int) -> None:
            with _open(f"http://127.0.0.1:{port}/generate", body) as r:
                answers[role] = json.loads(r.read())

        threads = [threading.Thread(target=send, args=a) for a in
                   (("decode", d_port), ("prefill", p_port))]  # decode asks first
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert answers["decode"]["meta_info"]["completion_tokens"] == 4
        assert answers["prefill"]["meta_info"]["completion_tokens"] == 1
        assert answers["decode"]["meta_info"]["prompt_tokens"] == 8
        # a room the prefill never produced: the decode side gives up, the request fails
        lost = {**body, "bootstrap_room": 7}
        with pytest.raises(urllib.error.HTTPError) as err:
            _open(f"http://127.0.0.1:{d_port}/generate", lost)
        assert err.value.code == 500 and "no KV cache in time" in err.value.read().decode()
        # SGLang's own warmups use the fake bootstrap host: no transfer
        fake = {**body, "bootstrap_host": "2.2.2.2", "bootstrap_room": 0}
        with _open(f"http://127.0.0.1:{d_port}/v1/completions",
                   {"prompt": WORDS, "max_tokens": 2, **fake}) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 2
        # a bootstrap server that does not answer: a bootstrap failure, not a transfer's
        with pytest.raises(urllib.error.HTTPError):
            _open(f"http://127.0.0.1:{d_port}/generate",
                  {**body, "bootstrap_port": free_port(), "bootstrap_room": 8})
        # SGLang's PD metrics, each role the ones its scheduler sets
        decode_m, prefill_m = _metrics(d_port), _metrics(p_port)
        assert decode_m["num_decode_transfer_queue_reqs"] == 0
        assert decode_m["num_transfer_failed_reqs_total"] == 1  # room 7
        assert decode_m["num_bootstrap_failed_reqs_total"] == 1
        assert "kv_transfer_latency_ms_count" not in decode_m
        assert prefill_m["kv_transfer_latency_ms_count"] == 1  # room 4242 only
        assert prefill_m["kv_transfer_total_mb_sum"] == 8 * 64 / 1e6
        assert prefill_m["num_prefill_inflight_queue_reqs"] == 0
        assert "num_decode_transfer_queue_reqs" not in prefill_m
        assert (decode_m["engine_type"], prefill_m["engine_type"]) == ({"decode"}, {"prefill"})


def _metrics(port: int) -> dict:
    """``/metrics`` as {name without sglang: and labels: value} (one series a name);
    every series must carry the server's role as SGLang labels it (engine_type)."""
    with _open(f"http://127.0.0.1:{port}/metrics") as r:
        text = r.read().decode()
    out, engines = {}, set()
    for line in text.splitlines():
        if line.startswith("sglang:") and "_bucket{" not in line:
            name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
            out[name.removeprefix("sglang:")] = float(value)
            engines.add(line.split('engine_type="', 1)[1].split('"', 1)[0])
    out["engine_type"] = engines
    return out


def test_mooncake_without_its_engine_dies_at_start(site23, model_dir, tmp_path) -> None:
    env = standin_env(site23)
    with pytest.raises(AssertionError), healthy_server(model_dir, "qwen", (
            "--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
            "mooncake"), env, log=tmp_path / "decode.log"):
        pass
    log = (tmp_path / "decode.log").read_text()
    assert "ImportError: Please install mooncake" in log
