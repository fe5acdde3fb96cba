"""SGLang's benchmark client (``python -m sglang.benchmark.serving``): its flags and result keys.

Why: the serve deploy runs SGLang's own client on the host after the health gate, and a
wrong flag there only shows up as an argparse exit 2 at the end of a long deploy. The
catalogs under ``gpuserve/data/bench/`` are generated from the real wheels by
``tools/gen_bench_catalog.py``; this module rebuilds the client's argparse parser from
them (``gpuserve.launch.flagparser``, the same builder as the launch flags) plus the
little the launch parser never needed: two ``type=`` functions of the client, one
mutually exclusive pair, and the checks ``cli_main`` makes after parsing. It also says
which keys a run appends to ``--output-file``, so results can be checked against them.

Standard library only (plus gpuserve.errors / gpuserve.launch): no side effects, no network.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

from gpuserve import safeload, versions
from gpuserve.errors import InputError
from gpuserve.launch.catalog import base_version
from gpuserve.launch.flagparser import build_parser
from gpuserve.paths import DATA_DIR

_CATALOG_RE = re.compile(r"^sglang-(?P<version>.+)-serving\.json$")


def _catalog_dir() -> Path:
    return DATA_DIR / "bench"


def available_bench_versions() -> list[str]:
    """Versions with a committed benchmark-client catalog."""
    found = [m.group("version") for p in _catalog_dir().glob("sglang-*-serving.json")
             if (m := _CATALOG_RE.match(p.name))]
    return versions.ordered(found)


# ---- the client's own type= functions (sglang/benchmark/serving.py, messages verbatim) ----


def _finite_positive_float(value) -> float:
    try:
        parsed = float(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"expected a finite float > 0, got {value!r}") from exc
    if not math.isfinite(parsed) or parsed <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite float > 0, got {value!r}")
    return parsed


def _goodput_slo_type(params: dict) -> Callable[[str], tuple[str, float]]:
    metrics = tuple(params.get("metrics", ()))

    def _goodput_slo(pair: str) -> tuple[str, float]:
        name, _, value = pair.partition(":")
        if name not in metrics:
            raise argparse.ArgumentTypeError(
                f"expected KEY:VALUE with KEY in {', '.join(metrics)}, got {pair!r}")
        return name, _finite_positive_float(value)

    return _goodput_slo


_REFINED: dict[str, Callable[[dict], Callable]] = {
    "_finite_positive_float": lambda params: _finite_positive_float,
    "_goodput_slo": _goodput_slo_type,
}


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """error() raises instead of printing usage and exiting 2 (also -h/--help)."""

    def error(self, message: str):  # type: ignore[override]
        raise _ParseError(message)

    def print_help(self, file=None) -> None:
        pass

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise _ParseError("-h/--help prints the help text and exits: not a benchmark option")


def build_bench_parser(data: dict, parser_class: type[argparse.ArgumentParser]
                       = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The client's parser: flagparser's rebuild, refined types, exclusive groups."""
    parser = build_parser(data, parser_class=parser_class)
    parser.description = data.get("description")
    params = data.get("type_params") or {}
    for opt in data["options"]:
        kind = opt.get("sglang_type")
        if kind:
            if kind not in _REFINED:
                raise ValueError(f"{opt['flags'][0]}: no stdlib rebuild of type {kind!r}")
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
    """The refusal ``cli_main`` makes after ``parse_args``, or None.

    Mirrors, in 0.5.23's order: ``--rust-worker-threads requires --rust-client``;
    ``rust_client.check_supported`` (its sets come from the catalog); and
    ``_validate_parsed_gsp_args``. A rule applies only when the catalog lists its message
    among the version's ``parser.error`` literals (``post_parse_errors``).
    """
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


def _holds(condition: str, ns: argparse.Namespace) -> bool:
    """A condition recorded from the source (``args.cache_report``, ``goodput``)."""
    name = condition.removeprefix("args.")
    if not name.isidentifier() or not hasattr(ns, name):
        raise ValueError(f"cannot judge output condition {condition!r}")
    return bool(getattr(ns, name))


class BenchCatalog:
    """The command line and result keys of one SGLang version's benchmark client."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.version: str = data["version"]
        self.prog: str = data.get("prog", "serving.py")
        self._parser: argparse.ArgumentParser | None = None

    def __repr__(self) -> str:
        return f"<BenchCatalog sglang {self.version}: {len(self.data['options'])} options>"

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(f for o in self.data["options"] for f in o["flags"])

    @property
    def output_keys(self) -> tuple[str, ...]:
        """The keys of every run's result line, in the client's order."""
        return tuple(self.data["output_keys"])

    def result_keys(self, ns: argparse.Namespace) -> tuple[str, ...]:
        """The keys a run with parsed arguments ``ns`` writes (--goodput, --cache-report
        and --output-details add some)."""
        keys = list(self.output_keys)
        for extra in self.data.get("output_extra_keys") or []:
            if all(_holds(c, ns) for c in extra["when"]):
                keys.extend(k for k in extra["keys"] if k not in keys)
        return tuple(keys)

    def parser(self) -> argparse.ArgumentParser:
        if self._parser is None:
            self._parser = build_bench_parser(self.data, parser_class=_RaisingParser)
        return self._parser

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """Parse like ``cli_main``; ValueError with argparse's (or cli_main's) message."""
        try:
            ns = self.parser().parse_args(list(argv))
        except _ParseError as e:
            raise ValueError(str(e)) from None
        message = post_parse_error(self.data, ns)
        if message:
            raise ValueError(message)
        return ns

    def validate(self, argv: list[str], source: str | Path | None = None,
                 field: str | None = "bench_args", line: int | None = None
                 ) -> argparse.Namespace:
        """Judge ``argv`` (after ``python -m sglang.benchmark.serving``) as the client would.

        Raises ``InputError(source, field, "SGLang X benchmark client: <message>")``.
        """
        bad = [a for a in argv if not isinstance(a, str)]
        if bad:
            raise InputError(source, field, f"arguments must be strings, got {bad[0]!r}", line)
        try:
            return self.parse(argv)
        except ValueError as e:
            raise InputError(source, field, f"SGLang {self.version} benchmark client "
                             f"({self.prog}): {e}", line) from None


@cache
def _load(version: str) -> BenchCatalog:
    path = _catalog_dir() / f"sglang-{version}-serving.json"
    # Shipped, generated from the client's argparse: its defaults include Infinity.
    return BenchCatalog(safeload.load_json_file(path, safeload.DATA.but(json_constants=True)))


def load_bench_catalog(version: str) -> BenchCatalog:
    """The benchmark-client catalog for ``version`` (``+cu130`` and such are ignored).

    Raises InputError naming the available versions when there is none.
    """
    base = base_version(version)
    if base not in available_bench_versions():
        raise InputError(None, "sglang_version",
                         f"no benchmark-client catalog for SGLang {version!r}; available: "
                         f"{', '.join(available_bench_versions()) or 'none'} "
                         "(add one with tools/gen_bench_catalog.py)")
    return _load(base)


def output_keys(version: str) -> tuple[str, ...]:
    """The keys every run of ``version``'s client appends to --output-file."""
    return load_bench_catalog(version).output_keys
