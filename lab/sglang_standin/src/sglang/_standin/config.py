"""``--config file.yaml``: merge a config file into argv the way SGLang does.

Mirrors sglang/srt/utils/server_args_config_parser.py::ConfigArgumentMerger (0.5.23;
0.5.19 keyed the file by dest only): exactly one ``--config PATH`` pair is cut out of
argv, the file must end in .yaml/.yml, its mapping becomes ``--key value`` pairs
placed *before* the remaining CLI arguments (so the command line wins), store_true
keys add the bare flag when true, lists expand, dicts become JSON.

SGLang reads the file with ``yaml.safe_load``; the stand-in has no PyYAML, so it
parses the subset a deploy writes: ``key: value`` lines (scalars in YAML 1.1 style),
``key:`` followed by ``- item`` lines, inline ``[a, b]`` lists and a JSON document
(YAML is a superset of JSON, so a .yaml file holding JSON is valid for both).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

_BOOL = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_NULL = {"null", "~", ""}
_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"^[-+]?(\d[\d_]*)?\.\d*([eE][-+]?\d+)?$|^[-+]?\d[\d_]*[eE][-+]?\d+$")


def _scalar(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        if text[0] == '"':
            return json.loads(text)
        return text[1:-1].replace("''", "'")
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(p) for p in inner.split(",")] if inner else []
    if text.startswith("{"):
        return json.loads(text)
    low = text.lower()
    if low in _BOOL:
        return _BOOL[low]
    if low in _NULL:
        return None
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    return text


def _strip_comment(line: str) -> str:
    out, quote = [], None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def safe_load(text: str) -> Any:
    """The YAML subset above; raises ValueError naming the line it cannot read."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    data: dict[str, Any] = {}
    last_key: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        stripped = line.strip()
        if stripped.startswith("- ") or stripped == "-":
            if last_key is None or (data[last_key] is not None
                                    and not isinstance(data[last_key], list)):
                raise ValueError(f"line {number}: list item outside a list: {raw!r}")
            if data[last_key] is None:
                data[last_key] = []
            data[last_key].append(_scalar(stripped[1:]))
            continue
        if line[0] in " \t":
            raise ValueError(f"line {number}: nested mappings are not supported: {raw!r}")
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"line {number}: expected 'key: value': {raw!r}")
        key = key.strip().strip("'\"")
        data[key] = _scalar(value)
        last_key = key
    return data or None


def _config_keys(action: argparse.Action, legacy: bool) -> set[str]:
    if legacy:
        return {action.dest}
    return {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings
                            if o.startswith("--")}


def _takes_one_value(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreAction) or action.nargs is None


class ConfigArgumentMerger:
    def __init__(self, parser: argparse.ArgumentParser, legacy: bool = False) -> None:
        store_true = [a for a in parser._actions if isinstance(a, argparse._StoreTrueAction)]
        self.store_true_actions = {k for a in store_true for k in _config_keys(a, legacy)}
        if legacy:
            supported = [a for a in parser._actions
                         if isinstance(a, (argparse._StoreTrueAction, argparse._StoreAction))]
        else:
            supported = [a for a in parser._actions
                         if isinstance(a, argparse._StoreTrueAction) or _takes_one_value(a)]
        supported_keys = {k for a in supported for k in _config_keys(a, legacy)}
        self.unsupported_actions = {
            key: a
            for a in parser._actions
            if a.option_strings and a not in supported
            and not {"--config", "--help", "-h"} & set(a.option_strings)
            for key in _config_keys(a, legacy)
            if legacy or key not in supported_keys
        }

    def merge_config_with_args(self, cli_args: list[str]) -> list[str]:
        config_file_path = self._extract_config_file_path(cli_args)
        if not config_file_path:
            return cli_args
        config_args = self._convert_config_to_args(self._parse_yaml_config(config_file_path))
        i = cli_args.index("--config")
        return config_args + cli_args[:i] + cli_args[i + 2:]

    @staticmethod
    def _extract_config_file_path(args: list[str]) -> str | None:
        indices = [i for i, a in enumerate(args) if a == "--config"]
        if len(indices) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        if not indices:
            return None
        if indices[0] == len(args) - 1:
            raise ValueError("No config file specified after --config flag!")
        return args[indices[0] + 1]

    @staticmethod
    def _parse_yaml_config(file_path: str) -> dict[str, Any]:
        path = Path(file_path)
        if path.suffix.lower() not in [".yaml", ".yml"]:
            raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
        if not path.exists():
            raise ValueError(f"Config file not found: {file_path}")
        data = safe_load(path.read_text())
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError("Config file must contain a dictionary at root level")
        return data

    def _convert_config_to_args(self, config: dict[str, Any]) -> list[str]:
        args: list[str] = []
        for key, value in config.items():
            key_norm = key.replace("-", "_")
            if key_norm in self.unsupported_actions:
                action = self.unsupported_actions[key_norm]
                raise ValueError(f"Unsupported config option '{key_norm}' with action "
                                 f"'{action.__class__.__name__}'")
            if isinstance(value, bool):
                if key_norm in self.store_true_actions:
                    if value:
                        args.append(f"--{key}")
                else:
                    args.extend([f"--{key}", str(value).lower()])
            elif isinstance(value, list):
                if value:
                    args.append(f"--{key}")
                    args.extend(str(item) for item in value)
            elif isinstance(value, dict):
                args.extend([f"--{key}", json.dumps(value)])
            else:
                args.extend([f"--{key}", str(value)])
        return args
