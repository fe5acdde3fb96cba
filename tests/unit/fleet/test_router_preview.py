"""The gateway deploy's preview under ``--dry --diff`` (roles/base/preview.py from what
roles/router notes: roles/base/planned.py), prepared on pyinfra's @fake host: a first install
lists the lock's venv and the files with the key redacted, a changed key restarts the
gateway with its value never shown, and a host that already runs the plan shows nothing."""

from __future__ import annotations

import logging

from pyinfra.api import Config, Inventory, State, deploy
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy

from gpuserve.paths import SCRIPTS_DIR
from gpuserve.plans.router import (
    KEY_PATH,
    LAUNCHER,
    MANIFEST_PATH,
    UNIT_NAME,
    UNIT_PATH,
    render_unit,
)
from gpuserve.roles.base.managed import sha1
from gpuserve.roles.base.preview import print_planned_preview
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.router import configure_router, install_router
from gpuserve.roles.sglang import ACCOUNT_MARK, NOLOGIN
from tests.unit.fleet.test_router_plan import KEY, plan

OLD_KEY = "router-key-old-fedcba9876543210"


def account(p) -> dict:
    """@fake's answer for the gateway's service account, as the deploy makes it."""
    return {f"getent passwd {p.user}": [
        f"passwd={p.user}:x:998:998:{ACCOUNT_MARK}:{p.state_dir}:{NOLOGIN}",
        f"group={p.user}:x:998:", f"primary={p.user}"]}


def preview(router_plan, responses: dict, caplog, dry: bool = True) -> list[str]:
    """The preview lines of the gateway's install and configure steps on @fake/gw
    (``dry`` False: a real run's prepare, which notes nothing)."""
    answers = {**responses, **account(router_plan), "uname -s": ["Linux"]}
    inv = Inventory((["@fake/gw"], {"fake_responses": answers,
                                    "fake_delay": 0,
                                    "fake_delay_jitter": 0}))
    state = State(inv, Config())
    connect_all(state)
    run = run_context(state)
    run.dry = run.diff = dry

    @deploy("gateway")
    def gateway() -> None:
        install_router(plan=router_plan)
        configure_router(plan=router_plan)
        if dry:
            print_planned_preview(with_diff=True, secrets=[router_plan.api_key])

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        add_deploy(state, gateway)
    logged = [r.getMessage() for r in caplog.records]
    if not dry:
        assert run.host("@fake/gw").planned is None  # nothing noted, nothing printed
        return [line for line in logged if ": preview: " in line]
    first = next(i for i, line in enumerate(logged) if ": preview: " in line)
    return logged[first:]  # the preview's lines and its diffs' lines


def test_a_first_install_lists_the_venv_and_the_files_with_the_key_redacted(caplog) -> None:
    p = plan(python="3.11", glibc="2.36")
    lines = preview(p, {}, caplog)
    text = "\n".join(lines)
    assert lines[0] == "@fake/gw: preview: changes (nothing on the host was changed)"
    assert (f"@fake/gw: preview: would install lock {p.lock.name}: smg {p.lock.version}, "
            f"{len(p.lock.packages)} packages") in text
    assert f"@fake/gw: preview: diff of {UNIT_PATH}:" in text
    assert f"@fake/gw: preview: diff of {MANIFEST_PATH}:" in text
    assert "+<redacted>" in text and KEY not in text
    assert f"@fake/gw: preview: gateway: restart: {UNIT_PATH}, {KEY_PATH}" in text
    assert f"@fake/gw: preview: operation: systemctl daemon-reload, restart, enable {UNIT_NAME}" \
        in text


def live_gateway(p, key: str) -> dict:
    """@fake answers of a host whose gateway runs ``p`` with ``key`` in its key file."""
    launcher = (SCRIPTS_DIR / LAUNCHER).read_text()
    files = {UNIT_PATH: ("644", "root", "root", render_unit(p)),
             KEY_PATH: ("600", "root", "root", key + "\n"),
             f"{p.bin_dir}/{LAUNCHER}": ("755", "root", "root", launcher)}
    stats = {f"-- {path} ": [f"stat {mode} {user} {group} regular file|{path}",
                             f"{sha1(text)}  {path}"]
             for path, (mode, user, group, text) in files.items()}
    return {"ActiveState": ["ActiveState=active", "UnitFileState=enabled",
                            "NeedDaemonReload=no"], f"cat {KEY_PATH}": [key], **stats}


def test_a_changed_key_restarts_the_gateway_and_never_shows_either_value(caplog) -> None:
    p = plan(python="3.11", glibc="2.36")
    lines = preview(p, live_gateway(p, OLD_KEY), caplog)
    text = "\n".join(lines)
    assert f"@fake/gw: preview: diff of {KEY_PATH}:" in text
    assert "-<redacted> (live)" in text and "+<redacted>" in text
    assert KEY not in text and OLD_KEY not in text
    assert f"diff of {UNIT_PATH}:" not in text
    assert f"@fake/gw: preview: gateway: restart: {KEY_PATH} would change" in text


def test_a_real_run_notes_nothing(caplog) -> None:
    assert preview(plan(python="3.11", glibc="2.36"), {}, caplog, dry=False) == []
