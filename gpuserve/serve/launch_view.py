"""What the serve unit runs on one host: its argv and environment, as ``gpuserve render
INVENTORY --limit HOST`` shows them.

Pure: built from the serve deploy's own plan (``plan_serve``'s ``ServicePlan``: the
launcher and arguments it writes, the env file's variables, the unit text it renders)
and the host's ``/etc/gpuserve/nccl.env`` (the host deploy's NCCL choice, which the unit
reads before the profile's env file). Never a second rendering: every value comes from
the plan the deploy would apply. Secrets are masked here, before anything is written
or printed.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.host.nccl_env import NCCL_ENV_PATH, parse_env_file
from gpuserve.launch.catalog import load_catalog
from gpuserve.launch.secrets import is_secret_env_name, redact_args
from gpuserve.redact import REDACTED
from gpuserve.serve.service import ENV_PATH, UNIT_PATH, ServicePlan

SCHEMA = "gpuserve.launch-view/1"
LAUNCH_MODULE = ("-m", "sglang.launch_server")


@dataclass(frozen=True)
class LaunchView:
    """One host's launch: ``launcher`` (the interpreter, the redacting wrapper when
    there are secrets, ``-m sglang.launch_server``), ``args`` (the server's arguments,
    as its process has them after the launcher) and ``env`` ((name, value, file) in
    the order systemd applies them; a later name wins)."""

    host: str
    profile: str
    sglang_version: str
    lock: str
    launcher: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str, str], ...]

    def effective_env(self) -> dict[str, str]:
        """The server's environment from the unit: the last assignment of each name."""
        return {key: value for key, value, _ in self.env}

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "host": self.host, "profile": self.profile,
                "sglang_version": self.sglang_version, "lock": self.lock,
                "launcher": list(self.launcher), "args": list(self.args),
                "env": [list(item) for item in self.env]}


def unit_environment(unit_text: str) -> list[tuple[str, str]]:
    """The unit's ``Environment=NAME=VALUE`` lines (the template writes them unquoted)."""
    found = []
    for line in unit_text.splitlines():
        if line.startswith("Environment="):
            key, _, value = line[len("Environment="):].partition("=")
            found.append((key, value))
    return found


def launch_view(service: ServicePlan, *, host: str, sglang_version: str, lock: str,
                nccl_env_text: str | None) -> LaunchView:
    """The plan's launch with the host's NCCL env, secrets masked."""
    split = _launch_index(service.argv)
    launcher, args = service.argv[:split], service.argv[split:]
    catalog = load_catalog(sglang_version)
    env = [(k, v, UNIT_PATH) for k, v in unit_environment(service.unit_text)]
    env += [(k, v, NCCL_ENV_PATH) for k, v in parse_env_file(nccl_env_text or "").items()]
    env += [(k, v, ENV_PATH) for k, v in service.environment]
    masked = tuple((k, REDACTED if is_secret_env_name(k) else v, where) for k, v, where in env)
    return LaunchView(host, service.profile_name, sglang_version, lock, tuple(launcher),
                      tuple(redact_args(list(args), catalog)), masked)


def _launch_index(argv: tuple[str, ...]) -> int:
    """Where the server's arguments start: after ``-m sglang.launch_server``."""
    for index in range(len(argv) - 1):
        if argv[index:index + 2] == LAUNCH_MODULE:
            return index + 2
    raise ValueError("the unit's command line has no -m sglang.launch_server")


def view_of(doc: object, path: str) -> LaunchView:
    """A view written by the read-only deploy (``path`` names it in errors)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(path, "schema", f"not a {SCHEMA} document")
    try:
        return LaunchView(
            str(doc["host"]), str(doc["profile"]), str(doc["sglang_version"]),
            str(doc["lock"]), tuple(str(a) for a in doc["launcher"]),
            tuple(str(a) for a in doc["args"]),
            tuple((str(k), str(v), str(w)) for k, v, w in doc["env"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(path, "launch", f"malformed: {exc}"[:200]) from None

