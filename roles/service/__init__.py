"""The SGLang systemd service: unit, EnvironmentFile, secrets --config, activation.

Everything is decided at prepare time by :func:`plan_service` (pure, raises
``InputError``), then :func:`configure_service` only puts files and (re)starts.

Every read comes from the deploy's one batched prefetch (roles/base/prefetch.py): a file is
written only when it differs (roles/base/managed.py), and activation is one ``systemctl``
chain decided by :func:`activation_steps` (daemon-reload when the unit changed,
reset-failed and restart when a live server must pick up changes, start and enable
when needed). A rerun with nothing changed therefore runs no command at all, and one
cut off between writing a file and restarting still restarts
(:class:`roles.base.managed.UnitState`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyinfra.api import deploy

from gpuserve.host.nccl_env import NCCL_ENV_PATH
from gpuserve.host.unit_state import LiveUnit
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.preview import restart_reason
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.prefetch import Read
from gpuserve.serve.service import (
    CONFIG_DIR,
    CONFIG_PATH,
    ENV_PATH,
    REDACT_SCRIPT,
    UNIT_NAME,
    UNIT_PATH,
    ServicePlan,
)
from gpuserve.serve.service import DEFAULTS as SERVICE_DEFAULTS

#: the host-data keys this role reads (defined beside the plan's decisions)
DEFAULTS = SERVICE_DEFAULTS

__all__ = ["DEFAULTS", "activation_steps", "configure_service", "planned_steps", "reads",
           "service_files"]

def reads(bin_dir: str) -> list[Read]:
    """Every path and state :func:`configure_service` reads, for the deploy's prefetch
    (``bin_dir``: the plan's, known from ``sglang_home`` before any host read)."""
    return [managed.read(p) for p in (CONFIG_DIR, ENV_PATH, CONFIG_PATH, bin_dir,
                                       f"{bin_dir}/{REDACT_SCRIPT}", UNIT_PATH)] + [
        managed.read_unit(UNIT_NAME, MANAGED_FILES)]


#: The files the server runs from: a live server older than one of them restarts. The
#: host's nccl.env is one (an EnvironmentFile of the unit, written by the host deploy's
#: measured choice): P2P restored and measured again reaches the server at the next serve.
MANAGED_FILES = (UNIT_PATH, ENV_PATH, CONFIG_PATH, NCCL_ENV_PATH)


@dataclass(frozen=True)
class ServiceFile:
    """One file the service runs from: where, what, whose (contents a function, so
    that pyinfra's logged operation arguments never hold a secret)."""

    name: str
    dest: str
    contents: Callable[[], str]
    user: str
    group: str
    mode: str


def service_files(plan: ServicePlan) -> list[ServiceFile]:
    """The EnvironmentFile, the ``--config`` file (when there is a key), the redactor
    and the unit, in the order :func:`configure_service` writes them."""
    files = [ServiceFile(f"EnvironmentFile {ENV_PATH} (0600 root)", ENV_PATH,
                         lambda: plan.env_text, "root", "root", "600")]
    if plan.config_text is not None:
        config_text = plan.config_text
        files.append(ServiceFile(f"SGLang --config {CONFIG_PATH} (0600 {plan.user})",
                                 CONFIG_PATH, lambda: config_text, plan.user, plan.group,
                                 "600"))
    redact = (SCRIPTS_DIR / REDACT_SCRIPT).read_text()
    files.append(ServiceFile(f"output redactor {plan.bin_dir}/{REDACT_SCRIPT}",
                             f"{plan.bin_dir}/{REDACT_SCRIPT}", lambda: redact, "root",
                             "root", "755"))
    files.append(ServiceFile(f"systemd unit {UNIT_PATH}", UNIT_PATH, lambda: plan.unit_text,
                             "root", "root", "644"))
    return files


def _differs(item: ServiceFile) -> bool:
    return not managed.matches(managed.state(item.dest), "file", item.user, item.group,
                               item.mode, managed.sha1(item.contents()))


def planned_steps(plan: ServicePlan) -> list[str]:
    """The activation :func:`configure_service` will run, decided from the prefetched
    state before any operation exists (a rolling switch must know before the first file
    changes whether the server restarts: roles/router/rolling.py)."""
    changed = [f.dest for f in service_files(plan) if _differs(f)]
    config_removed = plan.config_text is None and managed.state(CONFIG_PATH).kind != "absent"
    live = managed.unit_state(UNIT_NAME, MANAGED_FILES)
    return activation_steps(live, files_changed=bool(changed) or config_removed,
                            unit_changed=UNIT_PATH in changed)


#: systemd's ActiveState values of a unit whose server may be running
LIVE_STATES = ("active", "activating", "reloading")


@deploy("Configure the SGLang service")
def configure_service(plan: ServicePlan, before_restart: Callable[[], None] | None = None
                      ) -> list[str]:
    """Put the files (only those that differ: roles/base/managed.py), then activate when
    anything changed, the unit is not active and enabled, or the server runs an older
    configuration than its files (see :class:`roles.base.managed.UnitState`).

    ``before_restart``: called (at prepare time, before the first file operation) when
    the activation will restart a live server, so its operations run first. Returns the
    activation's steps ([]: the service's files and state stay as they are)."""
    steps = planned_steps(plan)
    unit = managed.unit_state(UNIT_NAME, MANAGED_FILES)
    live = unit.active in LIVE_STATES
    if planned.collecting():  # whether the server restarts, and why (the dry run's preview)
        changed = [f.dest for f in service_files(plan) if _differs(f)]
        if plan.config_text is None and managed.state(CONFIG_PATH).kind != "absent":
            changed.append(CONFIG_PATH)
        planned.restart("server", restart_reason(changed, steps, unit.stale))
    if before_restart is not None and "restart" in steps and live:
        before_restart()
    managed.directory(name=f"{CONFIG_DIR} (root, readable by {plan.group} only)",
                      path=CONFIG_DIR, user="root", group=plan.group, mode="750")
    if plan.config_text is None and managed.state(CONFIG_PATH).kind != "absent":
        # nothing else creates it: decided now, from the prefetched state
        managed.absent(name=f"no --config file {CONFIG_PATH} (no API key)", path=CONFIG_PATH)
    managed.directory(name=f"{plan.bin_dir} (gpuserve host scripts)", path=plan.bin_dir,
                      user="root", group="root", mode="755")
    for item in service_files(plan):
        managed.secret(name=item.name, dest=item.dest, contents=item.contents,
                       user=item.user, group=item.group, mode=item.mode)
    if steps:
        managed.systemctl(name=f"activate {UNIT_NAME}: {', '.join(steps)}", unit=UNIT_NAME,
                          steps=tuple(steps))
    return steps


def activation_steps(live: LiveUnit, files_changed: bool, unit_changed: bool) -> list[str]:
    """What to run, in order, so the server runs the files as they are now.

    Decided at prepare time from the state read before any change (the file operations
    above run only when their file differs, so "an operation exists" is "it changes").
    ``daemon-reload`` when the unit file changed or systemd still has an older one;
    ``reset-failed`` when the unit failed, or when anything changed while it is live
    (every start counts towards StartLimitBurst, so a few redeploys in an hour or a
    fixed profile after a crash loop would be refused with "Start request repeated too
    quickly"); ``restart`` when a running server must pick up changed files (or runs an
    older configuration than its files: :class:`roles.base.managed.UnitState`), and also when
    files changed while it was not running: a start queued at boot (the unit waits for
    network-online.target) may run the old files after they were read and before they
    are rewritten, and ``start`` would leave that server running, ``restart`` replaces
    it; else ``start`` when it is not running; ``enable`` when it is not enabled."""
    steps = []
    if unit_changed or live.need_reload:
        steps.append("daemon-reload")
    if live.active == "failed" or ((files_changed or live.stale) and live.active in LIVE_STATES):
        steps.append("reset-failed")
    if live.active in LIVE_STATES:
        if files_changed or live.stale:
            steps.append("restart")
    else:
        steps.append("restart" if files_changed else "start")
    if live.enabled != "enabled":
        steps.append("enable")
    return steps
