"""Render a profile into the SGLang command line of one version (its "dialect").

SGLang renames and removes flags between releases (``--cuda-graph-max-bs`` became
ambiguous in 0.5.20, ``--nsa-*`` became ``--dsa-*``, attention-DP got ``--attn-dp-size``
in 0.5.22), and a wrong spelling is only discovered when the server dies at start-up on
the GPU box. So the spelling per version is data (``gpuserve/data/dialects/sglang.yaml``)
and the final argv is checked against the flag catalog generated from that version's
real wheel (``gpuserve.launch.catalog``) before anything is deployed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpuserve import versions
from gpuserve.errors import InputError
from gpuserve.launch.profiles import Profile
from gpuserve.paths import DATA_DIR

DIALECT_PATH = DATA_DIR / "dialects" / "sglang.yaml"
_KINDS = ("value", "switch", "env", "none")


@dataclass(frozen=True)
class Launch:
    """``args`` follow ``python -m sglang.launch_server``; ``env`` is added to its env.

    ``by_field`` says which profile field produced which args or env names, so errors and
    doctor evidence can point back at the profile.
    """

    version: str
    args: list[str]
    env: dict[str, str]
    by_field: dict[str, list[str]] = field(default_factory=dict)

    def field_of(self, item: str, default: str = "extra_args") -> str:
        """The profile field that produced ``item`` (an argument or env name)."""
        return next((name for name, items in self.by_field.items() if item in items),
                    default)

    def has_flag(self, flag: str) -> bool:
        return flag in self.args

    def value(self, flag: str) -> str | None:
        """The value following ``flag`` (or given as ``flag=value``), else None."""
        for index, arg in enumerate(self.args):
            if arg == flag and index + 1 < len(self.args):
                return self.args[index + 1]
            if arg.startswith(f"{flag}="):
                return arg.split("=", 1)[1]
        return None


@dataclass(frozen=True)
class Rule:
    flag: str | None = None
    kind: str = "value"
    since: str | None = None
    until: str | None = None
    omit: Any = None
    also: tuple[str, ...] = ()
    absent: str | None = None

    def applies(self, version: str) -> bool:
        v = versions.parse(version)
        if self.since and v < versions.parse(self.since):
            return False
        return not (self.until and v > versions.parse(self.until))


def target_version(profile: Profile) -> str:
    """The newest SGLang version the profile targets, else the newest committed catalog."""
    from gpuserve.launch import catalog

    return versions.newest(profile.sglang_versions or catalog.available_versions())


@cache
def load_dialect(path: Path = DIALECT_PATH) -> dict[str, tuple[Rule, ...]]:
    """Field -> rules, validated so a typo in the data file fails loudly and by name."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(path, None, f"cannot load dialect: {exc}") from exc
    fields = (data or {}).get("fields")
    if not isinstance(fields, dict):
        raise InputError(path, "fields", "missing or not a mapping")
    out: dict[str, tuple[Rule, ...]] = {}
    for name, rules in fields.items():
        if not isinstance(rules, list) or not rules:
            raise InputError(path, f"fields.{name}", "must be a non-empty list of rules")
        parsed = []
        for index, raw in enumerate(rules):
            where = f"fields.{name}[{index}]"
            if not isinstance(raw, dict):
                raise InputError(path, where, "must be a mapping")
            unknown = set(raw) - {"flag", "kind", "since", "until", "omit", "also",
                                  "absent", "note"}
            if unknown:
                raise InputError(path, where, f"unknown keys: {', '.join(sorted(unknown))}")
            rule = Rule(
                flag=raw.get("flag"),
                kind=raw.get("kind", "value"),
                since=str(raw["since"]) if "since" in raw else None,
                until=str(raw["until"]) if "until" in raw else None,
                omit=raw.get("omit"),
                also=tuple(raw.get("also", ())),
                absent=raw.get("absent"),
            )
            if rule.kind not in _KINDS:
                raise InputError(path, where, f"kind must be one of {', '.join(_KINDS)}")
            if not rule.absent and rule.kind != "none" and not rule.flag:
                raise InputError(path, where, "needs flag (or absent)")
            parsed.append(rule)
        out[name] = tuple(parsed)
    return out


def render_launch(profile: Profile, version: str) -> Launch:
    """Render ``profile`` for SGLang ``version`` and validate it with that version's catalog.

    Raises InputError naming the profile file, line and field when the version lacks a
    field the profile sets, when two fields render the same flag, or when the catalog
    rejects a flag or a choice.
    """
    from gpuserve.launch import catalog  # imported here: the catalog loads big JSON files

    version = catalog.base_version(version)  # "0.5.23+cu130" renders as 0.5.23
    try:
        flag_catalog = catalog.load_catalog(version)
    except InputError as exc:
        raise InputError(profile.source, "sglang_version", exc.message) from exc
    if profile.sglang_versions and version not in profile.sglang_versions:
        raise profile.error("sglang_versions", f"profile does not target SGLang {version} "
                            f"(targets: {', '.join(profile.sglang_versions)})")

    args: list[str] = []
    env: dict[str, str] = {}
    by_field: dict[str, list[str]] = {}
    flag_owner: dict[str, str] = {}

    for name, rules in load_dialect().items():
        value = profile.get(name)
        rule = next((r for r in rules if r.applies(version)), None)
        if rule is None or rule.absent:
            if _is_requested(profile, name, value):
                why = rule.absent if rule and rule.absent else "has no flag for this setting"
                raise profile.error(name, f"SGLang {version} {why}")
            continue
        piece, piece_env = _render_rule(rule, value)
        if not piece and not piece_env:
            continue
        for flag in [a for a in piece if a.startswith("--")]:
            if flag in flag_owner:
                raise profile.error(name, f"renders {flag} for SGLang {version}, which "
                                    f"{flag_owner[flag]} also renders; set only one")
            flag_owner[flag] = name
        args.extend(piece)
        env.update(piece_env)
        by_field[name] = piece + list(piece_env)

    for key, value in profile.env.items():
        if key in env and env[key] != value:
            raise profile.error(f"env.{key}", f"conflicts with {env[key]!r} rendered from "
                                f"{_owner(by_field, key)}")
        env[key] = value
    if profile.env:
        by_field["env"] = list(profile.env)

    for index, arg in enumerate(profile.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in flag_owner:
            raise profile.error(f"extra_args[{index}]", f"{flag} is already rendered from "
                                f"{flag_owner[flag]}; set that field instead")
    args.extend(profile.extra_args)
    if profile.extra_args:
        by_field["extra_args"] = list(profile.extra_args)

    launch = Launch(version=version, args=args, env=env, by_field=by_field)
    _validate(profile, launch, flag_catalog)
    return launch


def _is_requested(profile: Profile, name: str, value: Any) -> bool:
    """Whether the profile asks for something (a false switch or a default asks nothing)."""
    if value is None or value is False:
        return False
    return profile.is_set(name)


def _render_rule(rule: Rule, value: Any) -> tuple[list[str], dict[str, str]]:
    if value is None or rule.kind == "none":
        return [], {}
    if rule.omit is not None and value == rule.omit:
        return [], {}
    if rule.kind == "switch":
        return ([rule.flag, *rule.also] if value else []), {}
    if rule.kind == "env":
        return [], ({rule.flag: "1"} if value else {})
    return [rule.flag, _text(value), *rule.also], {}


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _owner(by_field: dict[str, list[str]], item: str) -> str:
    return next((name for name, items in by_field.items() if item in items), "a field")


def _validate(profile: Profile, launch: Launch, flag_catalog: Any) -> None:
    """Validate the whole argv; on failure, find the field whose args the catalog rejects
    so the error points at a line of the profile rather than at the argv."""
    try:
        flag_catalog.validate(launch.args)
        return
    except InputError as whole:
        base = launch.by_field.get("model.path", [])
        for name, piece in launch.by_field.items():
            if name in ("env", "model.path") or not any(a.startswith("-") for a in piece):
                continue
            try:
                flag_catalog.validate(base + piece)
            except InputError as exc:
                at = name
                if name == "extra_args":
                    at = _extra_arg_at(profile, exc.message)
                raise profile.error(at, exc.message) from exc
        raise profile.error("extra_args" if profile.extra_args else "model",
                            whole.message) from whole


def _extra_arg_at(profile: Profile, message: str) -> str:
    for index, arg in enumerate(profile.extra_args):
        if arg.split("=", 1)[0] in message:
            return f"extra_args[{index}]"
    return "extra_args"


def group_args(args: list[str]) -> list[list[str]]:
    """Split an argv into one group per flag (the flag and its values), for display."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups
