"""``python -m sglang.benchmark.serving``: SGLang's online benchmark client, lab stand-in.

Accepts exactly the real client's command line (the bundled catalog, see
sglang._standin.bench_args) and runs the same flow as sglang/benchmark/serving.py
(0.5.23) ``run_benchmark`` / ``benchmark``: wait for ``/v1/models``, resolve model and
tokenizer, build the dataset, warm up, send the requests (all at t=0 or Poisson at
--request-rate, at most --max-concurrency in flight), print the report and append one
JSON line per run to --output-file.

What the stand-in cannot do it refuses with a message (exit 1): backends other than
sglang / sglang-native / sglang-oai, datasets other than random-ids, and the options
listed in UNSIMULATED. Its "tokenizer" is a local model directory's vocabulary size
(config.json, or tokenizer.json's vocabulary): a prompt of N token ids is sent as N
words, which the stand-in server counts as N tokens. Random draws use Python's
``random`` seeded with --seed, not numpy's, so prompts differ from the real client's
while lengths follow the same rule.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from sglang._standin import bench_http, bench_metrics
from sglang._standin.bench_args import parse_args

_API_PATHS = {"sglang": "/generate", "sglang-native": "/generate",
              "sglang-oai": "/v1/completions"}
_DEFAULT_PORTS = {"sglang": 30000, "sglang-native": 30000, "sglang-oai": 30000,
                  "lmdeploy": 23333, "vllm": 8000, "vllm-embedding": 8000, "trt": 8000,
                  "gserver": 9988, "truss": 8080}
# Options whose effect the stand-in does not simulate: refused rather than ignored.
UNSIMULATED = {"rust_client": False, "profile": False, "pd_separated": False,
               "lora_name": None, "cache_report": False, "plot_throughput": False,
               "use_trace_timestamps": False, "apply_chat_template": False,
               "fake_prefill": False, "print_requests": False}


def _standin_refuses(message: str) -> None:
    print(f"sglang lab stand-in: {message}", file=sys.stderr)
    sys.exit(1)


class Tokenizer:
    """What the client needs of a tokenizer: vocab_size, decode, encode (counting)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.vocab_size = self._vocab_size(Path(path))

    @staticmethod
    def _vocab_size(d: Path) -> int:
        tok = d / "tokenizer.json"
        if tok.is_file():
            vocab = (json.loads(tok.read_text()).get("model") or {}).get("vocab")
            if vocab:
                return len(vocab)
        cfg = d / "config.json"
        if cfg.is_file():
            size = json.loads(cfg.read_text()).get("vocab_size")
            if size:
                return int(size)
        raise OSError(f"Can't load tokenizer for '{d}'. If you were trying to load it from "
                      "'https://huggingface.co/models', make sure you don't have a local "
                      f"directory with the same name. Otherwise, make sure '{d}' is the "
                      "correct path to a directory containing all relevant files for a "
                      "PreTrainedTokenizerFast tokenizer.")

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"t{i}" for i in ids)


def get_tokenizer(name: str) -> Tokenizer:
    """sglang/benchmark/utils.py::get_tokenizer: a path that does not exist is a Hub id,
    which the lab (no network, HF_HUB_OFFLINE=1 on the host) cannot fetch."""
    if not os.path.exists(name):
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files, "
                          f"and couldn't find them in the cached files. Check your internet "
                          f"connection or see how to run the library in offline mode at "
                          f"'https://huggingface.co/docs/transformers/installation"
                          f"#offline-mode'. ({name!r} is not a local directory and "
                          f"HF_HUB_OFFLINE=1)")
        raise OSError(f"{name!r} is not a local directory; the lab stand-in cannot download "
                      "a tokenizer from the Hub (pass --tokenizer <model dir>)")
    return Tokenizer(name)


def check_chat_template(model: str) -> bool:
    try:
        cfg = Path(model) / "tokenizer_config.json"
        if not Path(model).is_dir():
            raise OSError(f"{model} is not a local folder and is not a valid model "
                          "identifier listed on 'https://huggingface.co/models'")
        return cfg.is_file() and "chat_template" in json.loads(cfg.read_text())
    except Exception as e:  # noqa: BLE001 (the real one prints any failure)
        print(f"Fail to load tokenizer config with error={e}")
        return False


def random_lens(rng: random.Random, full_len: int, ratio: float, num: int) -> list[int]:
    """datasets/common.py::compute_random_lens: uniform on [max(int(L*ratio), 1), L]."""
    if full_len <= 0:
        return [0] * num
    return [rng.randint(max(int(full_len * ratio), 1), full_len) for _ in range(num)]


def random_ids_dataset(args, tokenizer: Tokenizer, rng: random.Random) -> list[tuple]:
    """datasets/random.py::sample_random_requests with random_sample=False: prompt i is the
    arithmetic run (offset_i + i + j) % vocab_size, j < input_len_i."""
    n = args.num_prompts
    in_lens = random_lens(rng, args.random_input_len, args.random_range_ratio, n)
    out_lens = random_lens(rng, args.random_output_len, args.random_range_ratio, n)
    vocab = tokenizer.vocab_size
    offsets = [rng.randrange(vocab) for _ in range(n)]
    rows = []
    for i in range(n):
        ids = [(offsets[i] + i + j) % vocab for j in range(in_lens[i])]
        prompt = ids if args.tokenize_prompt else tokenizer.decode(ids)
        rows.append((prompt, in_lens[i], out_lens[i]))
    print(f"#Input tokens: {sum(in_lens)}")
    print(f"#Output tokens: {sum(out_lens)}")
    return rows


def wait_for_endpoint(url: str, timeout_sec: int) -> bool:
    print(f"Waiting up to {timeout_sec}s for {url} to become ready...")
    start = time.perf_counter()
    while True:
        try:
            status, _ = bench_http.get(url, bench_http.auth_headers(), timeout=5)
            if status == 200:
                print(f"Server ready in {time.perf_counter() - start:.1f}s.")
                return True
        except OSError:
            pass
        if time.perf_counter() - start >= timeout_sec:
            print(f"Server did not become ready within {timeout_sec}s timeout.")
            return False
        time.sleep(1)


def _server_info(base_url: str):
    try:
        status, body = bench_http.get(base_url + "/server_info", bench_http.auth_headers())
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def _refuse_unsimulated(args) -> None:
    if args.backend not in _API_PATHS:
        _standin_refuses(f"--backend {args.backend} is not simulated (supported: "
                         f"{', '.join(_API_PATHS)})")
    if args.dataset_name != "random-ids":
        _standin_refuses(f"--dataset-name {args.dataset_name} is not simulated (supported: "
                         "random-ids, which needs no download)")
    asked = sorted(k for k, unset in UNSIMULATED.items() if getattr(args, k, unset) != unset)
    if asked:
        _standin_refuses(f"not simulated: {', '.join('--' + a.replace('_', '-') for a in asked)}")


def run_benchmark(args, catalog: dict) -> dict:
    print(f"benchmark_args={args}")
    _refuse_unsimulated(args)
    rng = random.Random(args.seed)
    extra = json.loads(args.extra_request_body) if args.extra_request_body else {}
    if args.tokenize_prompt and args.backend != "sglang":
        raise AssertionError("`--tokenize-prompt` only compatible with `--backend sglang` "
                             "currently")
    if args.port is None:
        args.port = _DEFAULT_PORTS.get(args.backend, 30000)
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    model_url = f"{base_url}/v1/models"
    api_url = f"{base_url}{_API_PATHS[args.backend]}"
    if args.ready_check_timeout_sec > 0 and not wait_for_endpoint(
            model_url, args.ready_check_timeout_sec):
        print(f"Server at {model_url} is not ready. Exiting.")
        sys.exit(1)
    if args.model is None:
        try:
            _, body = bench_http.get(model_url, bench_http.auth_headers())
            models = json.loads(body).get("data", [])
            args.model = models[0]["id"] if models else None
        except Exception as e:  # noqa: BLE001
            print(f"Failed to fetch model from {model_url}. Error: {e}")
            print("Please specify the correct host and port using `--host` and `--port`.")
            sys.exit(1)
    if args.model is None:
        print("No model specified or found. Please provide a model using `--model`.")
        sys.exit(1)
    if not check_chat_template(args.model):
        print("\nWARNING It is recommended to use the `Chat` or `Instruct` model for "
              "benchmarking.\nBecause when the tokenizer counts the output tokens, if there "
              "is gibberish, it might count incorrectly.\n")
    print(f"{args}\n")
    model_id = args.served_model_name or args.model
    tokenizer_id = args.tokenizer
    if tokenizer_id is None:
        try:
            status, body = bench_http.get(base_url + "/model_info",
                                          bench_http.auth_headers(), timeout=5)
            if status == 200:
                info = json.loads(body)
                tokenizer_id = info.get("tokenizer_path") or info.get("model_path")
        except OSError:
            pass
    tokenizer = get_tokenizer(tokenizer_id or args.model)
    rows = random_ids_dataset(args, tokenizer, rng)
    return benchmark(args, catalog, base_url, api_url, model_id, rows, extra, rng)


def benchmark(args, catalog: dict, base_url: str, api_url: str, model_id: str,
              rows: list[tuple], extra: dict, rng: random.Random) -> dict:
    headers = bench_http.request_headers(args.header)
    limit = threading.BoundedSemaphore(args.max_concurrency) if args.max_concurrency else None

    def one(prompt, prompt_len: int, output_len: int):
        if args.backend == "sglang-oai":
            return bench_http.openai_completions(api_url, prompt, prompt_len, output_len,
                                                 args, model_id, extra, headers)
        return bench_http.sglang_generate(api_url, prompt, prompt_len, output_len, args,
                                          extra, headers)

    def limited(i: int, row: tuple, outputs: list, done) -> None:
        if limit is None:
            outputs[i] = one(*row)
        else:
            with limit:
                outputs[i] = one(*row)
        if done:
            done()

    def run_all(batch: list[tuple], rate: float, done=None) -> list:
        outputs: list = [None] * len(batch)
        threads = []
        for i, row in enumerate(batch):
            t = threading.Thread(target=limited, args=(i, row, outputs, done), daemon=True)
            t.start()
            threads.append(t)
            if not math.isinf(rate):
                time.sleep(rng.expovariate(rate))
        for t in threads:
            t.join()
        return outputs

    print(f"Starting warmup with {args.warmup_requests} sequences...")
    prompt, prompt_len, output_len = rows[0]
    warm = run_all([(prompt, prompt_len, min(output_len, 32))] * args.warmup_requests,
                   math.inf)
    if args.warmup_requests > 0 and not any(o.success for o in warm):
        raise ValueError("Warmup failed - Please make sure benchmark arguments are correctly "
                         f"specified. Error: {warm[0].error}")
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main "
          "benchmark run...")
    if args.flush_cache:
        status, body = bench_http.post(base_url + "/flush_cache", bench_http.auth_headers())
        if status >= 400:
            raise RuntimeError(f"{status} flushing the cache: {body[:200]!r}")
    time.sleep(1.0)

    start = time.perf_counter()
    bar = None if args.disable_tqdm else bench_http.Progress(len(rows))
    bar_lock = threading.Lock()

    def done() -> None:
        if bar is not None:
            with bar_lock:
                bar.update(1)

    outputs = run_all(rows, args.request_rate, done)
    if bar is not None:
        bar.close()
    accept_length = None
    info = _server_info(base_url)
    if info:
        states = info.get("internal_states") or []
        accept_length = states[0].get("avg_spec_accept_length") if states else None
    duration = time.perf_counter() - start
    m = bench_metrics.calculate([r[1] for r in rows], outputs, duration)
    gp = (bench_metrics.goodput(outputs, dict(getattr(args, "goodput", None)), duration)
          if getattr(args, "goodput", None) else None)
    print(bench_metrics.report(args.backend, args.request_rate, args.max_concurrency,
                               duration, m, accept_length, gp))
    result = {"tag": args.tag, "backend": args.backend, "dataset_name": args.dataset_name,
              "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
              "sharegpt_output_len": args.sharegpt_output_len,
              "random_input_len": args.random_input_len,
              "random_output_len": args.random_output_len,
              "random_range_ratio": args.random_range_ratio,
              "server_info": _server_info(base_url), "duration": duration}
    result.update({k: m[k] for k in catalog["output_keys"] if k in m})
    result["accept_length"] = accept_length
    result = {k: result[k] for k in catalog["output_keys"]}  # the client's key order
    if gp:
        result.update(gp)
    name = args.output_file or (f"{args.backend}_{datetime.now().strftime('%m%d')}_"
                                f"{args.num_prompts}_{args.random_input_len}_"
                                f"{args.random_output_len}.jsonl")
    details = {"input_lens": [o.prompt_len for o in outputs], "output_lens": m["_output_lens"],
               "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
               "generated_texts": [o.generated_text for o in outputs],
               "errors": [o.error for o in outputs]}
    with open(name, "a") as f:
        f.write(json.dumps(result | details if args.output_details else result) + "\n")
    return result | details


def cli_main(argv: list[str] | None = None) -> None:
    args, catalog = parse_args(sys.argv[1:] if argv is None else argv)
    run_benchmark(args, catalog)


if __name__ == "__main__":
    cli_main()
