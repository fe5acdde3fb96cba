"""Rebuild SGLang's real ``argparse`` parser from a generated flag catalog.

Why: the only faithful judge of an SGLang command line is the parser SGLang builds
(``sglang.srt.server_args.prepare_server_args``), and importing it needs torch.
The catalog (``gpuserve/data/flags/sglang-<version>.json``, written by
``tools/gen_flag_catalog.py`` from the wheel) records every action; this module turns
it back into an ``argparse.ArgumentParser`` with the same option strings, actions,
nargs, choices, defaults and ``type=`` converters, so prefix abbreviation, ambiguity
and conversion errors come out exactly as argparse produces them on the host.

This file is deliberately standard-library only and imports nothing from gpuserve,
so it can be copied verbatim into a package that has no gpuserve (keep it that way).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

Warn = Callable[[str], None]


def _no_warn(message: str) -> None:
    """Validation in gpuserve stays silent about deprecations."""


# --------------------------------------------------------------------------
# type= converters. Each keeps the name of SGLang's function, because argparse
# names it in "invalid <name> value: ..." when it raises ValueError/TypeError.
# --------------------------------------------------------------------------


def nullable_str(val: str):
    """sglang/srt/utils/common.py::nullable_str."""
    if not val or val == "None":
        return None
    return val


def human_readable_int(value: str) -> int:
    """sglang/srt/utils/common.py::human_readable_int (SI and IEC suffixes)."""
    value = value.strip()
    si_multiplier = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec_multiplier = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec_multiplier:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec_multiplier[suffix]
        return int(Decimal(number) * si_multiplier[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def json_list_type(value):
    """sglang/srt/utils/common.py::json_list_type (orjson there, json here)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def loads(value: str):
    """``json.loads`` as SGLang passes it (``type=json.loads``); argparse calls it 'loads'."""
    return json.loads(value)


def _backend_arg(params: dict) -> Callable[[str], str]:
    retired = set(params.get("retired_backends", ()))

    def parse_cuda_graph_backend_arg(raw: str) -> str:
        """sglang/srt/model_executor/cuda_graph_config.py::parse_cuda_graph_backend_arg."""
        if raw in retired:
            raise argparse.ArgumentTypeError(
                f"{raw} was removed; select breakable, full, or disabled"
            )
        return raw

    return parse_cuda_graph_backend_arg


def _graph_config_arg(params: dict) -> Callable[[str], dict]:
    phases = tuple(params["phases"])
    allowed_keys = {k: tuple(v) for k, v in params["allowed_keys"].items()}
    check_backend = _backend_arg(params)

    def parse_cuda_graph_config_arg(raw: str) -> dict:
        """sglang/srt/model_executor/cuda_graph_config.py::parse_cuda_graph_config_arg."""
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
            )
        result: dict[str, dict[str, Any]] = {}
        for phase, phase_settings in parsed.items():
            phase = str(phase)
            if phase not in phases:
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config: unknown phase '{phase}', expected one of {phases}"
                )
            if not isinstance(phase_settings, dict):
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config['{phase}'] must be a JSON object, got "
                    f"{type(phase_settings).__name__}"
                )
            if "backend" in phase_settings:
                check_backend(phase_settings["backend"])
            allowed = allowed_keys[phase]
            result[phase] = {}
            for key, value in phase_settings.items():
                if key not in allowed:
                    raise argparse.ArgumentTypeError(
                        f"--cuda-graph-config['{phase}']: unknown key '{key}', "
                        f"expected one of {allowed}"
                    )
                result[phase][key] = value
        return result

    return parse_cuda_graph_config_arg


_SIMPLE_CONVERTERS: dict[str, Callable] = {
    "str": str,
    "int": int,
    "float": float,
    "json": loads,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "json_list_type": json_list_type,
}
_PARAM_CONVERTERS: dict[str, Callable[[dict], Callable]] = {
    "parse_cuda_graph_backend_arg": _backend_arg,
    "parse_cuda_graph_config_arg": _graph_config_arg,
}


def converter(name: str | None, type_params: dict | None = None) -> Callable | None:
    """The converter for a catalog type name; ValueError for a name we cannot mirror.

    A new SGLang version that introduces a new ``type=`` function fails loudly here
    (and in the catalog tests) instead of silently accepting any string.
    """
    if name is None:
        return None
    if name in _SIMPLE_CONVERTERS:
        return _SIMPLE_CONVERTERS[name]
    if name in _PARAM_CONVERTERS:
        return _PARAM_CONVERTERS[name]((type_params or {}).get(name, {}))
    raise ValueError(f"no stdlib converter for SGLang type {name!r}")


# --------------------------------------------------------------------------
# SGLang's own Action subclasses (sglang/srt/arg_groups/argparse_actions.py),
# reproduced for their parse behaviour; the warning goes to ``warn``.
# --------------------------------------------------------------------------


class _Warning(argparse.Action):
    def __init__(self, option_strings, dest, warn: Warn = _no_warn, new_flag=None, **kw):
        self.warn = warn
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kw)

    def _deprecated(self, option_string: str | None) -> None:
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        self.warn(
            f"'{option_string}' is deprecated and will be removed in a future release."
            f"{replacement}"
        )


class DeprecatedStoreTrueAction(_Warning):
    def __init__(self, option_strings, dest, nargs=0, const=True, default=False, **kw):
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        self._deprecated(option_string)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(_Warning):
    def __init__(self, option_strings, dest, const_value=None, nargs=0, default=None, **kw):
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        self._deprecated(option_string)
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(_Warning):
    def __call__(self, parser, namespace, values, option_string=None):
        self._deprecated(option_string)
        setattr(namespace, self.dest, values)


class DeprecatedAction(_Warning):
    def __init__(self, option_strings, dest, error_message=None, nargs=0, **kw):
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=nargs, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        if self.error_message is not None:
            parser.error(self.error_message)
        self.warn(
            f"The command line argument '{option_string}' is deprecated and will be "
            "removed in future versions."
        )


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        paths: list = []
        for path in values or []:
            path = path.strip()
            if path.startswith("{") and path.endswith("}"):
                obj = json.loads(path)
                if "lora_path" not in obj or "lora_name" not in obj:
                    parser.error(f"{path!r} looks like a JSON str, but it does not contain "
                                 "'lora_name' and 'lora_path' keys.")
                paths.append(obj)
            else:
                paths.append(path)
        setattr(namespace, self.dest, paths)


_CUSTOM_ACTIONS: dict[str, type[argparse.Action]] = {
    cls.__name__: cls
    for cls in (DeprecatedStoreTrueAction, DeprecatedStoreConstAction,
                DeprecatedAliasStoreAction, DeprecatedAction, LoRAPathAction)
}
_WARNING_ACTIONS = (DeprecatedStoreTrueAction, DeprecatedStoreConstAction,
                    DeprecatedAliasStoreAction, DeprecatedAction)
_BUILTIN_ACTIONS = {"store", "store_const", "store_true", "store_false", "append",
                    "append_const", "count", "extend"}


def _add_option(parser: argparse.ArgumentParser, opt: dict, type_params: dict,
                warn: Warn) -> None:
    action = opt["action"]
    flags = opt["flags"]
    kw: dict[str, Any] = {"dest": opt["dest"], "help": opt.get("help")}
    if opt.get("required"):
        kw["required"] = True
    if "default" in opt:
        kw["default"] = opt["default"]
    if action in ("store_true", "store_false"):
        parser.add_argument(*flags, action=action, **kw)
        return
    if action == "boolean_optional":
        # BooleanOptionalAction derives the --no-X spelling itself.
        positive = [f for f in flags if "--no-" + f[2:] in flags] or flags[:1]
        parser.add_argument(*positive, action=argparse.BooleanOptionalAction, **kw)
        return
    conv = converter(opt.get("type"), type_params)
    if conv is not None:
        kw["type"] = conv
    if opt.get("choices") is not None:
        kw["choices"] = opt["choices"]
    if "const" in opt:
        kw["const"] = opt["const"]
    nargs = opt.get("nargs")
    if action in _BUILTIN_ACTIONS:
        if nargs is not None and action not in ("store_const", "append_const", "count"):
            kw["nargs"] = nargs
        parser.add_argument(*flags, action=action, **kw)
        return
    cls = _CUSTOM_ACTIONS.get(action)
    if cls is None:
        raise ValueError(f"{flags[0]}: no stdlib rebuild of SGLang action {action!r}")
    kw["nargs"] = nargs
    kw.update(opt.get("extra") or {})
    if issubclass(cls, _WARNING_ACTIONS):
        kw["warn"] = warn
    parser.add_argument(*flags, action=cls, **kw)


def build_parser(
    catalog: dict,
    *,
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
    warn: Warn = _no_warn,
) -> argparse.ArgumentParser:
    """An ``argparse`` parser equivalent to the one SGLang builds for ``catalog['version']``.

    ``parser_class`` lets a caller turn ``error()`` into an exception instead of
    ``exit(2)``; ``warn`` receives SGLang's deprecation warnings.
    """
    parser = parser_class(prog=catalog.get("prog", "sglang serve"),
                          allow_abbrev=catalog.get("allow_abbrev", True))
    type_params = catalog.get("type_params") or {}
    for opt in catalog["options"]:
        _add_option(parser, opt, type_params, warn)
    return parser


def stderr_warn(message: str) -> None:
    """SGLang prints deprecations through logger.warning in bold yellow."""
    print(f"\033[1;33m{message}\033[0m", file=sys.stderr)
