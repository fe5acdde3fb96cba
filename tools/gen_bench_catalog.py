#!/usr/bin/env python3
"""Generate gpuserve/data/bench/sglang-<version>-serving.json from the real SGLang wheel.

Usage::

    .venv/bin/python tools/gen_bench_catalog.py 0.5.23 [0.5.19 ...] [--out-dir DIR]

Why this exists: the serve deploy runs SGLang's own benchmark client
(``python -m sglang.benchmark.serving``) on the host, and gpuserve must know, without
importing SGLang (the client imports torch), which command line that client accepts and
which keys it appends to ``--output-file``. Like tools/gen_flag_catalog.py (whose
download, stub-import and action-dumping code this script imports), it downloads the
wheel, imports ``sglang.benchmark.serving`` with heavy modules stubbed, and reads the
parser the client itself builds: ``cli_main()`` constructs the parser inline and calls
``parser.parse_args()``, so ``ArgumentParser.parse_args`` is patched to hand the parser
back instead of parsing. Nothing is transcribed by hand except the checks ``cli_main``
makes after parsing (``--rust-worker-threads`` without ``--rust-client``, the Rust
client's support check, the generated-shared-prefix checks), which
gpuserve/measure/bench_catalog.py mirrors and the fidelity check below exercises.

The catalog has the flag-catalog format (``prog``, ``allow_abbrev``, ``options``) that
``gpuserve.launch.flagparser.build_parser`` builds a parser from. Two things the launch
parser never needed are normalised, and recorded so nothing is lost:

- the client's ``type=`` functions ``_finite_positive_float`` and ``_goodput_slo`` are
  written as their base type (``float`` / ``str``) plus ``"sglang_type"``; bench_catalog
  installs the exact converter (its messages are SGLang's);
- the client's own ``LoRAPathAction`` (a list of the given names) is written as
  ``store`` with ``nargs: "*"``, which stores the same list (``"sglang_action"`` keeps
  the name); the launch parser's LoRAPathAction of the same name parses JSON and must
  not be used.

Mutually exclusive groups (``--profile-prefill-url`` / ``--profile-decode-url``) go to
``mutually_exclusive``. The keys of the result object the client writes (the dict
literal ``result = {...}`` in ``benchmark()``, plus the keys added under conditions) are
read from the source with ``ast`` into ``output_keys`` and ``output_extra_keys``.

Before writing, the script parses probe command lines (every option string with good,
bad and missing values, abbreviations, the post-parse rules, the deploy's own argv) with
the real ``cli_main`` (``run_benchmark`` replaced by a sentinel) and with
``gpuserve.measure.bench_catalog``; any difference in outcome, value or message aborts.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
import gen_flag_catalog as gfc  # noqa: E402 (tools/ is not a package)

DEFAULT_OUT_DIR = REPO_ROOT / "gpuserve" / "data" / "bench"
GENERATOR = "tools/gen_bench_catalog.py"
MODULE = "sglang.benchmark.serving"

# The client's type= functions that flagparser does not know: the base type flagparser
# builds with, refined by gpuserve.measure.bench_catalog.
_REFINED_TYPES = {"_finite_positive_float": "float", "_goodput_slo": "str"}
# Keys every run's result line must carry (bench.md §7): a guard that the AST walk found
# the right dict literal.
_EXPECTED_KEYS = {"tag", "backend", "request_rate", "server_info", "completed",
                  "output_throughput", "median_ttft_ms", "concurrency"}


# --------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------


def generate(version: str, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="gpuserve-bench-") as tmp_s:
        tmp = Path(tmp_s)
        wheel, src, deps = gfc.fetch_wheel(version, tmp)
        raw = tmp / "bench.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--introspect",
                        str(src), str(deps), str(raw)], check=True, env=env)
        parsed = json.loads(raw.read_text())
        catalog = {
            "version": version,
            "source": f"{wheel.name} from PyPI (sha256 {gfc._sha256(wheel)})",
            "generator": GENERATOR,
            "module": MODULE,
            **parsed,
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"sglang-{version}-serving.json"
    out.write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n")
    print(f"{out}: {len(catalog['options'])} options, {len(catalog['output_keys'])} "
          "output keys", file=sys.stderr)
    return out


# --------------------------------------------------------------------------
# Child side: the client's parser, its post-parse data, its result keys.
# --------------------------------------------------------------------------


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


class _Accepted(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("accepted")
        self.namespace = namespace


def capture_parser(serving) -> argparse.ArgumentParser:
    """The parser ``cli_main`` builds, taken at its ``parse_args()`` call."""
    original = argparse.ArgumentParser.parse_args

    def grab(self, *a, **kw):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = grab
    sys.argv = [serving.__file__]  # prog = "serving.py", as under python -m
    try:
        serving.cli_main()
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    raise SystemExit("cli_main() returned without calling parse_args()")


def _option_entry(action: argparse.Action) -> dict:
    entry = gfc.action_entry(action)
    if entry["type"] in _REFINED_TYPES:
        entry["sglang_type"] = entry["type"]
        entry["type"] = _REFINED_TYPES[entry["type"]]
    if entry["action"] == "LoRAPathAction":
        # serving.py's own LoRAPathAction: setattr(dest, []) then append each value.
        entry["sglang_action"] = "LoRAPathAction"
        entry["action"] = "store"
    if entry["type"] not in (None, "str", "int", "float"):
        raise SystemExit(f"{entry['flags']}: no stdlib rebuild of type {entry['type']!r}")
    if entry["action"] not in ("store", "store_true", "store_false"):
        raise SystemExit(f"{entry['flags']}: no stdlib rebuild of action {entry['action']!r}")
    return entry


def _conditions(path: list[ast.AST]) -> list[str]:
    return [ast.unparse(n.test) for n in path if isinstance(n, ast.If)]


def output_keys(source: str, goodput_fields: list[str]) -> dict:
    """Keys of the object ``benchmark()`` appends to --output-file, from the source.

    ``result = {...}`` gives the keys of every run; ``result[...] = ...`` and
    ``result.update(msgspec.structs.asdict(goodput))`` add keys under an ``if``; the
    ``result_details`` dict (and its additions) is merged in with --output-details.
    """
    tree = ast.parse(source)
    func = next(n for n in ast.walk(tree)
                if isinstance(n, ast.AsyncFunctionDef) and n.name == "benchmark")
    base: list[str] = []
    guard: list[str] = []  # the if around ``result = {...}``: whether a line is written at all
    extra: list[dict] = []
    details: list[str] = []

    def visit(node: ast.AST, path: list[ast.AST]) -> None:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
                if target.id == "result":
                    base.extend(keys)
                    guard.extend(_conditions(path))
                elif target.id == "result_details":
                    details.extend(keys)
            if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                    and isinstance(target.slice, ast.Constant)):
                if target.value.id == "result":
                    extra.append({"when": _conditions(path), "keys": [target.slice.value]})
                elif target.value.id == "result_details":
                    extra.append({"when": ["args.output_details", *_conditions(path)],
                                  "keys": [target.slice.value]})
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "result"
                and "goodput" in ast.unparse(node.args[0])):
            extra.append({"when": _conditions(path), "keys": list(goodput_fields)})
        for child in ast.iter_child_nodes(node):
            visit(child, [*path, node])

    visit(func, [])
    missing = _EXPECTED_KEYS - set(base)
    if missing:
        raise SystemExit(f"result dict in benchmark() lacks {sorted(missing)}: "
                         "the AST walk found the wrong literal")
    extra.append({"when": ["args.output_details"], "keys": details})
    merged: dict[tuple, list[str]] = {}
    for e in extra:
        when = tuple(c for c in e["when"] if c not in guard)
        merged.setdefault(when, []).extend(e["keys"])
    return {"output_keys": base,
            "output_extra_keys": [{"when": list(w), "keys": k} for w, k in merged.items()]}


# sglang modules serving.py imports only for run-time values, whose own imports reach the
# model runtime (quantization kernels, custom ops, device queries): stubbed like torch.
# serving.py takes FAKE_BOOTSTRAP_HOST from the first, used only with --fake-prefill.
_RUNTIME_ONLY = ("sglang.srt.disaggregation.utils",)


def _stub_runtime_modules() -> None:
    for name in _RUNTIME_ONLY:
        module = gfc._StubModule(name)
        module.__path__ = []
        sys.modules[name] = module


def _optional(name: str):
    import importlib  # noqa: PLC0415

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None


def post_parse_errors(source: str) -> list[str]:
    """The literal messages of every ``parser.error(...)`` in serving.py: which of the
    checks after ``parse_args`` this version makes (bench_catalog applies a rule only if
    its message is listed; 0.5.19 has no --gsp-num-turns check, for one)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "error" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "parser" and node.args
                and isinstance(node.args[0], ast.Constant)):
            found.append(node.args[0].value)
    return found


def introspect(src: str, deps: str, out: str) -> None:
    sys.path[:0] = [src, deps]
    keep = {"sglang", "gpuserve"} | {d.replace("-", "_") for d in gfc.REAL_DEPS}
    finder = gfc._StubFinder(keep)
    sys.meta_path.insert(0, finder)
    _stub_runtime_modules()
    import sglang.benchmark.serving as serving  # noqa: PLC0415 (after the finder)

    goodput = _optional("sglang.benchmark.goodput")  # 0.5.2x; absent in 0.5.19
    rust = _optional("sglang.benchmark.rust_client")

    parser = capture_parser(serving)
    options = [_option_entry(a) for a in parser._actions
               if not isinstance(a, argparse._HelpAction)]
    groups = [{"required": g.required, "flags": [a.option_strings[0] for a in g._group_actions]}
              for g in parser._mutually_exclusive_groups]
    fields = list(goodput.GoodputMetrics.__struct_fields__) if goodput else []
    result = {
        "prog": parser.prog,
        "description": parser.description,
        "allow_abbrev": parser.allow_abbrev,
        "type_params": ({"_goodput_slo": {"metrics": list(goodput.GOODPUT_SLO_METRICS)}}
                        if goodput else {}),
        "mutually_exclusive": groups,
        "rust_client": {
            "supported_backends": sorted(rust.SUPPORTED_BACKENDS),
            "supported_datasets": sorted(rust.SUPPORTED_DATASETS),
            "unsupported_options": dict(rust._UNSUPPORTED_OPTIONS),
        } if rust else None,
        "post_parse_errors": post_parse_errors(Path(serving.__file__).read_text()),
        **output_keys(Path(serving.__file__).read_text(), fields),
        "options": options,
    }
    Path(out).write_text(json.dumps(result))
    print(f"stubbed: {', '.join(sorted(finder.stubbed))}", file=sys.stderr)
    mismatches = check_fidelity(serving, parser, result)
    if mismatches:
        for m in mismatches[:20]:
            print(f"MISMATCH {m}", file=sys.stderr)
        raise SystemExit(f"gpuserve.measure.bench_catalog disagrees with SGLang's client on "
                         f"{len(mismatches)} probes")


# The argv the serve deploy builds (gpuserve serve), with and without extras.
DEPLOY_ARGV = ["--backend", "sglang", "--base-url", "http://127.0.0.1:30000",
               "--model", "served", "--tokenizer", "/models/m", "--dataset-name",
               "random-ids", "--random-input-len", "1024", "--random-output-len", "256",
               "--random-range-ratio", "1.0", "--num-prompts", "80", "--max-concurrency",
               "16", "--warmup-requests", "2", "--output-file", "/tmp/b.jsonl", "--tag", "t"]

_RULE_PROBES = [
    ["--rust-worker-threads", "4"],
    ["--rust-client"],
    ["--rust-client", "--dataset-name", "random-ids", "--rust-worker-threads", "2"],
    ["--rust-client", "--dataset-name", "custom"],
    ["--rust-client", "--backend", "trt"],
    ["--rust-client", "--lora-name", "a", "--plot-throughput"],
    ["--rust-client", "--prompt-suffix", "x"],
    ["--profile-prefill-url", "a", "--profile-decode-url", "b"],
    ["--profile-decode-url", "--profile-prefill-url"],
    ["--dataset-name", "generated-shared-prefix", "--tokenize-prompt", "--gsp-num-turns", "2"],
    ["--dataset-name", "generated-shared-prefix", "--tokenize-prompt", "--gsp-num-turns", "1"],
    ["--gsp-group-distribution", "zipf"],
    ["--gsp-group-distribution", "zipf", "--gsp-zipf-alpha", "1.2"],
    ["--gsp-zipf-alpha", "1.2"],
    ["--goodput", "ttft:500", "tpot:50"],
    ["--goodput", "e2el:1e3"],
    ["--goodput", "itl:5"],
    ["--goodput", "ttft:-5"],
    ["--goodput", "ttft:inf"],
    ["--flush-cache-timeout", "0"],
    ["--flush-cache-timeout", "nan"],
    ["--request-rate", "inf"],
    ["--request-rate", "2.5"],
    DEPLOY_ARGV,
    [*DEPLOY_ARGV, "--backend", "sglang-oai", "--request-rate", "4"],
    [*DEPLOY_ARGV, "--random-output", "8"],
    [*DEPLOY_ARGV, "--num-prompt", "8"],
    [*DEPLOY_ARGV, "--max-concurency", "8"],
    ["positional"],
]


def _probes(action: argparse.Action, entry: dict) -> list[list[str]]:
    kind = entry.get("sglang_type")
    if kind == "_finite_positive_float":
        return [["2.5"], ["-1"], ["inf"], ["x"], []]
    if kind == "_goodput_slo":
        return [["ttft:500"], ["bogus:1"], ["tpot:0"], []]
    return gfc._probe_values(action)


def check_fidelity(serving, real: argparse.ArgumentParser, result: dict) -> list[str]:
    """Run probe command lines through the real cli_main and through bench_catalog."""
    sys.path.insert(0, str(REPO_ROOT))
    from gpuserve.measure.bench_catalog import BenchCatalog  # noqa: PLC0415

    rebuilt = BenchCatalog(dict(result, version="probe"))
    entries = {e["dest"]: e for e in result["options"]}
    argvs: list[list[str]] = [[], *_RULE_PROBES]
    for action in real._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        entry = entries[action.dest]
        for flag in action.option_strings:
            for values in _probes(action, entry):
                argvs.append([flag, *values])
            for cut in (1, 2, 3):
                if len(flag) - cut > 3:
                    argvs.append([flag[:-cut], *_probes(action, entry)[0]])

    def real_parse(argv: list[str]):
        sys.argv = [serving.__file__, *argv]
        try:
            serving.cli_main()
        except _Accepted as a:
            return "ok", a.namespace
        except gfc._ParseError as e:
            return "error", str(e)
        raise AssertionError("cli_main neither ran nor refused")

    def accept(args):
        raise _Accepted(args)

    def refuse(self, message):
        raise gfc._ParseError(message)

    serving.run_benchmark = accept
    argparse.ArgumentParser.error = refuse
    mismatches = []
    for argv in argvs:
        kind_a, a = real_parse(argv)
        try:
            kind_b, b = "ok", rebuilt.parse(argv)
        except ValueError as e:
            kind_b, b = "error", str(e)
        if kind_a != kind_b:
            mismatches.append(f"{argv}: sglang {kind_a} {str(a)[:200]} / rebuilt {kind_b} "
                              f"{str(b)[:200]}")
        elif kind_a == "error" and a != b:
            mismatches.append(f"{argv}: sglang {a!r} / rebuilt {b!r}")
        elif kind_a == "ok":
            va = {k: gfc._comparable(v) for k, v in vars(a).items()}
            vb = {k: gfc._comparable(v) for k, v in vars(b).items()}
            if va != vb:
                diff = sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k))
                mismatches.append(f"{argv}: values differ: "
                                  f"{[(k, va.get(k), vb.get(k)) for k in diff[:5]]}")
    print(f"fidelity: {len(argvs)} probe command lines, {len(mismatches)} mismatches",
          file=sys.stderr)
    return mismatches


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--introspect":
        introspect(*argv[1:4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="+", metavar="VERSION")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = ap.parse_args(argv)
    for version in args.versions:
        generate(version, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
