#!/usr/bin/env python3
"""Generate gpuserve/data/flags/sglang-<version>.json from the real SGLang wheel.

Usage::

    .venv/bin/python tools/gen_flag_catalog.py 0.5.23 [0.5.19 ...] [--out-dir DIR]

Why this exists: gpuserve renders and validates SGLang launch flags without
importing SGLang (importing ``sglang.srt.server_args`` pulls torch, triton,
numpy, PIL, starlette ...). The only faithful list of flags is the argparse
parser SGLang itself builds, so this script downloads the wheel from PyPI,
unpacks it, imports ``sglang.srt.server_args`` with every heavy third-party
module replaced by a permissive stub (a ``sys.meta_path`` finder), builds the
parser exactly as ``sglang.srt.server_args.prepare_server_args`` does
(``argparse.ArgumentParser(prog="sglang serve")`` + ``ServerArgs.add_cli_args``)
and dumps every action. Adding a version = run this script and review the diff;
the catalogs are never hand-edited.

The introspection runs in a fresh interpreter per version (``--introspect``) so
stubs and ``sys.path`` never leak between versions. A few small pure
dependencies that the argument *definitions* need for real (msgspec: 0.5.2x
declares ServerArgs as a ``msgspec.Struct``) are pip-installed into the
temporary directory rather than stubbed (orjson too, so json_list_type errors are real).

Before writing, the script checks the catalog: it rebuilds the parser from the
catalog with ``gpuserve.launch.flagparser`` (what gpuserve and the lab stand-in use) and
parses a few thousand probe command lines with both parsers (every option string,
good/bad/missing values, 1-3 character abbreviations); any difference in outcome,
parsed value or argparse error text aborts the run.
"""

from __future__ import annotations

import abc
import argparse
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "gpuserve" / "data" / "flags"
GENERATOR = "tools/gen_flag_catalog.py"

# Third-party modules the argument definitions need to *work*, not just import:
# msgspec declares ServerArgs (0.5.2x), orjson parses json_list_type values (so the
# fidelity check below sees its real errors), dill serialises a logit processor class
# at import time (0.5.10.post1 sglang/srt/configs/deepseek_ocr.py; not a Requires-Dist
# of sglang itself, so the newest dill is installed).
REAL_DEPS = ("msgspec", "orjson", "dill")

# Target interpreter/platform of the wheels we read (SGLang ships cp311-cp313
# manylinux_2_34 wheels; the option set does not depend on the tag).
PIP_PLATFORM = ["--python-version", "3.11", "--implementation", "cp",
                "--platform", "manylinux_2_34_x86_64", "--only-binary", ":all:"]

# argparse's registry names for its own action classes.
_ACTION_NAMES = {
    "_StoreAction": "store",
    "_StoreConstAction": "store_const",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_ExtendAction": "extend",
    "_VersionAction": "version",
    "_HelpAction": "help",
    "BooleanOptionalAction": "boolean_optional",
}


# --------------------------------------------------------------------------
# Parent side: download, unpack, run the introspection child, write JSON.
# --------------------------------------------------------------------------


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _requirement_for(metadata: str, name: str) -> str:
    """The wheel's own pin for a real dependency (marker dropped), else the bare name."""
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].split(";", 1)[0].strip()
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", req)
        if m and m.group(1).lower().replace("_", "-") == name and "extra ==" not in line:
            return name + m.group(3).replace(" ", "")
    return name


def fetch_wheel(version: str, tmp: Path) -> tuple[Path, Path, Path]:
    """Download sglang==version from PyPI into ``tmp``, unpack it and pip-install the
    REAL_DEPS it pins; returns (wheel, unpacked source dir, deps dir). Shared with
    tools/gen_bench_catalog.py."""
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
          *PIP_PLATFORM, "-d", str(tmp / "dl"), f"sglang=={version}"])
    wheels = sorted((tmp / "dl").glob("sglang-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one sglang wheel, got {wheels}")
    wheel = wheels[0]
    src = tmp / "src"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(src)
    metadata = next(src.glob("sglang-*.dist-info/METADATA")).read_text()
    deps = tmp / "deps"
    reqs = [_requirement_for(metadata, name) for name in REAL_DEPS]
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
          "--target", str(deps), *reqs])
    return wheel, src, deps


def generate(version: str, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="gpuserve-flags-") as tmp_s:
        tmp = Path(tmp_s)
        wheel, src, deps = fetch_wheel(version, tmp)
        raw = tmp / "options.json"
        # A clean environment: SGLANG_* variables change dynamic choices.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--introspect",
                        str(src), str(deps), str(raw)], check=True, env=env)
        parsed = json.loads(raw.read_text())
        catalog = {
            "version": version,
            "source": f"{wheel.name} from PyPI (sha256 {_sha256(wheel)})",
            "generator": GENERATOR,
            "prog": parsed["prog"],
            "allow_abbrev": parsed["allow_abbrev"],
            "type_params": parsed["type_params"],
            "options": parsed["options"],
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"sglang-{version}.json"
    out.write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n")
    print(f"{out}: {len(catalog['options'])} options", file=sys.stderr)
    return out


# --------------------------------------------------------------------------
# Child side: stub heavy modules, build SGLang's parser, dump its actions.
# --------------------------------------------------------------------------


# Dunders that Python, typing, inspect, dataclasses, copy and pickle probe to
# decide how to treat an object; a stub must *not* claim them, while any other
# dunder (e.g. pydantic's ``__class_validators__``) is just more library surface.
_PROBED_DUNDERS = frozenset({
    "__origin__", "__args__", "__parameters__", "__mro_entries__", "__set_name__",
    "__get__", "__set__", "__delete__", "__wrapped__", "__signature__",
    "__text_signature__", "__annotations__", "__dataclass_fields__",
    "__dataclass_params__", "__struct_fields__", "__func__", "__self__",
    "__code__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__",
    "__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__",
    "__setstate__", "__getnewargs__", "__getnewargs_ex__", "__fspath__", "__index__",
    "__length_hint__", "__await__", "__aiter__", "__enter__", "__exit__",
    "__instancecheck__", "__subclasscheck__", "__class_getitem__", "__init_subclass__",
    "__abstractmethods__", "__isabstractmethod__", "__file__", "__path__", "__spec__",
    "__loader__", "__all__", "__version__", "__qualname__", "__name__", "__module__",
    "__doc__", "__dict__", "__slots__", "__weakref__", "__orig_bases__",
    "__type_params__", "__supertype__", "__metadata__", "__origin_type__",
    "__pydantic_core_schema__", "__get_pydantic_core_schema__", "__bool__", "__len__",
    "__iter__", "__call__", "__objclass__", "__match_args__",
})


def _probed(name: str) -> bool:
    return name in _PROBED_DUNDERS


# Stubbed attributes that module-level code uses as real values, with the value they
# have on the GPU host. 0.5.10.post1's sglang/srt/layers/attention/fla/utils.py does
# ``getattr(torch, triton.runtime.driver.active.get_current_target().backend)`` at
# import time (triton's backend name is "cuda" on NVIDIA GPUs).
_STUB_CONSTANTS = {
    "triton.runtime.driver.active.get_current_target.backend": "cuda",
}


class _StubMeta(abc.ABCMeta):
    """Metaclass of fabricated classes: every attribute, item and call succeeds."""

    def __getattr__(cls, name: str):
        if _probed(name):
            raise AttributeError(name)
        qualname = f"{cls.__qualname__}.{name}"
        if qualname in _STUB_CONSTANTS:
            return _STUB_CONSTANTS[qualname]
        return _stub_class(qualname)

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, key, value):
        pass  # registries written at import time (CONFIG_MAPPING._extra_content[...] = ...)

    def __delitem__(cls, key):
        pass

    def register(cls, *args, **kwargs):
        """Library registries (transformers' ``AutoProcessor.register(config, processor)``
        in 0.5.10.post1) rather than ABCMeta's one-argument virtual-subclass hook."""
        return args[0] if args else None

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return False

    def __repr__(cls):
        return f"<stub {cls.__qualname__}>"


class _StubBase(metaclass=_StubMeta):
    """Instances are as permissive as the classes (calls return new stubs)."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        # Class keywords meant for a stubbed base, e.g. 0.5.10.post1's
        # ``class DotsVLMProcessorKwargs(ProcessingKwargs, total=False)`` (a TypedDict).
        super().__init_subclass__()

    def __getattr__(self, name: str):
        if _probed(name):
            raise AttributeError(name)
        qualname = f"{type(self).__qualname__}.{name}"
        if qualname in _STUB_CONSTANTS:
            return _STUB_CONSTANTS[qualname]
        return _stub_class(qualname)()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _stub_class(f"{type(self).__qualname__}()")()

    def __getitem__(self, item):
        return self

    def __setitem__(self, key, value):
        pass

    def __delitem__(self, key):
        pass

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<stub {type(self).__qualname__}>"


def _numeric(self):
    return 0


def _same(self, *other):
    return self


def _false(self, *other):
    return False


# Special methods are looked up on the type, never through __getattr__, so the
# permissive arithmetic/conversion protocol is installed explicitly on both the
# metaclass (stub classes) and the base (stub instances).
for _owner in (_StubMeta, _StubBase):
    for _name in ("__int__", "__index__"):
        setattr(_owner, _name, _numeric)
    _owner.__float__ = lambda self: 0.0
    _owner.__contains__ = _false
    for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "xor",
                "lshift", "rshift", "matmul"):
        setattr(_owner, f"__{_op}__", _same)
        setattr(_owner, f"__r{_op}__", _same)
    for _op in ("lt", "le", "gt", "ge"):
        setattr(_owner, f"__{_op}__", _false)
    _owner.__neg__ = _owner.__pos__ = _owner.__abs__ = _owner.__invert__ = _same


def _stub_class(qualname: str) -> type:
    cls = _StubMeta(qualname.rsplit(".", 1)[-1], (_StubBase,), {})
    cls.__qualname__ = qualname
    return cls


# Attributes a stub module must lack: SGLang probes ``hasattr(torch, "npu")`` and
# friends to detect non-CUDA accelerators (sglang/srt/utils/common.py::is_npu).
_ABSENT_ATTRS = {"torch": frozenset({"npu", "hpu", "musa", "mlu"})}


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if _probed(name) or name in _ABSENT_ATTRS.get(self.__name__, ()):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []  # a package, so submodule imports are stubbed too
        mod.__version__ = "0.0.0+stub"
        return mod

    def exec_module(self, module):
        pass


class _StubFinder(importlib.abc.MetaPathFinder):
    """Stub every module that is neither stdlib, nor sglang, nor a REAL_DEPS module."""

    def __init__(self, keep: set[str]) -> None:
        self.keep = keep
        self.stubbed: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".", 1)[0]
        if top in sys.stdlib_module_names or top in self.keep:
            return None
        self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    return repr(value)


def _type_name(fn) -> str | None:
    if fn is None:
        return None
    if fn in (str, int, float, bool):
        return fn.__name__
    if getattr(fn, "__module__", None) == "json" and getattr(fn, "__name__", "") == "loads":
        return "json"
    return getattr(fn, "__name__", None) or type(fn).__name__


# "container" is argparse's back-reference to the group, not behaviour.
_STANDARD_ACTION_ATTRS = frozenset(vars(argparse.Action(["--x"], "x"))) | {"container"}


def _action_name(action: argparse.Action) -> str:
    cls = type(action)
    return _ACTION_NAMES.get(cls.__name__, cls.__name__)


def _type_params() -> dict:
    """Version-specific data the ``type=`` converters consult, read from the wheel.

    ``parse_cuda_graph_config_arg`` (sglang/srt/model_executor/cuda_graph_config.py)
    checks phases and per-phase keys against module tables, and from 0.5.2x also
    refuses retired backends through ``parse_cuda_graph_backend_arg``.
    """
    import inspect  # noqa: PLC0415

    try:
        import sglang.srt.model_executor.cuda_graph_config as cg  # noqa: PLC0415
    except ModuleNotFoundError:
        return {}  # older releases (0.5.10.post1) have no such converters

    config_src = inspect.getsource(cg.parse_cuda_graph_config_arg)
    retired: list[str] = []
    if hasattr(cg, "parse_cuda_graph_backend_arg"):
        backend_src = inspect.getsource(cg.parse_cuda_graph_backend_arg)
        retired = re.findall(r'raw == "([^"]+)"', backend_src)
    return {
        "parse_cuda_graph_config_arg": {
            "phases": list(cg.Phase.ALL),
            "allowed_keys": {k: list(v) for k, v in cg.ALLOWED_KEYS_PER_PHASE.items()},
            "retired_backends": retired if "parse_cuda_graph_backend_arg" in config_src else [],
        },
        "parse_cuda_graph_backend_arg": {"retired_backends": retired},
    }


def action_entry(action: argparse.Action) -> dict:
    """One catalog entry for an argparse action (shared with tools/gen_bench_catalog.py)."""
    choices = action.choices
    if choices is not None:
        choices = list(choices)
        if isinstance(action.choices, (set, frozenset)):
            choices = sorted(choices, key=repr)
        choices = [_jsonable(c) for c in choices]
    entry = {
        "dest": action.dest,
        "flags": list(action.option_strings),
        "action": _action_name(action),
        "type": _type_name(action.type),
        "nargs": action.nargs,
        "choices": choices,
        "default": _jsonable(action.default),
        "required": bool(action.required),
        "help": action.help,
    }
    if action.const is not None and entry["action"] not in ("store_true", "store_false"):
        entry["const"] = _jsonable(action.const)
    # SGLang's own Action subclasses keep their behaviour in extra attributes
    # (new_flag, const_value, error_message); keep them so a stdlib rebuild can
    # store what they store and refuse what they refuse.
    extra = {k: _jsonable(v) for k, v in sorted(vars(action).items())
             if k not in _STANDARD_ACTION_ATTRS}
    if extra:
        entry["extra"] = extra
    return entry


def introspect(src: str, deps: str, out: str) -> None:
    sys.path[:0] = [src, deps]
    keep = {"sglang", "gpuserve"} | {d.replace("-", "_") for d in REAL_DEPS}
    finder = _StubFinder(keep)
    sys.meta_path.insert(0, finder)
    import sglang.srt.server_args as sa  # noqa: PLC0415 (after the finder)

    # The same two steps as sglang.srt.server_args.prepare_server_args (the
    # subclass only turns error() into an exception for the fidelity check).
    parser = _RaisingParser(prog="sglang serve")
    sa.ServerArgs.add_cli_args(parser)

    options = [action_entry(action) for action in parser._actions
               if not isinstance(action, argparse._HelpAction)]
    # (-h/--help is added by every ArgumentParser(add_help=True): rebuilt, not listed.)
    result = {
        "type_params": _type_params(),
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "options": options,
        "stubbed_modules": sorted(finder.stubbed),
    }
    Path(out).write_text(json.dumps(result))
    print(f"stubbed: {', '.join(sorted(finder.stubbed))}", file=sys.stderr)
    import logging  # noqa: PLC0415

    logging.disable(logging.WARNING)  # SGLang's deprecation warnings, once per probe
    mismatches = check_fidelity(parser, result)
    if mismatches:
        for m in mismatches[:20]:
            print(f"MISMATCH {m}", file=sys.stderr)
        raise SystemExit(f"gpuserve.launch.flagparser disagrees with SGLang's parser on "
                         f"{len(mismatches)} probes")


class _ParseError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise _ParseError(message)


def _probe_values(action: argparse.Action) -> list[list[str]]:
    """A few argument vectors per option: a good value, a bad one, none."""
    if action.nargs == 0:
        return [[]]
    if action.choices:
        good = [str(next(iter(action.choices)))]
    else:
        good = {"int": ["7"], "float": ["0.5"], "human_readable_int": ["128k"],
                "json": ["{}"], "json_list_type": ['["a", 1]'],
                "parse_cuda_graph_config_arg": ['{"decode": {"max_bs": 8}}'],
                }.get(_type_name(action.type) or "", ["v"])
    if action.nargs in ("+", "*"):
        good = good * 2
    probes = [good, ["__bogus__"], []]
    if action.nargs == "?":
        probes.append([])
    return probes


def _comparable(value) -> str:
    text = repr(value)
    return "<stub>" if "stub" in text else text


def _same_set_choices(a: str, b: str, set_flags: set[str]) -> bool:
    pattern = re.compile(r"^argument (\S+?)(?:/\S+)?: invalid choice: (.*) \(choose from (.*)\)$")
    ma, mb = pattern.match(a), pattern.match(b)
    if not (ma and mb) or ma.group(1) not in set_flags or ma.group(2) != mb.group(2):
        return False
    return sorted(ma.group(3).split(", ")) == sorted(mb.group(3).split(", "))


def check_fidelity(real: argparse.ArgumentParser, result: dict) -> list[str]:
    """Parse probe command lines with SGLang's parser and with the stdlib rebuild.

    Both must accept with the same values (where the real value is not a stub)
    or refuse with the same argparse message. Probes cover every option string,
    good and bad values, missing values, and one- to three-character-short
    abbreviations (the ambiguity rules).
    """
    sys.path.insert(0, str(REPO_ROOT))
    from gpuserve.launch.flagparser import build_parser  # noqa: PLC0415

    rebuilt = build_parser(result, parser_class=_RaisingParser)
    # Choices given as a set (--sampling-backend) are listed in hash order, which
    # differs from run to run even for SGLang itself.
    set_flags = {f for a in real._actions if isinstance(a.choices, (set, frozenset))
                 for f in a.option_strings}
    base = ["--model-path", "m"]
    argvs: list[list[str]] = [base]
    for action in real._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for flag in action.option_strings:
            for values in _probe_values(action):
                argvs.append(base + [flag, *values])
            for cut in (1, 2, 3):
                if len(flag) - cut > 3:
                    argvs.append(base + [flag[:-cut], *_probe_values(action)[0]])
    mismatches = []
    for argv in argvs:
        outcome = []
        for parser in (real, rebuilt):
            try:
                ns = parser.parse_args(argv)
                outcome.append(("ok", {k: _comparable(v) for k, v in vars(ns).items()
                                       if not k.startswith("_")}))
            except _ParseError as e:
                outcome.append(("error", str(e)))
        (kind_a, a), (kind_b, b) = outcome
        if kind_a != kind_b:
            mismatches.append(f"{argv}: sglang {kind_a} {str(a)[:200]} / rebuilt {kind_b}")
        elif kind_a == "error" and a != b and not _same_set_choices(a, b, set_flags):
            mismatches.append(f"{argv}: sglang {a!r} / rebuilt {b!r}")
        elif kind_a == "ok":
            diff = {k for k in a if a[k] != "<stub>" and a[k] != b.get(k)}
            if diff:
                shown = sorted(diff)[:5]
                mismatches.append(f"{argv}: {len(diff)} values differ, e.g. "
                                  f"{[(k, a[k], b.get(k, '<missing>')) for k in shown]}")
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
