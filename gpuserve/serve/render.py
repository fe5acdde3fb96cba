"""Pure rendering of the SGLang unit, EnvironmentFile and --config file.

Kept free of pyinfra so the exact bytes that land on a host are unit-tested. Quoting
follows systemd's own parsers: ExecStart= words (systemd.service(5), "Command lines"),
EnvironmentFile= assignments (systemd.exec(5); src/basic/env-file.c) and the splitting
of a ``$VAR`` word of ExecStart= (src/basic/env-util.c ``replace_env_argv``).

The unit holds how SGLang runs on this host (venv, user, hardening); the profile's
server arguments live in the EnvironmentFile as ``GPUSERVE_SGLANG_ARGS``, which ExecStart=
expands. A switch between profiles of one SGLang install therefore changes only the
EnvironmentFile, which systemd reads at every start: no ``daemon-reload``, which
re-runs every generator and re-reads every unit (5-6 s on the lab's emulated host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath

import jinja2

from gpuserve.env_names import ARGS_VAR
from gpuserve.errors import GpuserveError, InputError
from gpuserve.host.nccl_env import NCCL_ENV_PATH
from gpuserve.launch.exec_limits import env_problem
from gpuserve.paths import TEMPLATES_DIR
from gpuserve.serve.jit_cache import jit_env

TEMPLATES = TEMPLATES_DIR  # templates/ of the checkout, or gpuserve/templates installed

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_ENV_VALUE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]*$")

#: The unit's hardening directives that host data ``unit_hardening_off`` may switch off,
#: one by one, for a host where one breaks the server (the template says why each is
#: there). DevicePolicy also drops its DeviceAllow= lines, SystemCallFilter its
#: SystemCallErrorNumber=.
HARDENING = (
    "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "ProtectKernelTunables",
    "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock",
    "ProtectHostname", "RestrictSUIDSGID", "RestrictRealtime", "LockPersonality",
    "RestrictAddressFamilies", "SystemCallArchitectures", "CapabilityBoundingSet",
    "AmbientCapabilities", "RestrictNamespaces", "ProtectProc", "RemoveIPC", "DevicePolicy",
    "SystemCallFilter",
)


def _refuse_control_characters(word: str) -> None:
    """A last guard: profile and host data validation refuse control characters with
    the file and field first, so reaching this is a gap in that validation."""
    if any(ord(c) < 32 or ord(c) == 127 for c in word):
        raise GpuserveError(f"launch argument {word!r} contains a control character, "
                            "which a systemd unit cannot carry")


def systemd_quote(word: str) -> str:
    """Quote one argv word for ExecStart=.

    systemd splits on whitespace, honours "..." with C-style backslash escapes, expands
    ``$VAR``/``${VAR}`` (``$$`` is a literal ``$``) and ``%`` specifiers (``%%`` is a
    literal ``%``), so every word is escaped for all three, and control characters are
    refused rather than guessed at.
    """
    _refuse_control_characters(word)
    if word and _SAFE_WORD.match(word):
        return word.replace("%", "%%")
    escaped = (
        word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    )
    return f'"{escaped}"'


def args_value(args: list[str]) -> str:
    """The value of ``GPUSERVE_SGLANG_ARGS`` whose expansion in ExecStart= is exactly ``args``.

    systemd replaces a word ``$VAR`` by the variable split into words with
    ``extract_first_word(EXTRACT_UNQUOTE|EXTRACT_RELAX)`` (src/basic/env-util.c):
    whitespace separates, "..." and '...' quote, a backslash escapes the next character;
    no variable or specifier is expanded inside. So a word that is not plainly safe goes
    in double quotes with ``\\`` and ``\"`` escaped (an empty word is ``""``). The
    value is then quoted once more for the EnvironmentFile by :func:`env_line`.
    Control characters are refused, as in :func:`systemd_quote`."""
    words = []
    for word in args:
        _refuse_control_characters(word)
        if word and _SAFE_WORD.match(word):  # % and $ are plain here
            words.append(word)
        else:
            words.append('"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return " ".join(words)


def exec_start(argv: list[str]) -> str:
    """ExecStart= value, one flag and its values per continuation line for readability."""
    groups: list[list[str]] = []
    for i, word in enumerate(argv):
        if i == 0 or (word.startswith("--") and len(word) > 2) or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    lines = [" ".join(systemd_quote(w) for w in g) for g in groups]
    # the interpreter and "-m sglang.launch_server" stay on the first line
    head = lines[0]
    rest = lines[1:]
    return " \\\n    ".join([head, *rest])


def env_line(key: str, value: str, source: str, field_name: str) -> tuple[str, str]:
    """Validate and quote one EnvironmentFile assignment (double quotes escape \\ " ` $)."""
    if not isinstance(key, str) or not _ENV_KEY.match(key):
        raise InputError(source, f"{field_name}.{key}", "not a valid environment variable name")
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise InputError(source, f"{field_name}.{key}", "value must be a string or a number")
    value = str(value)
    if "\n" in value or "\r" in value or "\0" in value:
        raise InputError(source, f"{field_name}.{key}", "value must be a single line")
    problem = env_problem(key, value)
    if problem:
        raise InputError(source, f"{field_name}.{key}", problem)
    if _SAFE_ENV_VALUE.match(value):
        return key, value
    escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
    return key, f'"{escaped}"'


def validate_hardening_off(value: object, source: str) -> tuple[str, ...]:
    """Host data ``unit_hardening_off``: a list of names from :data:`HARDENING`."""
    if value is None or value == []:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InputError(source, "unit_hardening_off", "must be a list of directive names, "
                         f"e.g. [\"SystemCallFilter\"]; got {value!r:.80}")
    unknown = [v for v in value if v not in HARDENING]
    if unknown:
        raise InputError(source, "unit_hardening_off", f"{unknown[0]!r:.60} is not a hardening "
                         f"directive of the unit; one of: {', '.join(HARDENING)}")
    return tuple(dict.fromkeys(value))


@cache
def _env() -> jinja2.Environment:
    """One environment per process: its templates compile once (a serve plan renders the
    unit twice; compiling them each time was a sixth of a fleet status). Its loader still
    reloads a template whose file changed."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


@dataclass
class UnitSpec:
    """Everything the unit file depends on (none of it secret)."""

    user: str
    group: str
    state_dir: str
    env_file: str
    # the fixed head of the command line: the venv's python, -m sglang.launch_server
    # (behind the redacting wrapper when there are secrets); the profile's arguments
    # follow from the EnvironmentFile (ARGS_VAR)
    launcher: list[str]
    sglang_version: str
    model_path: str = ""
    # The lock the venv was built from, and the CUDA toolkit of torch's major that JIT
    # compilers (flashinfer, sgl-kernel) must use: set explicitly, because without it they
    # fall back to /usr/local/cuda, whatever major that is (sglang-install.md §6).
    lock_name: str = ""
    cuda_home: str | None = None
    # The host deploy's NCCL env (roles/nccl); optional: a host not provisioned by
    # gpuserve has none. Read before env_file so the profile's own env wins.
    host_env_file: str = NCCL_ENV_PATH
    extra_rw_paths: list[str] = field(default_factory=list)
    # hardening directives switched off for this host (validate_hardening_off)
    hardening_off: tuple[str, ...] = ()
    restart_sec: int = 15
    timeout_start: str = "20min"
    timeout_stop: str = "2min"
    start_limit_interval: str = "30min"
    start_limit_burst: int = 4
    limit_nofile: int = 1048576
    syslog_identifier: str = "sglang"

    @property
    def protect_home(self) -> str:
        # A model kept under /home or /root must stay readable; everything else hides them.
        if self.model_path.startswith(("/home/", "/root/", "/run/user/")):
            return "read-only"
        return "yes"


#: Where the server's unit file lives (gpuserve/serve/service.py ``UNIT_PATH``).
SYSTEM_UNIT_DIR = "/etc/systemd/system"
#: The server's EnvironmentFile (gpuserve/serve/service.py ``ENV_PATH``): profile env, secrets and
#: the server's arguments; root-only.
SERVICE_ENV_PATH = "/etc/gpuserve/sglang.env"


def profile_line(profile_name: str) -> str:
    """The EnvironmentFile's line that names the profile: a shell test on the live
    file tells which profile the host serves (roles/checks ``serving_probe``)."""
    return f"# Profile: {profile_name}"


def render_unit(spec: UnitSpec) -> str:
    return _env().get_template("sglang-unit.service.j2").render(
        **{k: getattr(spec, k) for k in spec.__dataclass_fields__},
        protect_home=spec.protect_home,
        exec_start=exec_start(spec.launcher) + f" \\\n    ${ARGS_VAR}",
        read_write_paths=[spec.state_dir, *spec.extra_rw_paths],
        venv_bin=str(PurePosixPath(spec.launcher[0]).parent) if spec.launcher else "",
        jit_env=jit_env(spec.state_dir, spec.sglang_version),
    )


def render_env_file(env: list[tuple[str, str]], profile_name: str, args: list[str]) -> str:
    """Render pre-validated (key, quoted value) pairs (see :func:`env_line`), then the
    server's arguments (:func:`args_value`)."""
    # args_value refused control characters, so env_line (single line) cannot refuse it
    _, quoted = env_line(ARGS_VAR, args_value(args), f"profile {profile_name}", "args")
    return _env().get_template("sglang-env.j2").render(
        env=env, profile_line=profile_line(profile_name), args_var=ARGS_VAR,
        args_value=quoted)


def render_config(options: dict[str, str]) -> str:
    """SGLang --config YAML: one ``key: "json string"`` a line (JSON strings are YAML)."""
    return _env().get_template("sglang-config.yaml.j2").render(options=sorted(options.items()))
