"""The SGLang systemd service: unit, EnvironmentFile, secrets --config, activation.

Everything is decided at prepare time by :func:`plan_service` (pure, raises
``InputError``), then :func:`configure_service` only puts files and (re)starts.

Activation follows the unit-change pattern (pyinfra docs, operations/systemd.py):
``daemon-reload`` only when the unit file changed, ``restart`` only when the unit, the
EnvironmentFile or the --config file changed *and* the service was already running
(``systemd.service(restarted=True)`` only restarts a running unit), then
``start`` + ``enable`` when it is not running or not enabled, with the start limit
cleared first when the unit had failed, or when anything changed while it was live (an
inactive unit has no start limit to clear; see :func:`reset_failed`). A rerun with
nothing changed therefore runs no command at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, deploy, operation
from pyinfra.facts.server import Command
from pyinfra.operations import files, systemd

from gpuserve.errors import InputError
from gpuserve.paths import SCRIPTS_DIR
from roles.service.render import (
    UnitSpec,
    env_line,
    render_config,
    render_env_file,
    render_unit,
)
from roles.service.secret import secret_file

DEFAULTS = {
    # extra environment for the server (dict), added after the profile's env
    "sglang_extra_env": {},
    # Hugging Face token (secret): EnvironmentFile only (mode 0600, root)
    "hf_token": None,
    # SGLang --api-key (secret): --config YAML only (mode 0600, service user)
    "sglang_api_key": None,
}

UNIT_NAME = "gpuserve-sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
CONFIG_DIR = "/etc/gpuserve"
ENV_PATH = f"{CONFIG_DIR}/sglang.env"
CONFIG_PATH = f"{CONFIG_DIR}/sglang-secrets.yaml"

# Flags that carry secrets and so must never be rendered onto the command line.
SECRET_FLAGS = ("--api-key", "--admin-api-key")
REDACT_SCRIPT = "sglang_redact.py"


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


def plan_service(*, args: list[str], env: dict[str, str], venv: str, user: str,
                 state_dir: str, bin_dir: str, profile_name: str, profile_source: str,
                 sglang_version: str, model_path: str, port: int, served_name: str,
                 extra_env: object, hf_token: object, api_key: object,
                 data_source: str, cuda_home: str | None = None,
                 lock_name: str = "") -> ServicePlan:
    """Render the three files; every input problem is an ``InputError`` here."""
    for flag in SECRET_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in args):
            raise InputError(profile_source, "extra_args",
                             f"{flag} would put a secret on the command line; set "
                             "sglang_api_key in host data instead")
    if extra_env is None:
        extra_env = {}
    if not isinstance(extra_env, dict):
        raise InputError(data_source, "sglang_extra_env", "must be a mapping of NAME: value")
    for key, value in (("hf_token", hf_token), ("sglang_api_key", api_key)):
        if value is not None and not isinstance(value, str):
            # the type only: a secret's value is never echoed (pyinfra's --data reads
            # an all-digit value as a number)
            raise InputError(data_source, key, f"must be a string, got a {type(value).__name__} "
                             "(quote it)")
        if value is not None and not value.strip():
            raise InputError(data_source, key, "must be a non-empty string")

    merged: dict[str, tuple[str, str]] = {}
    for key, value in env.items():
        merged[key] = env_line(key, value, profile_source, "env")
    for key, value in extra_env.items():
        merged[key] = env_line(key, value, data_source, "sglang_extra_env")
    if hf_token:
        if "\n" in hf_token:
            raise InputError(data_source, "hf_token", "must be a single line")
        merged["HF_TOKEN"] = env_line("HF_TOKEN", hf_token, data_source, "hf_token")

    argv = [f"{venv}/bin/python", "-m", "sglang.launch_server", *args]
    config_text = None
    if api_key:
        if "\n" in api_key:
            raise InputError(data_source, "sglang_api_key", "must be a single line")
        config_text = render_config({"api-key": api_key})
        argv += ["--config", CONFIG_PATH]
    if api_key or hf_token:
        # SGLang logs its resolved arguments, api_key included (sglang issue #37457):
        # run it under the redacting wrapper so no secret reaches the journal.
        argv = [f"{venv}/bin/python", f"{bin_dir}/{REDACT_SCRIPT}", CONFIG_PATH, "--", *argv]

    unit_text = render_unit(UnitSpec(
        user=user, group=user, state_dir=state_dir, env_file=ENV_PATH, argv=argv,
        profile_name=profile_name, profile_source=profile_source,
        sglang_version=sglang_version, model_path=model_path, lock_name=lock_name,
        cuda_home=cuda_home,
    ))
    env_text = render_env_file(list(merged.values()), profile_name)
    return ServicePlan(user, user, unit_text, env_text, config_text, port, served_name,
                       profile_name, bin_dir)


@operation(is_idempotent=True)
def reset_failed(unit: str, changed: Callable[[], bool]):
    """``systemctl reset-failed`` when the configuration changed or the unit is failed.

    Every start counts towards StartLimitBurst (deploy restarts included), so without
    this a few redeploys in an hour, or a fixed profile after a crash loop, would be
    refused with "Start request repeated too quickly". Decided at execute time, when
    the earlier operations' results are known.
    """
    if not state.is_executing:
        return
    active = (host.get_fact(Command, f"systemctl show -p ActiveState --value {unit}")
              or "").strip()
    # An inactive unit (e.g. never started since its file appeared) has nothing to clear,
    # and systemctl refuses it ("Unit ... not loaded"): only failed or live units.
    if active == "failed" or (changed() and active in ("active", "activating", "reloading")):
        yield StringCommand("systemctl", "reset-failed", QuoteString(unit))
    else:
        host.noop(f"{unit} is {active or 'absent'}: no start limit to clear")


@deploy("Configure the SGLang service")
def configure_service(plan: ServicePlan) -> None:
    files.directory(name=f"{CONFIG_DIR} (root, readable by {plan.group} only)",
                    path=CONFIG_DIR, user="root", group=plan.group, mode="750")
    env = secret_file(name=f"EnvironmentFile {ENV_PATH} (0600 root)", dest=ENV_PATH,
                      contents=plan.env_text, user="root", group="root", mode="600")
    if plan.config_text is not None:
        cfg = secret_file(name=f"SGLang --config {CONFIG_PATH} (0600 {plan.user})",
                          dest=CONFIG_PATH, contents=plan.config_text, user=plan.user,
                          group=plan.group, mode="600")
    else:
        cfg = files.file(name=f"no --config file {CONFIG_PATH} (no API key)",
                         path=CONFIG_PATH, present=False)
    files.directory(name=f"{plan.bin_dir} (gpuserve host scripts)", path=plan.bin_dir,
                    user="root", group="root", mode="755")
    redact = files.put(name=f"output redactor {plan.bin_dir}/{REDACT_SCRIPT}",
                       src=str(SCRIPTS_DIR / REDACT_SCRIPT), dest=f"{plan.bin_dir}/{REDACT_SCRIPT}",
                       user="root", group="root", mode="755")
    unit = files.put(name=f"systemd unit {UNIT_PATH}", src=StringIO(plan.unit_text),
                     dest=UNIT_PATH, user="root", group="root", mode="644")

    def changed() -> bool:
        return any(op.did_change() for op in (unit, env, cfg, redact))

    systemd.daemon_reload(name="systemd daemon-reload (unit changed)", _if=unit.did_change)
    reset_failed(name=f"clear {UNIT_NAME} start limit (changed or failed)", unit=UNIT_NAME,
                 changed=changed)
    systemd.service(name=f"restart {UNIT_NAME} (configuration changed)", service=UNIT_NAME,
                    running=None, restarted=True, _if=changed)
    systemd.service(name=f"{UNIT_NAME} running and enabled", service=UNIT_NAME,
                    running=True, enabled=True)
