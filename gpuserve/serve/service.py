"""The SGLang service's plan: host data, the unit, EnvironmentFile and --config texts.

Pure (no pyinfra): :func:`plan_service` decides at prepare time and raises
``InputError``; roles/service puts the files and (re)starts (``configure_service``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from gpuserve.env_names import ARGS_VAR, reserved_env
from gpuserve.errors import InputError
from gpuserve.launch.catalog import load_catalog
from gpuserve.launch.exec_limits import args_problem
from gpuserve.launch.secrets import secret_flags
from gpuserve.serve.render import (
    SERVICE_ENV_PATH,
    SYSTEM_UNIT_DIR,
    UnitSpec,
    args_value,
    env_line,
    render_config,
    render_env_file,
    render_unit,
    validate_hardening_off,
)
from gpuserve.serve.secret import validate_secret

DEFAULTS = {
    # extra environment for the server (dict), added after the profile's env
    # accepts: dict[str, str]
    "sglang_extra_env": {},
    # Hugging Face token (secret): EnvironmentFile only (mode 0600, root)
    # accepts: str (16+ characters) or None
    "hf_token": None,
    # SGLang --api-key (secret): --config YAML only (mode 0600, service user)
    # accepts: str (16+ characters) or None
    "sglang_api_key": None,
    # the address the server listens on (an IP). Unset: the profile's server.host when
    # sglang_api_key is set, else 127.0.0.1 only (see listen_host)
    # accepts: str (an IP address) or None
    "listen_address": None,
    # hardening directives of the unit to switch off on this host, e.g. ["ProtectProc"]
    # (gpuserve/serve/render.HARDENING; for a host where one breaks the server)
    # accepts: list[str]
    "unit_hardening_off": [],
}

UNIT_NAME = "gpuserve-sglang.service"
UNIT_PATH = f"{SYSTEM_UNIT_DIR}/{UNIT_NAME}"
CONFIG_DIR = "/etc/gpuserve"
ENV_PATH = SERVICE_ENV_PATH
CONFIG_PATH = f"{CONFIG_DIR}/sglang-secrets.yaml"

REDACT_SCRIPT = "sglang_redact.py"
LOOPBACK = "127.0.0.1"
# The health gate, smoke and benchmark reach the server where it listens (found on the
# host: gpuserve/data/scripts/sglang_probe.server_host), so any address listen_host
# accepts is one they reach.
# RFC 1918 and RFC 4193 (ULA): the only addresses served without an API key
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))


@dataclass(frozen=True)
class ServicePlan:
    user: str
    group: str
    unit_text: str
    env_text: str
    config_text: str | None
    port: int
    served_name: str
    profile_name: str
    bin_dir: str
    host: str = LOOPBACK  # the address the server listens on (--host)
    warnings: tuple[str, ...] = ()  # for the deploy to print before any change
    # what the unit runs: ExecStart='s launcher, then the server's arguments (from the
    # env file), and the env file's variables unquoted (``gpuserve render`` shows them)
    argv: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class ServiceLaunch:
    """What the unit runs: one lock's SGLang with the launch's arguments and environment
    (gpuserve/plans/serve.py renders them)."""

    args: list[str]
    env: dict[str, str]
    venv: str
    user: str
    state_dir: str
    bin_dir: str
    profile_name: str
    profile_source: str
    sglang_version: str
    model_path: str
    port: int
    served_name: str
    cuda_home: str | None = None
    lock_name: str = ""
    profile_sets_host: bool = True
    # the profile field an argument came from, for its messages
    arg_field: Callable[[str], str] = lambda arg: "extra_args"


@dataclass(frozen=True, kw_only=True)
class ServiceData:
    """The service's host data (:data:`DEFAULTS`), checked by :func:`service_data`."""

    source: str
    extra_env: dict
    hf_token: str | None = None
    api_key: str | None = None
    listen_address: str | None = None
    hardening_off: tuple[str, ...] = ()


def service_data(source: str, *, extra_env: object = None, hf_token: object = None,
                 api_key: object = None, listen_address: object = None,
                 hardening_off: object = None) -> ServiceData:
    """The service's host data checked before any host is read; messages never show a
    secret. The listen address is checked against the key here and against the
    profile's ``server.host`` by :func:`plan_service`."""
    if extra_env is None:
        extra_env = {}
    if not isinstance(extra_env, dict):
        raise InputError(source, "sglang_extra_env", "must be a mapping of NAME: value")
    for key, value in extra_env.items():
        reserved = reserved_env(key) if isinstance(key, str) else None
        if reserved:
            raise InputError(source, f"sglang_extra_env.{key}", reserved)
        env_line(key, value, source, "sglang_extra_env")
    # type, single line, at least 16 characters, hf_ shape
    token = validate_secret(hf_token, "hf_token", source)
    key = validate_secret(api_key, "sglang_api_key", source)
    for name, secret in (("hf_token", token), ("sglang_api_key", key)):
        if secret and "\n" in secret:
            raise InputError(source, name, "must be a single line")
    if listen_address is not None and listen_address != "":
        listen_host(None, listen_address, bool(key), "", source)
    return ServiceData(source=source, extra_env=dict(extra_env), hf_token=token, api_key=key,
                       listen_address=listen_address or None,
                       hardening_off=validate_hardening_off(hardening_off, source))


def plan_service(launch: ServiceLaunch, data: ServiceData) -> ServicePlan:
    """Render the three files; every input problem is an ``InputError`` here."""
    args, data_source, profile_source = launch.args, data.source, launch.profile_source
    for hit in secret_flags(args, _catalog_or_none(launch.sglang_version)):
        # resolved like SGLang's parser: --api-k is --api-key (the message names the
        # option only, never the value)
        raise InputError(profile_source, "extra_args",
                         f"{hit.given} ({hit.flag}) would put a secret on the command line; "
                         "set sglang_api_key in host data instead")
    hf_token, api_key = data.hf_token, data.api_key
    merged: dict[str, tuple[str, str]] = {}
    values: dict[str, str] = {}
    for source, field_name, pairs in ((profile_source, "env", launch.env),
                                      (data_source, "sglang_extra_env", data.extra_env)):
        for key, value in pairs.items():
            reserved = reserved_env(key) if isinstance(key, str) else None
            if reserved:
                raise InputError(source, f"{field_name}.{key}", reserved)
            merged[key] = env_line(key, value, source, field_name)
            values[key] = str(value)
    if hf_token:
        merged["HF_TOKEN"] = env_line("HF_TOKEN", hf_token, data_source, "hf_token")
        values["HF_TOKEN"] = hf_token

    host, warnings = listen_host(_value(args, "--host"), data.listen_address, bool(api_key),
                                 profile_source, data_source, quiet=not launch.profile_sets_host)
    # last, so it wins over any spelling of --host earlier in the args (argparse keeps the
    # last value, abbreviations included)
    args = with_host(args, host)
    off = data.hardening_off
    if off:
        warnings.append(f"unit hardening switched off on this host (unit_hardening_off): "
                        f"{', '.join(off)}")
    venv, bin_dir = launch.venv, launch.bin_dir
    launcher = [f"{venv}/bin/python", "-m", "sglang.launch_server"]
    config_text = None
    if api_key:
        config_text = render_config({"api-key": api_key})
        args = [*args, "--config", CONFIG_PATH]
    if api_key or hf_token:
        # SGLang logs its resolved arguments, api_key included (sglang issue #37457):
        # run it under the redacting wrapper so no secret reaches the journal.
        launcher = [f"{venv}/bin/python", f"{bin_dir}/{REDACT_SCRIPT}", CONFIG_PATH, "--",
                    *launcher]

    # the kernel refuses one argv or environment string over 128 KiB (exec_limits)
    problem = args_problem(args, f"{ARGS_VAR}={args_value(args)}", launch.arg_field)
    if problem:
        raise InputError(profile_source, *problem)
    unit_text = render_unit(UnitSpec(
        user=launch.user, group=launch.user, state_dir=launch.state_dir, env_file=ENV_PATH,
        launcher=launcher, sglang_version=launch.sglang_version,
        model_path=launch.model_path, lock_name=launch.lock_name,
        cuda_home=launch.cuda_home, hardening_off=off,
    ))
    env_text = render_env_file(list(merged.values()), launch.profile_name, args)
    return ServicePlan(launch.user, launch.user, unit_text, env_text, config_text, launch.port,
                       launch.served_name, launch.profile_name, bin_dir, host, tuple(warnings),
                       (*launcher, *args), tuple(values.items()))


def listen_host(profile_host: str | None, listen_address: object, has_key: bool,
                profile_source: str, data_source: str,
                quiet: bool = False) -> tuple[str, list[str]]:
    """The address the server listens on, and warnings to print.

    Why: SGLang serves its admin endpoints (/flush_cache, /update_weights_from_disk,
    /shutdown ...) on the same port as the API, and without ``--api-key`` to anyone who
    can reach it. So: host data ``listen_address`` (an IP) wins; without it, the profile's
    ``server.host`` (default 0.0.0.0) applies only when ``sglang_api_key`` is set, else
    the server listens on 127.0.0.1. Without a key, a named address must be loopback or
    private (RFC 1918 / ULA, with a warning); every interface or a public one is refused.
    ``quiet``: the profile's host is its default, so falling back to loopback is no news.
    """
    warnings: list[str] = []
    if listen_address is None or listen_address == "":
        if has_key:
            return profile_host or "0.0.0.0", warnings
        if profile_host and profile_host != LOOPBACK and not quiet:
            warnings.append(
                f"listening on {LOOPBACK} only: no sglang_api_key is set, so the profile's "
                f"server.host {profile_host} ({profile_source}) does not apply; set "
                "sglang_api_key to serve on it, or listen_address to a private address")
        return LOOPBACK, warnings
    if not isinstance(listen_address, str):
        raise InputError(data_source, "listen_address",
                         f"must be an IP address string, got {listen_address!r:.80}")
    try:
        address = ipaddress.ip_address(listen_address)
    except ValueError:
        raise InputError(data_source, "listen_address", f"{listen_address!r:.80} is not an "
                         "IP address (e.g. 127.0.0.1, 10.0.0.21 or 0.0.0.0)") from None
    text = str(address)
    if has_key or address.is_loopback:
        return text, warnings
    if address.is_unspecified or not any(address in n for n in PRIVATE_NETWORKS):
        where = "every interface" if address.is_unspecified else "a public address"
        raise InputError(data_source, "listen_address",
                         f"{text} is {where}, and no sglang_api_key is set: anyone who "
                         "reaches it could use the server and its admin endpoints; set "
                         "sglang_api_key, or listen on 127.0.0.1 or a private address "
                         "(RFC 1918 / ULA)")
    warnings.append(f"listening on private address {text} with no sglang_api_key: anyone "
                    "on that network can use the server and its admin endpoints; set "
                    "sglang_api_key to require a key")
    return text, warnings


def _value(args: list[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``args``."""
    found = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(f"{flag}="):
            found = arg.split("=", 1)[1]
    return found


def with_host(args: list[str], host: str) -> list[str]:
    """``args`` without their ``--host`` and with ``--host HOST`` last."""
    out: list[str] = []
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--host" and index + 1 < len(args):
            skip = True
        elif not arg.startswith("--host="):
            out.append(arg)
    return [*out, "--host", host]


def _catalog_or_none(version: str):
    """The version's flag catalog to resolve abbreviations with; None (the conservative
    judgement over every committed catalog) when gpuserve has none for it."""
    try:
        return load_catalog(version)
    except InputError:
        return None
