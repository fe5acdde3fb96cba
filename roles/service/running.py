"""The host's record of what it runs (gpuserve/serve/running.py): written after a passing
gate, read by the deploys and the read-only runs.

Why a role: the serve deploy writes it as its last step (only a configuration that
passed its health gate and smoke is recorded, so a rolled-back deploy leaves the record
of the configuration it rolled back to), and says at its top when it switches profiles.
"""

from __future__ import annotations

import shlex

from pyinfra import host, inventory, logger, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents

from gpuserve.measure.results import utc_now
from gpuserve.roles.base.prefetch import Read, fact, fact_if_unchanged
from gpuserve.serve.running import (
    RUNNING_PATH,
    Running,
    parse_running,
    record_text,
    same_launch,
    switch_note,
)


def reads() -> list[Read]:
    """The record, for the deploy's first batch."""
    return [Read.of(FileContents, path=RUNNING_PATH)]


def read_running() -> Running | None:
    """The host's record, from the prefetch (or read now)."""
    return parse_running(fact(FileContents, path=RUNNING_PATH))


def note_switch(planned: str) -> None:
    """Log, before any change, that this deploy switches the host's profile: from
    ``--data profile=`` (and that a plain deploy would switch back), or back to the
    inventory's (and how to keep the running one)."""
    overrides = inventory.get_override_data() or {}
    overridden = "profile" in overrides
    own = _inventory_profile() if overridden else planned
    line = switch_note(host.name, read_running(), planned, own, overridden)
    if line:
        logger.warning(line)


def _inventory_profile() -> str | None:
    """Host data ``profile`` without ``--data``: the host's, its groups', the inventory's."""
    for layer in (inventory.get_host_data(host.name), inventory.get_groups_data(host.groups),
                  inventory.get_data()):
        value = layer.get("profile") if isinstance(layer, dict) else None
        if value:
            return str(value)
    return None


def launch_of(plan) -> str | None:
    """The launch hash the records carry (None with recording off)."""
    return plan.record.launch_hash if plan.record is not None else None


@operation(is_idempotent=True)
def record_running(profile: str, launch: str | None):
    """After a passing gate: write what the host runs (profile, launch hash, since now)
    unless the record names this profile and launch already (then its ``since`` stays)."""
    if not state.is_executing:
        return
    if same_launch(parse_running(fact_if_unchanged(FileContents, path=RUNNING_PATH)),
                   profile, launch):
        host.noop(f"{RUNNING_PATH} names {profile} already")
        return
    text = record_text(Running(profile, launch, utc_now()))
    path = shlex.quote(RUNNING_PATH)
    yield StringCommand("sh", "-c", QuoteString(
        f"umask 022 && printf '%s' {shlex.quote(text)} > {path}.tmp && "
        f"chmod 0644 {path}.tmp && mv -f {path}.tmp {path}"))
