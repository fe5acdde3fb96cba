"""The last good service configuration on the host, and rolling back to it.

Why: a profile whose health gate fails must leave the host serving its last good
profile, not down. After a passing deploy the live unit and its configuration files are
kept under ``/etc/gpuserve/last-good/``; a failed gate restores them when they differ.
The decisions here are pure; only :func:`keep_last_good` and the fact touch pyinfra.

How: docs/deploys.md, "gpuserve.roles.service.rollback: keep and restore"
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pyinfra import host, state
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from gpuserve.roles.base.prefetch import Read, fact_if_unchanged
from gpuserve.serve.service import CONFIG_DIR, CONFIG_PATH, ENV_PATH, UNIT_NAME, UNIT_PATH

LAST_GOOD_DIR = f"{CONFIG_DIR}/last-good"
PROFILE_RECORD = "profile"
# (name in LAST_GOOD_DIR, live path); the unit must come first: it is always present
FILES = (("unit", UNIT_PATH), ("env", ENV_PATH), ("config", CONFIG_PATH))


@dataclass(frozen=True)
class RollbackSpec:
    """What to keep and restore for one host's deploy of ``profile_name``."""

    profile_name: str
    unit: str = UNIT_NAME
    files: tuple[tuple[str, str], ...] = FILES
    saved_dir: str = LAST_GOOD_DIR

    def saved(self, name: str) -> str:
        return f"{self.saved_dir}/{name}"


@dataclass(frozen=True)
class ConfigState:
    """Fingerprints (``sha1 mode:user:group``, None when absent) of the live and the
    saved files, and the saved profile name."""

    live: dict[str, str | None] = field(default_factory=dict)
    saved: dict[str, str | None] = field(default_factory=dict)
    saved_profile: str | None = None

    @property
    def has_saved(self) -> bool:
        return self.saved.get("unit") is not None

    @property
    def live_is_saved(self) -> bool:
        return self.has_saved and self.live == self.saved


def state_command(spec: RollbackSpec) -> str:
    """Shell that prints one ``file live|saved NAME PATH`` line per file, then ``sha1sum``
    and ``stat`` of all of them at once (two processes: this runs on every rerun, where
    each process costs tens of milliseconds on a slow host), then ``profile NAME``.
    Reads only; prints no contents."""
    paths = [(kind, name, path) for name, live in spec.files
             for kind, path in (("live", live), ("saved", spec.saved(name)))]
    quoted = " ".join(shlex.quote(path) for _, _, path in paths)
    record = shlex.quote(spec.saved(PROFILE_RECORD))
    return "; ".join([
        *(f"echo {shlex.quote(f'file {kind} {name} {path}')}" for kind, name, path in paths),
        f"sha1sum -- {quoted} 2>/dev/null",
        f"stat -c 'mode %a:%U:%G %n' -- {quoted} 2>/dev/null",
        f"p=; {{ read -r p < {record}; }} 2>/dev/null", 'echo "profile $p"'])


def parse_state(lines: list[str] | None) -> ConfigState:
    """:func:`state_command`'s output. A file is present with a ``sha1 mode:user:group``
    fingerprint when both its sum and its mode were printed (sha1sum prints nothing for
    a missing file or a directory), else None."""
    names: dict[str, tuple[str, str]] = {}
    sums: dict[str, str] = {}
    modes: dict[str, str] = {}
    profile = None
    for line in lines or []:
        line = line.rstrip("\n")
        kind, _, rest = line.partition(" ")
        if kind == "profile":
            profile = rest.strip() or None
        elif kind == "file":
            which, _, rest = rest.partition(" ")
            name, _, path = rest.partition(" ")
            if which in ("live", "saved") and name and path:
                names[path] = (which, name)
        elif kind == "mode":
            mode, _, path = rest.partition(" ")
            modes[path] = mode
        elif len(kind) == 40 and rest.startswith(" "):  # sha1sum: "<sum>  <path>"
            sums[rest[1:]] = kind
    live: dict[str, str | None] = {}
    saved: dict[str, str | None] = {}
    for path, (which, name) in names.items():
        found = path in sums and path in modes
        (live if which == "live" else saved)[name] = (
            f"{sums[path]} {modes[path]}" if found else None)
    return ConfigState(live, saved, profile)


def needs_save(current: ConfigState, profile_name: str) -> bool:
    """Keep the live set unless it already is the saved one, under the same name."""
    return not (current.live_is_saved and current.saved_profile == profile_name)


@dataclass(frozen=True)
class RollbackDecision:
    target: str | None  # the profile to go back to; None: nothing to roll back to
    reason: str


def rollback_decision(current: ConfigState) -> RollbackDecision:
    if not current.has_saved:
        return RollbackDecision(None, "nothing to roll back to: no configuration has passed "
                                      "the health gate and smoke on this host yet")
    name = current.saved_profile or "unknown"
    if current.live_is_saved:
        return RollbackDecision(None, "nothing to roll back to: the failing configuration "
                                      f"is the last good one (profile {name})")
    return RollbackDecision(name, f"rolling back to the last good configuration "
                                  f"(profile {name})")


def _copy(src: str, dest: str) -> str:
    """Copy with owner and mode, via a temporary name so ``dest`` is replaced at once;
    remove ``dest`` when ``src`` does not exist."""
    tmp = f"{dest}.gpuserve-tmp"
    return (f"if [ -f {shlex.quote(src)} ]; then cp -p {shlex.quote(src)} {shlex.quote(tmp)}"
            f" && mv -f {shlex.quote(tmp)} {shlex.quote(dest)}; "
            f"else rm -f {shlex.quote(dest)}; fi")


def save_script(spec: RollbackSpec) -> str:
    d = shlex.quote(spec.saved_dir)
    record = spec.saved(PROFILE_RECORD)
    # one process for the directory, its owner and mode (install -d also fixes them on
    # an existing one): every process is tens of ms on a slow host, and this runs on
    # every switch after the server is ready
    steps = [f"umask 077 && install -d -o root -g root -m 700 {d}"]
    steps += [_copy(live, spec.saved(name)) for name, live in spec.files]
    steps.append(f"printf '%s\\n' {shlex.quote(spec.profile_name)} > {shlex.quote(record)}.tmp"
                 f" && mv -f {shlex.quote(record)}.tmp {shlex.quote(record)}")
    return " && ".join(f"{{ {s}; }}" for s in steps)


def restore_script(spec: RollbackSpec) -> str:
    unit = shlex.quote(spec.unit)
    steps = ["umask 077", *(_copy(spec.saved(name), live) for name, live in spec.files)]
    steps += ["systemctl daemon-reload", f"{{ systemctl reset-failed {unit} || true; }}",
              f"systemctl restart {unit}"]
    return " && ".join(f"{{ {s}; }}" if s.startswith("if") else s for s in steps)


class ServiceConfigState(FactBase):
    """Fingerprints of the live and last-good service files (see :func:`state_command`)."""

    def command(self, script: str) -> str:
        return script

    def process(self, output: list[str]) -> list[str]:
        return list(output)


def read_state(spec: RollbackSpec) -> ConfigState:
    """The live and last-good fingerprints; from the deploy's prefetch while the deploy
    changes nothing on this host (roles/base/prefetch.py), else read now."""
    return parse_state(fact_if_unchanged(ServiceConfigState, script=state_command(spec)))


def reads(spec: RollbackSpec) -> list[Read]:
    """What :func:`keep_last_good` reads, for the deploy's prefetch."""
    return [Read.of(ServiceConfigState, script=state_command(spec))]


@operation(is_idempotent=True)
def keep_last_good(spec: RollbackSpec, service_changed: bool = False):
    """After a passing gate and smoke: save the live configuration as the last good one
    (root-only copies, contents never shown); nothing when it already is.

    ``service_changed``: this deploy rewrote the service's files or (re)started it
    (roles/service ``planned_steps``, decided at prepare time). Then the live set is new,
    so it is copied without reading it afresh first (one remote command less on every
    switch); otherwise a read decides, so a rerun that changed nothing of the service
    still reports "No changes" here."""
    if not state.is_executing:
        return
    if not service_changed and not needs_save(read_state(spec), spec.profile_name):
        host.noop(f"the live configuration is the last good one (profile {spec.profile_name})")
        return
    yield StringCommand("sh", "-c", QuoteString(save_script(spec)))


def rollback_outcome(failed: str, target: str, seconds: float, error: str | None) -> str:
    """The line that ends a rolled-back deploy's failure report."""
    # the same name: host data (sglang_extra_env, secrets, ...) or the profile file changed
    what = (f"the previous configuration of profile {target}" if target == failed
            else f"profile {target}")
    if error is None:
        return (f"rolled back: profile {failed} failed, the host was rolled back to {what}, "
                f"which is healthy again (/health 200 after {seconds:.0f} s)")
    return (f"rolled back to {what}, but it is NOT healthy either: {error}; "
            f"last journal lines:")
