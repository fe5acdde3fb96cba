"""Prepare-time plan of a serve deploy: host data, the lock, the preflight, the launch.

Everything that can be wrong with the input (host data types, the lock, the profile
file, a flag the target SGLang lacks) is found here and raised as ``InputError``, and
everything that makes the host unfit for the chosen lock (driver, Python, glibc, disk,
CUDA toolkit major) as ``PreflightError``, before deploy/serve.py adds a single
operation. Pure apart from the callables that read the host's facts, so tests drive it
with plain dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.host.nccl_env import HOST_JSON_PATH, sglang_flags_for_host
from gpuserve.launch.catalog import available_versions, load_catalog
from gpuserve.launch.dialect import render_launch
from gpuserve.launch.lock_choice import (
    HostRuntime,
    PreflightError,
    choose_lock,
    cuda_home,
    preflight,
    public_version,
)
from gpuserve.launch.locks import Lock, catalog_mismatch, load_locks
from gpuserve.launch.profiles import load_profile
from gpuserve.launch.venvs import venv_path
from gpuserve.measure.results import RecordSpec, record_spec
from roles import checks, service, sglang


@dataclass(frozen=True)
class ServePlan:
    lock: Lock
    version: str  # the release whose flags are rendered (the lock's, without local part)
    user: str
    home: str
    index_url: str | None
    find_links: str | None
    health_timeout: float
    keep_venvs: int
    expect_gpus: int
    service: service.ServicePlan
    record: RecordSpec | None = None  # where the smoke check records (None: off)

    @property
    def venv(self) -> str:
        return venv_path(self.home, self.lock)

    @property
    def bin_dir(self) -> str:
        return f"{self.home}/bin"

    @property
    def config_path(self) -> str:
        return service.CONFIG_PATH if self.service.config_text is not None else ""


def defaults() -> dict:
    merged: dict = {"profile": None}
    for layer in (sglang.DEFAULTS, service.DEFAULTS, checks.DEFAULTS):
        merged.update(layer)
    return merged


def _opt_str(data: dict, key: str, source: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InputError(source, key, f"must be a string, got {value!r}")
    return value


def plan_serve(
    host_data: dict,
    source: str,
    host_runtime: Callable[[str], HostRuntime],
    host_record: Callable[[], list[str] | None] = lambda: None,
) -> ServePlan:
    """Validate ``host_data`` (merged over :func:`defaults`), choose the lock, preflight
    the host against it, and render the launch for the lock's SGLang.

    ``host_record`` reads the host deploy's ``/etc/gpuserve/host.json`` (lines, or None
    when absent); flags the host's communication requires (no P2P ->
    ``--disable-custom-all-reduce``) are added when the profile does not set them.
    """
    data = defaults()
    data.update({k: v for k, v in host_data.items() if k in data})

    profile_ref = data["profile"]
    if not profile_ref or not isinstance(profile_ref, str):
        raise InputError(source, "profile",
                         "required: a profile name (profiles/<name>.yaml) or path, "
                         "in host data or as --data profile=NAME")
    pinned = _opt_str(data, "sglang_version", source)
    locks_dir = _opt_str(data, "sglang_locks_dir", source)
    user = sglang.validate_user(data["sglang_user"], source)
    home = sglang.validate_home(data["sglang_home"], source)
    keep = sglang.validate_keep(data["keep_venvs"], source)
    index_url = _opt_str(data, "pip_index_url", source)
    find_links = _opt_str(data, "pip_find_links", source)
    timeout = data["health_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise InputError(source, "health_timeout", f"must be a positive number of seconds, "
                         f"got {timeout!r}")

    profile = load_profile(profile_ref)
    locks = load_locks(locks_dir, source=source, field="sglang_locks_dir")
    runtime = host_runtime(home)
    # a profile without sglang_versions renders for every release with a flag catalog
    lock = choose_lock(locks, runtime, versions=profile.sglang_versions or available_versions(),
                       pinned=pinned, profile=profile.name)
    problems = preflight(lock, runtime)
    if problems:
        raise PreflightError("; ".join(problems) + "; nothing on the host was changed")
    version = public_version(lock.sglang)
    mismatch = catalog_mismatch(lock, load_catalog(version).source)
    if mismatch:
        raise InputError(lock.path, "packages (sglang)", mismatch)
    launch = render_launch(profile, version)
    args = list(launch.args)
    for arg in args:
        # systemd's ExecStart= cannot carry them (roles/service/render.py refuses them)
        if any(ord(c) < 32 or ord(c) == 127 for c in arg):
            owner = next((f for f, items in launch.by_field.items() if arg in items),
                         "extra_args")
            raise profile.error(owner, f"{arg!r} contains a control character, which a "
                                       "systemd ExecStart= line cannot carry")
    host_flags = [f for f in sglang_flags_for_host(host_record(), HOST_JSON_PATH) if f not in args]
    if host_flags:
        args += host_flags
        load_catalog(version).validate(
            args, source=HOST_JSON_PATH, field="disable_custom_all_reduce"
        )
    served = profile.model.served_name or profile.model.path
    plan = service.plan_service(
        args=args, env=launch.env, venv=venv_path(home, lock), user=user,
        state_dir=sglang.state_dir(home), bin_dir=f"{home}/bin", profile_name=profile.name,
        profile_source=str(profile.source), sglang_version=version,
        model_path=profile.model.path, port=profile.server.port, served_name=served,
        extra_env=data["sglang_extra_env"], hf_token=data["hf_token"],
        api_key=data["sglang_api_key"], data_source=source,
        cuda_home=cuda_home(runtime, lock), lock_name=lock.name,
    )
    extra_env = data["sglang_extra_env"] or {}
    record = record_spec(data["results_dir"], source, profile=profile.name, args=args,
                         env={**launch.env, **{k: str(v) for k, v in extra_env.items()}},
                         sglang_version=version, model=profile.model.path, served_name=served)
    return ServePlan(lock, version, user, home, index_url, find_links, float(timeout), keep,
                     runtime.gpus, plan, record)
