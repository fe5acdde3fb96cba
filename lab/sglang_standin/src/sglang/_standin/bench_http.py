"""The benchmark client's HTTP side: SGLang's request functions, auth and a tqdm-like bar.

Request functions follow sglang/benchmark/serving.py (0.5.23):
``async_request_sglang_generate`` (``/generate``: cumulative ``text``, ITL = gap between
chunks / new tokens in ``meta_info.completion_tokens``) and
``async_request_openai_completions`` (``/v1/completions``: one ITL per non-empty text
chunk). One connection per request, as the real client opens one aiohttp session per
request; threads instead of asyncio, standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import traceback
import urllib.parse

from sglang._standin.bench_metrics import RequestOutput

TIMEOUT_S = 6 * 60 * 60  # BENCH_AIOHTTP_TIMEOUT_SECONDS


def auth_headers() -> dict[str, str]:
    """serving.py::get_auth_headers: OPENAI_API_KEY as a Bearer token, else API_KEY as is."""
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        return {"Authorization": f"Bearer {key}"}
    raw = os.environ.get("API_KEY")
    return {"Authorization": raw} if raw else {}


def request_headers(header_args: list[str] | None) -> dict[str, str]:
    headers = auth_headers()
    for h in header_args or []:
        k, _, v = h.partition("=")
        if k and v:
            headers[k] = v
    return headers


def _connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=TIMEOUT_S)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return conn, path


def get(url: str, headers: dict[str, str], timeout: float = 30.0) -> tuple[int, bytes]:
    """A plain GET (the real client's ``requests.get``); raises OSError when unreachable."""
    conn, path = _connect(url)
    conn.timeout = timeout
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post(url: str, headers: dict[str, str], body: dict | None = None) -> tuple[int, bytes]:
    conn, path = _connect(url)
    try:
        conn.request("POST", path, body=json.dumps(body or {}),
                     headers={"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _lines(url: str, payload: dict, headers: dict[str, str], out: RequestOutput):
    """POST ``payload``; yield each non-empty response line as it arrives (None on error)."""
    conn, path = _connect(url)
    try:
        conn.request("POST", path, body=json.dumps(payload),
                     headers={"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = (resp.reason or "") + ": " + resp.read().decode(errors="replace")
            out.success = False
            return
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if line:
                yield line
    finally:
        conn.close()


def sglang_generate(url: str, prompt, prompt_len: int, output_len: int, args,
                    extra: dict, headers: dict[str, str]) -> RequestOutput:
    params = {"temperature": args.temperature, "max_new_tokens": output_len,
              "ignore_eos": not args.disable_ignore_eos}
    if getattr(args, "top_p", 1.0) < 1.0:
        params["top_p"] = args.top_p
    payload = {("text" if isinstance(prompt, str) else "input_ids"): prompt,
               "sampling_params": params, "stream": not args.disable_stream,
               "lora_path": None, "return_logprob": args.return_logprob,
               "return_routed_experts": getattr(args, "return_routed_experts", False),
               "logprob_start_len": args.logprob_start_len, **extra}
    out = RequestOutput(prompt_len=prompt_len)
    st = time.perf_counter()
    out.start_time = recent = st
    last_len = 0
    n_out = output_len
    try:
        ok = True
        for line in _lines(url, payload, headers, out):
            data = line[6:] if line.startswith(b"data: ") else line
            latency = time.perf_counter() - st
            if data == b"[DONE]":
                continue
            msg = json.loads(data)
            meta = msg.get("meta_info") or {}
            if meta.get("prompt_tokens"):
                out.prompt_len = meta["prompt_tokens"]
            if msg.get("text"):
                now = time.perf_counter()
                out.generated_text = msg["text"]
                n_out = meta["completion_tokens"]
                if out.ttft == 0.0:
                    out.ttft = time.perf_counter() - st
                else:
                    new = n_out - last_len
                    if new == 0:
                        continue
                    out.itl.extend([(now - recent) / new] * new)
                recent = now
                last_len = n_out
        if out.error:
            ok = False
        if ok:
            out.success, out.latency, out.output_len = True, latency, n_out
    except Exception:  # noqa: BLE001 (the real client records any failure per request)
        out.success = False
        out.error = "".join(traceback.format_exception(*sys.exc_info()))
        print(f"output.error={out.error!r}")
    return out


def openai_completions(url: str, prompt, prompt_len: int, output_len: int, args, model: str,
                       extra: dict, headers: dict[str, str]) -> RequestOutput:
    payload = {"model": model, "prompt": prompt, "best_of": 1, "max_tokens": output_len,
               "stream": not args.disable_stream}
    if "temperature" not in extra:
        payload["temperature"] = 0.0
    if "ignore_eos" not in extra:
        payload["ignore_eos"] = not args.disable_ignore_eos
    payload.update(extra)
    out = RequestOutput(prompt_len=prompt_len)
    st = time.perf_counter()
    out.start_time = recent = st
    n_out = output_len
    text = ""
    try:
        for line in _lines(url, payload, headers, out):
            chunk = line.decode()
            chunk = chunk[len("data: "):] if chunk.startswith("data: ") else chunk
            latency = time.perf_counter() - st
            if chunk == "[DONE]":
                continue
            msg = json.loads(chunk)
            usage = msg.get("usage") or {}
            if usage.get("prompt_tokens"):
                out.prompt_len = usage["prompt_tokens"]
            choices = msg.get("choices") or [{}]
            if choices[0].get("text"):
                now = time.perf_counter()
                if out.ttft == 0.0:
                    out.ttft = time.perf_counter() - st
                else:
                    out.itl.append(now - recent)
                recent = now
                text += choices[0]["text"]
                n_out = usage.get("completion_tokens", n_out)
        if not out.error:
            out.generated_text, out.success, out.latency = text, True, latency
            out.output_len = n_out
    except Exception:  # noqa: BLE001
        out.success = False
        out.error = "".join(traceback.format_exception(*sys.exc_info()))
    return out


_BLOCKS = " ▏▎▍▌▋▊▉█"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """tqdm's default bar on a non-terminal (10 cells, ``\\r`` updates at most every
    0.1 s, a newline on close): ``  9%|▉         | 12/128 [00:03<00:30,  3.90it/s]``."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.n, self.stream = total, 0, stream
        self.start = time.monotonic()
        self.last = 0.0
        self._show()

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        frac = self.n / self.total if self.total else 1.0
        full, part = divmod(int(frac * 10 * 8), 8)
        bar = "█" * full
        if full < 10:
            bar += _BLOCKS[part] + " " * (10 - full - 1)
        rate = self.n / elapsed if self.n and elapsed > 0 else None
        if rate is None:
            rate_s, left = "?it/s", "?"
        else:
            rate_s = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
            left = _clock((self.total - self.n) / rate)
        return (f"{frac * 100:3.0f}%|{bar}| {self.n}/{self.total} "
                f"[{_clock(elapsed)}<{left}, {rate_s}]")

    def _show(self) -> None:
        self.stream.write("\r" + self.line())
        self.stream.flush()
        self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= 0.1 or self.n == self.total:
            self._show()

    def close(self) -> None:
        self._show()
        self.stream.write("\n")
        self.stream.flush()
