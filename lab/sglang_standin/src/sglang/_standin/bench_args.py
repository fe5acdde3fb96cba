"""The benchmark client's command line: SGLang's parser rebuilt from the bundled catalog.

The wheel bundles ``bench.json`` (gpuserve/data/bench/sglang-<X>-serving.json, generated
from the real wheel by tools/gen_bench_catalog.py) and gpuserve's flagparser; this module
adds what the launch parser never needed, as gpuserve/measure/bench_catalog.py does (a
test keeps the two in agreement): the client's ``_finite_positive_float`` and
``_goodput_slo`` types, the exclusive ``--profile-prefill-url``/``--profile-decode-url``
pair, and the checks ``cli_main`` makes after ``parse_args`` (all messages verbatim from
sglang/benchmark/serving.py and rust_client.py, 0.5.23).
"""

from __future__ import annotations

import argparse
import json
import math
from importlib import resources

from sglang._standin.flagparser import build_parser


def load_catalog() -> dict:
    return json.loads(resources.files("sglang._standin").joinpath("bench.json").read_text())


def _finite_positive_float(value) -> float:
    try:
        parsed = float(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"expected a finite float > 0, got {value!r}") from exc
    if not math.isfinite(parsed) or parsed <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite float > 0, got {value!r}")
    return parsed


def _goodput_slo_type(params: dict):
    metrics = tuple(params.get("metrics", ()))

    def _goodput_slo(pair: str) -> tuple[str, float]:
        name, _, value = pair.partition(":")
        if name not in metrics:
            raise argparse.ArgumentTypeError(
                f"expected KEY:VALUE with KEY in {', '.join(metrics)}, got {pair!r}")
        return name, _finite_positive_float(value)

    return _goodput_slo


_REFINED = {"_finite_positive_float": lambda params: _finite_positive_float,
            "_goodput_slo": _goodput_slo_type}


def build_bench_parser(data: dict) -> argparse.ArgumentParser:
    parser = build_parser(data)
    parser.description = data.get("description")
    params = data.get("type_params") or {}
    for opt in data["options"]:
        kind = opt.get("sglang_type")
        if kind:
            parser._option_string_actions[opt["flags"][0]].type = _REFINED[kind](
                params.get(kind, {}))
    for group in data.get("mutually_exclusive") or []:
        g = parser.add_mutually_exclusive_group(required=group.get("required", False))
        g._group_actions.extend(parser._option_string_actions[f] for f in group["flags"])
    return parser


_RUST_THREADS = "--rust-worker-threads requires --rust-client"
_GSP_TURNS = "--tokenize-prompt requires --gsp-num-turns=1"
_ZIPF_ALPHA = "--gsp-group-distribution=zipf requires --gsp-zipf-alpha (a finite float > 0)"
_ALPHA_UNIFORM = ("--gsp-zipf-alpha is only meaningful with --gsp-group-distribution=zipf; "
                  "remove --gsp-zipf-alpha or set --gsp-group-distribution=zipf")


def post_parse_error(data: dict, ns: argparse.Namespace) -> str | None:
    """cli_main's refusals after parse_args, when this version makes them."""
    made = set(data.get("post_parse_errors") or ())
    if (_RUST_THREADS in made and getattr(ns, "rust_worker_threads", None) is not None
            and not ns.rust_client):
        return _RUST_THREADS
    rust = data.get("rust_client")
    if getattr(ns, "rust_client", False) and rust:
        if ns.backend not in rust["supported_backends"]:
            return (f"--rust-client does not implement --backend {ns.backend}; "
                    f"supported: {', '.join(rust['supported_backends'])}")
        if ns.dataset_name not in rust["supported_datasets"]:
            return (f"--rust-client does not implement --dataset-name {ns.dataset_name}; "
                    f"supported: {', '.join(rust['supported_datasets'])}")
        requested = sorted(name for name, unset in rust["unsupported_options"].items()
                           if getattr(ns, name, unset) != unset)
        if requested:
            return ("--rust-client does not implement: "
                    f"{', '.join(requested)}. Drop --rust-client to run these "
                    "on the Python client.")
    if (_GSP_TURNS in made and getattr(ns, "dataset_name", None) == "generated-shared-prefix"
            and getattr(ns, "tokenize_prompt", False) and getattr(ns, "gsp_num_turns", 1) > 1):
        return _GSP_TURNS
    distribution = getattr(ns, "gsp_group_distribution", None)
    alpha = getattr(ns, "gsp_zipf_alpha", None)
    if _ZIPF_ALPHA in made and distribution == "zipf" and alpha is None:
        return _ZIPF_ALPHA
    if _ALPHA_UNIFORM in made and distribution == "uniform" and alpha is not None:
        return _ALPHA_UNIFORM
    return None


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict]:
    """Parse like cli_main: argparse's exit 2 with usage, then the post-parse checks."""
    data = load_catalog()
    parser = build_bench_parser(data)
    ns = parser.parse_args(argv)
    message = post_parse_error(data, ns)
    if message:
        parser.error(message)
    return ns, data
