"""The HTTP side of the stand-in: SGLang's endpoints and JSON shapes, simulated decode.

Shapes follow srt/entrypoints/http_server.py and srt/entrypoints/openai/protocol.py
of the 0.5.23 wheel: /health and /health_generate answer 503 while the server is
Starting and 200 with an empty body after warmup; /ready likewise; auth is a Bearer
token with /health*, /ready and /metrics exempt (srt/utils/auth.py), refused with 401
``{"error": "Unauthorized"}``; unknown routes give FastAPI's 404 ``{"detail": "Not Found"}``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang._standin import logs, toylm
from sglang._standin.surface import Perf

STARTING, UP, UNHEALTHY = "Starting", "Up", "UnHealthy"

# Bucket edges (seconds) of the latency histograms: SGLang's defaults, taken from
# python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector.__init__,
# bucket_time_to_first_token / bucket_inter_token_latency / bucket_e2e_request_latency)
# of sgl-project/sglang at commit 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
               8.000)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
               600, 1200, 1800, 2400)
_WORDS = ("the", "lab", "stands", "in", "for", "a", "gpu", "box", "and", "answers",
          "with", "simulated", "tokens", "at", "a", "steady", "rate")


def _dumps(obj: Any) -> str:
    """Compact like orjson / pydantic's model_dump_json."""
    return json.dumps(obj, separators=(",", ":"))


class Histogram:
    """Cumulative counts over ``edges`` (Prometheus's ``le`` buckets), sum and count."""

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * len(edges)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.n += 1
        self.total += v
        for i, edge in enumerate(self.edges):
            if v <= edge:
                self.counts[i] += 1


def _bounds(args, flag: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """A histogram's bucket bounds: the server argument when given, else SGLang's."""
    given = getattr(args, flag, None)
    return tuple(float(v) for v in given) if given else default


IDLE_RUN_GAP_S = 1.0


class State:
    """Shared between the startup thread, the HTTP threads and the warmup thread."""

    def __init__(self, args, info: dict, version: str, decode_tps: float,
                 prefill_tps: float, batch_decode_tps: float = 0.0,
                 perf: Perf | None = None, admission: bool = False) -> None:
        self.args = args
        self.info = info            # /server_info body (resolved args + scheduler info)
        self.version = version
        self.status = STARTING
        # the speed model (lab/surface.py::Perf); the knobs alone give today's flat one
        self.perf = perf or Perf(decode_tps=decode_tps, prefill_tps=prefill_tps,
                                 batch_decode_tps=batch_decode_tps)
        self.decode_tps = self.perf.decode_tps
        self.prefill_tps = self.perf.prefill_tps
        self.batch_decode_tps = self.perf.batch_decode_tps  # 0: no cap across requests
        # With a surface, requests wait for a running slot and KV room like SGLang's
        # scheduler (max_running_requests, max_total_num_tokens); TTFT includes the wait.
        self.admission = admission
        self.waiting = 0
        self.reserved_tokens = 0
        self.started = 0
        self.crash_after: int | None = None
        self.on_crash = None
        self.lock = threading.Lock()
        self.admit_cond = threading.Condition(self.lock)
        # Prefill is compute-bound: one prompt (or one batch) at a time, so TTFT grows
        # with the queue.
        self.prefill_lock = threading.Lock()
        # the end of the prefill a batch reserved (it computes its replies outside the
        # lock, inside its simulated window); a later prefill starts after it
        self.prefill_free_at = 0.0
        # SGLang's prefix cache, for the batch /generate the quality check sends
        self.prefix_cache = None if getattr(args, "disable_radix_cache", False) \
            else toylm.PrefixCache()
        self.running = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.last_gen_throughput = 0.0
        # SGLang's --bucket-* flags replace a default (TokenizerMetricsCollector)
        self.ttft = Histogram(_bounds(args, "bucket_time_to_first_token", TTFT_BUCKETS))
        self.e2e = Histogram(_bounds(args, "bucket_e2e_request_latency", E2E_BUCKETS))
        self.itl = Histogram(_bounds(args, "bucket_inter_token_latency", ITL_BUCKETS))
        self.startup_time = time.time()
        self.active_tokens = 0          # KV tokens held by running requests
        self.window_tokens = 0          # tokens generated since the last decode log
        # a surface's noise per benchmark run: a burst of requests after a second idle
        # is a new run (the benchmark client starts anew) with its own speed factor
        self.bursts = 0
        self.idle_since: float | None = time.monotonic()
        self.run_factor = 1.0
        self.pd = None  # a PD server's role (sglang/_standin/pd.py), set by main

    def decode_logger(self, interval_steps: int) -> None:
        """Log SGLang's periodic decode line while requests run
        (srt/managers/scheduler_components/metrics_reporter.py, every
        --decode-log-interval decode steps)."""
        period = max(interval_steps, 1) / self.decode_tps
        capacity = max(int(self.info.get("max_total_num_tokens") or 0), 1)
        while True:
            time.sleep(period)
            with self.lock:
                running, generated = self.running, self.window_tokens
                used = self.active_tokens
                self.window_tokens = 0
            if not running and not generated:
                continue
            throughput = generated / period
            self.last_gen_throughput = throughput
            accept = self.perf.spec_accept_length
            accept_part = f"accept len: {accept:.2f}, " if accept else ""
            logs.log(f"Decode batch, #running-req: {running}, #token: {used}, "
                     f"token usage: {used / capacity:.2f}, {accept_part}"
                     f"cuda graph: {not self.perf.eager(running)}, "
                     f"gen throughput (token/s): {throughput:.2f}, "
                     f"#queue-req: {self.waiting}", rank="TP0")

    def token_interval(self) -> float:
        """Seconds per decode step of one request now: 1/DECODE_TPS while the batch is
        small, stretched so the running requests together stay under BATCH_DECODE_TPS
        (a real server's throughput saturates as the batch grows)."""
        return self.perf.step_seconds(self.running) / self.run_factor

    def admit(self, tokens: int) -> int:
        """Wait (bounded, 600 s) for a running slot and KV room for ``tokens``; returns
        the tokens reserved. Without admission (no surface) it returns at once."""
        if not self.admission:
            return 0
        cap = self.perf.kv_tokens or tokens
        need = min(tokens, cap)
        limit = self.perf.max_running or 1 << 30
        deadline = time.monotonic() + 600
        with self.admit_cond:
            self.waiting += 1
            try:
                while (self.running >= limit or self.reserved_tokens + need > cap) and \
                        time.monotonic() < deadline:
                    self.admit_cond.wait(timeout=1.0)
            finally:
                self.waiting -= 1
            self.reserved_tokens += need
        return need

    def finished(self) -> None:
        """A request ended: the server is idle from now when none runs."""
        with self.lock:
            if self.running == 0:
                self.idle_since = time.monotonic()

    def release(self, reserved: int) -> None:
        if not self.admission:
            return
        with self.admit_cond:
            self.reserved_tokens -= reserved
            self.admit_cond.notify_all()

    def count_start(self) -> None:
        """Count a started request; a surface's serve failure fires on the Nth."""
        with self.lock:
            self.started += 1
            fire = self.crash_after is not None and self.started == self.crash_after
            now = time.monotonic()
            if self.running == 0 and (self.idle_since is None or now - self.idle_since
                                      >= IDLE_RUN_GAP_S):
                self.bursts += 1
                self.run_factor = self.perf.run_factor(self.bursts)
        if fire and self.on_crash is not None:
            # a moment later, so the request is in flight when the process dies
            threading.Timer(0.05, self.on_crash).start()

    @property
    def served_model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path


def count_prompt_tokens(prompt: Any) -> int:
    """A stand-in tokenizer: token ids count as given, text ~ one token per word."""
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], int):
            return len(prompt)
        return sum(count_prompt_tokens(p) for p in prompt)
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    return 1


def make_handler(state: State):
    # the launch's output-quality perturbations: a surface rule's, then the knob's
    quality_model = toylm.ToyLM(",".join(filter(None, (
        state.perf.quality, os.environ.get("GPUSERVE_LAB_STANDIN_QUALITY", "")))))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt: str, *a) -> None:  # uvicorn access-log style
            pass

        def _access(self, code: int) -> None:
            phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else ""
            logs.uvicorn(f'{self.client_address[0]}:{self.client_address[1]} - '
                         f'"{self.command} {self.path} HTTP/1.1" {code} {phrase}')

        # -- responses ---------------------------------------------------
        def _send(self, code: int, body: bytes = b"", ctype: str = "application/json",
                  extra: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self._access(code)

        def _json(self, code: int, obj: Any) -> None:
            self._send(code, _dumps(obj).encode())

        def _empty(self, code: int) -> None:
            self.send_response(code)
            self.send_header("content-length", "0")
            self.end_headers()
            self._access(code)

        def _stream_start(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self._access(200)

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream_end(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        # -- plumbing ----------------------------------------------------
        def _authorized(self, path: str) -> bool:
            key = state.args.api_key
            if not key or path.startswith(("/health", "/ready", "/metrics")):
                return True
            header = self.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            return scheme.lower() == "bearer" and token.strip() == key

        def _body(self) -> Any:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw else {}

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                self._json(401, {"error": "Unauthorized"})
                return
            routes = {
                ("GET", "/health"): self.health, ("GET", "/health_generate"): self.health,
                ("GET", "/ready"): self.ready,
                ("GET", "/model_info"): self.model_info,
                ("GET", "/get_model_info"): self.model_info,
                ("GET", "/server_info"): self.server_info,
                ("GET", "/get_server_info"): self.server_info,
                ("GET", "/v1/models"): self.models,
                ("POST", "/generate"): self.generate, ("PUT", "/generate"): self.generate,
                ("POST", "/v1/completions"): self.completions,
                ("GET", "/metrics"): self.metrics,
                ("GET", "/v1/loads"): self.loads,
                ("GET", "/freeze_gc"): self.ok, ("POST", "/freeze_gc"): self.ok,
                ("GET", "/flush_cache"): self.ok, ("POST", "/flush_cache"): self.ok,
            }
            handler = routes.get((method, path))
            if handler is None:
                known = {p for (_, p) in routes}
                if path in known:
                    self._json(405, {"detail": "Method Not Allowed"})
                else:
                    self._json(404, {"detail": "Not Found"})
                return
            try:
                handler()
            except (BrokenPipeError, ConnectionResetError):
                pass
            except json.JSONDecodeError as e:
                self._json(400, {"object": "error", "message": f"Invalid JSON: {e}",
                                 "type": "BadRequestError", "param": None, "code": 400})

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._route("PUT")

        # -- endpoints ---------------------------------------------------
        def ok(self) -> None:
            self._empty(200)

        def health(self) -> None:
            self._empty(200 if state.status == UP else 503)

        def loads(self) -> None:
            # COMPOSED: the per-rank load report smg polls on SGLang engines; field names
            # as smg's poller test reads "the upstream loads shape" (smg-project/smg,
            # crates/.../loads poller test: num_running_reqs, num_waiting_reqs,
            # token_usage). Not recorded from a real server; the rolling switch's idle
            # wait (gpuserve/data/scripts/sglang_idle.py) reads the two counts.
            with state.lock:
                running = state.running
            waiting = state.pd.waiting() if state.pd is not None else 0
            self._json(200, {"loads": [{"dp_rank": 0, "num_running_reqs": running,
                                        "num_waiting_reqs": waiting}]})

        def ready(self) -> None:
            self._empty(200 if state.status == UP else 503)

        def model_info(self) -> None:
            a = state.args
            self._json(200, {
                "model_path": a.model_path, "served_model_name": state.served_model_name,
                "tokenizer_path": a.tokenizer_path or a.model_path, "is_generation": True,
                "preferred_sampling_params": a.preferred_sampling_params,
                "weight_version": a.weight_version, "load_format": a.load_format,
                "reasoning_parser": a.reasoning_parser, "tool_call_parser": a.tool_call_parser,
                "disaggregation_mode": a.disaggregation_mode,
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": state.info.get("_model_type"),
                "architectures": state.info.get("_architectures"),
            })

        def server_info(self) -> None:
            body = {k: v for k, v in state.info.items() if not k.startswith("_")}
            body.update({
                "startup_time": state.startup_time,
                "internal_states": [{"last_gen_throughput": state.last_gen_throughput,
                                     "avg_spec_accept_length":
                                         state.perf.spec_accept_length}],
                "version": state.version, "frontend": "python",
            })
            self._json(200, body)

        def models(self) -> None:
            name = state.served_model_name
            self._json(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": name, "parent": None,
                "max_model_len": state.info.get("context_len")}]})

        # -- generation ----------------------------------------------------
        def _decode(self, prompt_tokens: int, max_new: int, on_token, stream_interval: int = 1
                    ) -> float:
            """Produce ``max_new`` tokens at the simulated rate; returns e2e latency.

            ``on_token(i, word, send)`` sees every token; ``send`` says whether a stream
            chunk goes out now, by SGLang's rule (output_streamer.py::accept): every
            token at interval 1, else the first token at once, then whenever
            ``stream_interval`` tokens are unsent, and at the end. The thread sleeps only
            until the next chunk is due (never per token between chunks, never busy).
            """
            start = time.monotonic()
            state.count_start()
            reserved = state.admit(prompt_tokens + max_new)
            with state.lock:
                state.running += 1
                state.active_tokens += prompt_tokens
            held = prompt_tokens
            ttft = 0.0
            try:
                if not self.prefilled:  # a PD decode server received the KV cache
                    with state.prefill_lock:
                        time.sleep(max(state.prefill_free_at - time.monotonic(), 0.0)
                                   + prompt_tokens / state.prefill_tps)
                if self.pd_body is not None:  # a PD prefill server hands it over
                    state.pd.produced(self.pd_body, prompt_tokens)
                if state.perf.ttft_s > 0:
                    time.sleep(state.perf.ttft_s)
                ttft = time.monotonic() - start
                state.ttft.observe(ttft)
                interval = max(int(stream_interval or 1), 1)
                next_t = time.monotonic()
                sent = 0
                for i in range(max_new):
                    if i:
                        step = state.token_interval()
                        next_t += step
                        state.itl.observe(step)
                    send = (interval == 1 or i + 1 - sent >= interval or sent == 0
                            or i == max_new - 1)
                    if send:
                        delay = next_t - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        sent = i + 1
                    with state.lock:
                        state.active_tokens += 1
                        state.window_tokens += 1
                    held += 1
                    on_token(i, _WORDS[i % len(_WORDS)], send)
            finally:
                with state.lock:
                    state.running -= 1
                    state.active_tokens -= held
                state.release(reserved)
                state.finished()
            e2e = time.monotonic() - start
            with state.lock:
                state.requests_total += 1
                state.prompt_tokens_total += prompt_tokens
                state.generation_tokens_total += max_new
                if e2e > ttft:
                    state.last_gen_throughput = max_new / max(e2e - ttft, 1e-6)
                state.e2e.observe(e2e)
            return e2e

        def _stream_interval(self, params: dict) -> int:
            """Per-request ``sampling_params.stream_interval`` or the server's flag."""
            return int(params.get("stream_interval") or state.args.stream_interval or 1)

        prefilled = False
        pd_body: dict | None = None

        def _pd_begin(self, body: dict, prompt_tokens: int) -> str | None:
            """A PD request's role (pd.py: the decode side fetches the KV cache first),
            "" outside PD, None when the fetch failed (answered 500)."""
            self.prefilled, self.pd_body = False, None
            if state.pd is None or state.pd.room_of(body) is None:
                return ""
            error = state.pd.receive(body, prompt_tokens)
            if error:
                self._json(500, {"object": "error", "message": error, "code": 500})
                return None
            self.prefilled = state.pd.mode == "decode"
            self.pd_body = body if state.pd.mode == "prefill" else None
            return state.pd.mode

        def generate(self) -> None:
            body = self._body()
            if isinstance(body, dict) and not body.get("stream"):
                try:
                    items = toylm.batch_items(body)
                except ValueError as e:  # http_server.py _create_error_response
                    self._json(400, {"error": {"message": str(e)}})
                    return
                if items is not None:
                    return self._toy_batch(items)
            if isinstance(body, dict) and body.get("return_logprob") and not body.get("stream"):
                return self._toy_generate(body)
            params = body.get("sampling_params") or {}
            max_new = int(params.get("max_new_tokens", 128) if params.get(
                "max_new_tokens") is not None else 128)
            prompt = body.get("input_ids") if body.get("input_ids") is not None \
                else body.get("text", "")
            prompt_tokens = count_prompt_tokens(prompt)
            role = self._pd_begin(body, prompt_tokens)
            if role is None:
                return
            max_new = 1 if role == "prefill" else max_new  # the prefill's first token
            rid = body.get("rid") or uuid.uuid4().hex
            out_ids: list[int] = []
            words: list[str] = []

            def meta(finished: bool, e2e: float | None = None) -> dict:
                m = {"id": rid,
                     "finish_reason": ({"type": "length", "length": max_new}
                                       if finished else None),
                     "prompt_tokens": prompt_tokens, "weight_version": "default",
                     "num_retractions": 0, "reasoning_tokens": 0,
                     "completion_tokens": len(out_ids), "cached_tokens": 0}
                if e2e is not None:
                    m["e2e_latency"] = e2e
                return m

            if body.get("stream"):
                self._stream_start()

                def on_token(i: int, word: str, send: bool) -> None:
                    out_ids.append(1000 + i)
                    words.append(word)
                    if send and i < max_new - 1:
                        self._chunk("data: " + _dumps({
                            "text": " " + " ".join(words), "output_ids": list(out_ids),
                            "meta_info": meta(False)}) + "\n\n")

                e2e = self._decode(prompt_tokens, max_new, on_token,
                                   self._stream_interval(params))
                self._chunk("data: " + _dumps({
                    "text": " " + " ".join(words) if words else "",
                    "output_ids": list(out_ids), "meta_info": meta(True, e2e)}) + "\n\n")
                self._chunk("data: [DONE]\n\n")
                self._stream_end()
                return

            def collect(i: int, word: str, send: bool) -> None:
                out_ids.append(1000 + i)
                words.append(word)

            e2e = self._decode(prompt_tokens, max_new, collect)
            self._json(200, {"text": " " + " ".join(words) if words else "",
                             "output_ids": out_ids, "meta_info": meta(True, e2e)})

        def _toy_generate(self, body: dict) -> None:
            """``/generate`` with logprobs: the toy model's reply (toylm.py), after the
            simulated time of its prefill and decode."""
            spec = state.perf.spec_accept_length or 2.0
            reply = toylm.generate(quality_model, body, spec if getattr(
                state.args, "speculative_algorithm", None) else None)
            meta = reply["meta_info"]
            e2e = self._decode(meta["prompt_tokens"], max(meta["completion_tokens"], 1),
                               lambda *a: None)
            meta["e2e_latency"] = e2e
            self._json(200, reply)

        def _toy_batch(self, items: list[dict]) -> None:
            """SGLang's batch ``/generate``: the toy model's replies as one JSON list in
            order (tokenizer_manager.py ``_handle_batch_request``), after one batched
            prefill and one decode of the batch (COMPOSED pacing: ``_batch_decode``)."""
            spec = state.perf.spec_accept_length or 2.0
            spec = spec if getattr(state.args, "speculative_algorithm", None) else None
            replies: list[dict] = []

            def work() -> list[int]:
                replies.extend(toylm.generate(quality_model, b, spec) for b in items)
                return [max(r["meta_info"]["completion_tokens"], 1) for r in replies]

            cache = state.prefix_cache
            e2e = self._batch_decode([toylm.prompt_length(b) for b in items],
                                     [toylm.max_new(b) for b in items], work,
                                     prefill=None if cache is None else
                                     sum(cache.uncached(b) for b in items))
            for reply, seconds in zip(replies, e2e, strict=True):
                reply["meta_info"]["e2e_latency"] = seconds
            self._json(200, replies)

        def _batch_decode(self, prompts: list[int], limits: list[int], work,
                          prefill: int | None = None) -> list[float]:
            """Simulated time of a batch (COMPOSED): one prefill of its prompt tokens
            (``prefill``: those the prefix cache lacks) at the surface's prefill rate,
            reserved after the prefill before it (as a batch is one scheduler batch;
            the toy model's own CPU time, ``work()``, which returns each request's
            output length, runs inside that window, outside the lock, so other batches'
            windows go on meanwhile), then decode steps of the running requests together
            at the batch's step time, each request leaving when its own tokens are out;
            the e2e latency of each."""
            start, n = time.monotonic(), len(prompts)
            for _ in prompts:
                state.count_start()
            reserved = state.admit(sum(prompts) + sum(limits))
            with state.lock:
                state.running += n
                state.active_tokens += sum(prompts)
            held, left, e2e, news = sum(prompts), n, [0.0] * n, [1] * n
            try:
                with state.prefill_lock:  # reserve the prefill after the one before
                    end = max(time.monotonic(), state.prefill_free_at) \
                        + (sum(prompts) if prefill is None else prefill) / state.prefill_tps
                    state.prefill_free_at = end
                news = work()
                time.sleep(max(end - time.monotonic(), 0.0))
                if state.perf.ttft_s > 0:
                    time.sleep(state.perf.ttft_s)
                for _ in prompts:
                    state.ttft.observe(time.monotonic() - start)
                next_t = time.monotonic()
                for step in range(max(news)):
                    if step:
                        next_t += state.token_interval()
                        time.sleep(max(next_t - time.monotonic(), 0.0))
                    active = [i for i in range(n) if news[i] > step]
                    with state.lock:
                        state.active_tokens += len(active)
                        state.window_tokens += len(active)
                    held += len(active)
                    for i in active:
                        if news[i] == step + 1:
                            e2e[i] = time.monotonic() - start
                            left -= 1
                            with state.lock:
                                state.running -= 1
            finally:
                with state.lock:
                    state.running -= left
                    state.active_tokens -= held
                state.release(reserved)
                state.finished()
            with state.lock:
                state.requests_total += n
                state.prompt_tokens_total += sum(prompts)
                state.generation_tokens_total += sum(news)
            for seconds in e2e:
                state.e2e.observe(seconds)
            return e2e

        def completions(self) -> None:
            body = self._body()
            model = body.get("model") or state.served_model_name
            max_new = body.get("max_tokens")
            max_new = 16 if max_new is None else int(max_new)
            prompt_tokens = count_prompt_tokens(body.get("prompt", ""))
            role = self._pd_begin(body, prompt_tokens)
            if role is None:
                return
            max_new = 1 if role == "prefill" else max_new  # the prefill's first token
            rid = uuid.uuid4().hex
            created = int(time.time())
            words: list[str] = []

            def usage(completion: int, exclude_none: bool = False) -> dict:
                u = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                     "completion_tokens": completion, "prompt_tokens_details": None,
                     "reasoning_tokens": 0, "completion_tokens_details": None}
                return {k: v for k, v in u.items() if v is not None} if exclude_none else u

            if body.get("stream"):
                opts = body.get("stream_options") or {}
                include_usage = bool(opts.get("include_usage")) or bool(
                    state.args.stream_response_default_include_usage)
                continuous = bool(opts.get("continuous_usage_stats"))
                self._stream_start()

                pending: list[str] = []

                def on_token(i: int, word: str, send: bool) -> None:
                    words.append(word)
                    pending.append(word)
                    if not send:
                        return
                    text = "".join(" " + w for w in pending)
                    pending.clear()
                    chunk = {"id": rid, "object": "text_completion", "created": created,
                             "model": model,
                             "choices": [{"index": 0, "text": text, "logprobs": None,
                                          "finish_reason": "length" if i == max_new - 1
                                          else None, "matched_stop": None}],
                             "usage": usage(i + 1) if continuous else None}
                    self._chunk("data: " + _dumps(chunk) + "\n\n")

                self._decode(prompt_tokens, max_new, on_token,
                             self._stream_interval(body))
                if include_usage:
                    self._chunk("data: " + _dumps({
                        "id": rid, "object": "text_completion", "created": created,
                        "model": model, "choices": [],
                        "usage": usage(len(words), exclude_none=True)}) + "\n\n")
                self._chunk("data: [DONE]\n\n")
                self._stream_end()
                return

            self._decode(prompt_tokens, max_new, lambda i, w, send: words.append(w))
            self._json(200, {
                "id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": "".join(" " + w for w in words),
                             "logprobs": None, "finish_reason": "length",
                             "matched_stop": None}],
                "usage": usage(len(words)), "metadata": None})

        def metrics(self) -> None:
            if not state.args.enable_metrics:
                self._json(404, {"detail": "Not Found"})
                return
            self._send(200, render_metrics(state).encode(),
                       ctype="text/plain; version=0.0.4; charset=utf-8")

    return Handler


def render_metrics(state: State) -> str:
    """Prometheus text with SGLang's metric names and labels
    (srt/observability/metrics_collector.py)."""
    name = state.served_model_name
    # SGLang labels every series with the server's PD role (DisaggregationMode.
    # to_engine_type: prefill, decode, else unified)
    engine = state.pd.mode if state.pd is not None else "unified"
    sched = (f'engine_type="{engine}",model_name="{name}",moe_ep_rank="0",pp_rank="0",'
             f'tp_rank="0"')
    tok = f'engine_type="{engine}",is_streaming="false",model_name="{name}"'
    max_tokens = state.info.get("max_total_num_tokens") or 0
    lines: list[str] = []

    def gauge(metric: str, doc: str, value: float, labels: str = sched) -> None:
        lines.extend([f"# HELP sglang:{metric} {doc}", f"# TYPE sglang:{metric} gauge",
                      f"sglang:{metric}{{{labels}}} {float(value)}"])

    def counter(metric: str, doc: str, value: float, labels: str = tok) -> None:
        lines.extend([f"# HELP sglang:{metric} {doc}", f"# TYPE sglang:{metric} counter",
                      f"sglang:{metric}{{{labels}}} {float(value)}"])

    def histogram(metric: str, doc: str, h: Histogram, labels: str) -> None:
        lines.extend([f"# HELP sglang:{metric} {doc}", f"# TYPE sglang:{metric} histogram"])
        for edge, count in zip(h.edges, h.counts, strict=True):
            lines.append(f'sglang:{metric}_bucket{{{labels},le="{float(edge)}"}} {float(count)}')
        lines.append(f'sglang:{metric}_bucket{{{labels},le="+Inf"}} {float(h.n)}')
        lines.append(f"sglang:{metric}_count{{{labels}}} {float(h.n)}")
        lines.append(f"sglang:{metric}_sum{{{labels}}} {h.total}")

    with state.lock:
        running = state.running
        usage = min(1.0, running * 64 / max_tokens) if max_tokens else 0.0
        gauge("num_running_reqs", "The number of running requests.", running)
        gauge("num_queue_reqs", "The number of requests in the waiting queue.", 0)
        gauge("gen_throughput", "The generation throughput (token/s).",
              state.last_gen_throughput)
        gauge("token_usage", "The token usage.", round(usage, 4))
        gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
              max_tokens)
        counter("prompt_tokens_total", "Number of prefill tokens processed.",
                state.prompt_tokens_total)
        counter("generation_tokens_total", "Number of generation tokens processed.",
                state.generation_tokens_total)
        counter("num_requests_total", "Number of requests processed.", state.requests_total)
        histogram("time_to_first_token_seconds",
                  "Histogram of time to first token in seconds.", state.ttft, tok)
        histogram("inter_token_latency_seconds",
                  "Histogram of inter-token latency in seconds.", state.itl,
                  f'engine_type="{engine}",model_name="{name}"')
        histogram("e2e_request_latency_seconds",
                  "Histogram of End-to-end request latency in seconds", state.e2e, tok)
    if state.pd is not None:
        _pd_metrics(state.pd, gauge, counter, histogram, sched)
    return "\n".join(lines) + "\n"


def _pd_metrics(pd, gauge, counter, histogram, sched: str) -> None:
    """A PD server's metrics (sglang/_standin/pd.py, PdStats): SGLang 0.5.23's names and
    types (metrics_collector.py), each role the ones its scheduler sets."""
    if pd.mode == "prefill":
        gauge("num_prefill_inflight_queue_reqs",
              "The number of requests in the prefill inflight queue.", pd.inflight(), sched)
    with pd.stats.lock:
        if pd.mode == "decode":
            gauge("num_decode_transfer_queue_reqs",
                  "The number of requests in the decode transfer queue.",
                  pd.stats.transfer_queue, sched)
        counter("num_bootstrap_failed_reqs_total", "The number of bootstrap failed requests.",
                pd.stats.bootstrap_failed, sched)
        counter("num_transfer_failed_reqs_total", "The number of transfer failed requests.",
                pd.stats.transfer_failed, sched)
        if pd.mode == "prefill":
            histogram("kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.",
                      pd.stats.latency_ms, sched)
            histogram("kv_transfer_speed_gb_s", "Histogram of KV cache transfer speed in GB/s.",
                      pd.stats.speed_gb_s, sched)
            histogram("kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.",
                      pd.stats.total_mb, sched)


class _Server(ThreadingHTTPServer):
    """One thread per connection; a listen backlog that takes a benchmark's burst (the
    socketserver default of 5 makes the kernel drop SYNs when 64 clients connect at
    once, and each dropped one costs a 1 s retransmit in the measured TTFT)."""

    daemon_threads = True
    request_queue_size = 1024


def serve(state: State, host: str, port: int) -> ThreadingHTTPServer:
    return _Server((host, port), make_handler(state))
