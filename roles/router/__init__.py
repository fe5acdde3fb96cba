"""SGLang's gateway (``smg``) on a router host: locked venv, unit, manifest, key, check.

Why the SGLang server's shape: a service account of its own, a venv from a hash-checked
lock, the API key handed over by systemd from a root-only file, a manifest rewrite
instead of a restart when the workers change, and a check that runs no command when it
passes, so the gateway installs, verifies and reruns like the server.

How: docs/fleet.md, "gpuserve.roles.router: install, configure, check"
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host, logger, state
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.operations import server

from gpuserve.errors import InputError
from gpuserve.facts.host import InstallTarget
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.plans.router import (
    CONFIG_DIR,
    KEY_PATH,
    LAUNCHER,
    MANIFEST_PATH,
    PROBE,
    UNIT_NAME,
    UNIT_PATH,
    RouterPlan,
    manifest_text,
    render_unit,
)
from gpuserve.preview import lock_install, restart_reason
from gpuserve.roles import sglang as sglang_role
from gpuserve.roles.base import interpreter as interpreter_role
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.inventory import inventory_source
from gpuserve.roles.base.prefetch import Read, fact
from gpuserve.roles.service import activation_steps
from gpuserve.roles.sglang import NOLOGIN, ServiceAccount, VenvVerified, locked_venv
from gpuserve.serve.install import pip_args

__all__ = ["check_router", "configure_router", "install_router", "plan_reads",
           "reads"]

#: Files whose change the running gateway must be restarted for (not the manifest).
RESTART_FILES = (UNIT_PATH, KEY_PATH)


def plan_reads(home: str, user: str) -> list[Read]:
    """What the plan reads from the host before any change (python3, glibc, the
    account; the interpreter choice's reads are roles/base/interpreter.prepare_reads)."""
    return [Read.of(InstallTarget, path=home), Read.of(ServiceAccount, user=user)]


def directories(plan: RouterPlan) -> tuple[tuple[str, str, str, str], ...]:
    """(path, owner, group, mode) of every directory the role manages."""
    home = plan.home
    return ((home, "root", "root", "755"), (f"{home}/venvs", "root", "root", "755"),
            (f"{home}/locks", "root", "root", "755"), (plan.bin_dir, "root", "root", "755"),
            (plan.state_dir, plan.user, plan.user, "750"),
            (CONFIG_DIR, "root", plan.user, "750"))


def reads(plan: RouterPlan) -> list[Read]:
    """Every path and state the role reads, for the deploy's prefetch."""
    paths = [p for p, *_ in directories(plan)] + [
        plan.requirements, f"{plan.bin_dir}/{LAUNCHER}", f"{plan.bin_dir}/{PROBE}",
        MANIFEST_PATH, KEY_PATH, UNIT_PATH]
    return [*(managed.read(p) for p in paths), Read.of(VenvVerified, venv=plan.venv),
            managed.read_unit(UNIT_NAME, (*RESTART_FILES, f"{plan.bin_dir}/{LAUNCHER}")),
            *interpreter_role.reads(plan.interpreter)]


class RouterVenvReport(FactBase):
    """smg's version as the venv's Python sees it, run as the service user."""

    def command(self, venv: str, user: str, home: str) -> str:
        q = shlex.quote
        code = ("import importlib.metadata as m, smg.smg_rs as r; "
                "print(m.version('smg')); print(r.get_version_string())")
        return (f"cd / && runuser -u {q(user)} -- env HOME={q(home)} PYTHONSAFEPATH=1 "
                f"{q(venv + '/bin/python')} -c {q(code)} 2>&1 || true")

    def process(self, output: list[str]) -> list[str]:
        return list(output)


@operation(is_idempotent=True)
def verify_router_venv(venv: str, version: str, lock_hash: str, lock_name: str, user: str,
                       home: str):
    """smg must import as the service user and be the lock's version; then the venv
    is stamped (a venv without the stamp is rebuilt, never served)."""
    if not state.is_executing:
        return
    if host.get_fact(VenvVerified, venv=venv) == lock_hash:
        host.noop(f"{venv} is verified")
        return
    lines = host.get_fact(RouterVenvReport, venv=venv, user=user, home=home) or []
    if not lines or lines[0].strip() != version:
        yield StringCommand("rm", "-rf", QuoteString(venv))
        yield fail_host(f"venv: {venv} failed verification against lock {lock_name} (smg "
                        f"{version} expected); it was removed and the gateway was not "
                        "changed:", [line[:200] for line in lines[-8:]])
        return
    logger.info(f"{host.name}: router venv: verified smg {version} ({lines[-1].strip()[:80]})")
    stamp = f"{lock_hash}\n{lock_name}\nsmg {version}\n"
    yield StringCommand("sh", "-c", QuoteString(
        f"printf %s {shlex.quote(stamp)} > {shlex.quote(venv + '/' + sglang_role.STAMP)}"))


@deploy("Install SGLang's gateway (smg)")
def install_router(plan: RouterPlan) -> None:
    assert plan.lock is not None
    account = fact(ServiceAccount, user=plan.user)
    try:
        sglang_role.check_account(account["entry"], account["group_exists"], plan.user,
                                  inventory_source())
    except InputError as exc:
        raise InputError(exc.file, "router_user",
                         exc.message.replace("sglang_user", "router_user")) from None
    if not sglang_role.account_is_ours(account["entry"], account["group_exists"], plan.user,
                                       plan.home):
        planned.action(f"make the service account {plan.user} (system user and group)")
        server.group(name=f"Service group {plan.user}", group=plan.user, system=True)
        server.user(name=f"Service user {plan.user}", user=plan.user, group=plan.user,
                    home=plan.state_dir, shell=NOLOGIN, system=True, create_home=False,
                    ensure_home=False, comment=sglang_role.ACCOUNT_MARK)
    for path, owner, group, mode in directories(plan):
        managed.directory(name=f"{path} ({owner}:{group}, {mode})", path=path, user=owner,
                          group=group, mode=mode)
    interpreter_role.install_interpreter(plan.interpreter, "the gateway's venv")
    managed.put(name=f"lock {plan.lock.name} ({len(plan.lock.packages)} hashed wheels)",
                text=plan.lock.requirements_text(), dest=plan.requirements, user="root",
                group="root", mode="644")
    if fact(VenvVerified, venv=plan.venv) != plan.lock.hash:
        lock = plan.lock
        planned.action(f"install the venv {plan.venv} and verify it against the lock as "
                       f"{plan.user}", would="install " + lock_install(
                           lock.name, "smg", lock.version, len(lock.packages),
                           lock.download_bytes, plan.venv))
        locked_venv(name=f"venv {plan.venv} from lock {plan.lock.name}", venv=plan.venv,
                    lock=plan.lock, requirements=plan.requirements,
                    pip_options=pip_args(plan.index_url, plan.find_links,
                                                     inventory_source(), plan.trusted),
                    python=plan.python)
        verify_router_venv(name=f"verify {plan.venv} as {plan.user}", venv=plan.venv,
                           version=plan.lock.version, lock_hash=plan.lock.hash,
                           lock_name=plan.lock.name, user=plan.user, home=plan.state_dir)


@deploy("Configure SGLang's gateway (smg)")
def configure_router(plan: RouterPlan) -> None:
    served = ", ".join(f"{w.host} {w.url}" for w in plan.served) or "none"
    manifest = managed.put(name=f"worker manifest {MANIFEST_PATH}: {served}",
                           text=manifest_text(plan.workers), dest=MANIFEST_PATH, user="root",
                           group=plan.user, mode="640")
    key = managed.secret(name=f"API key {KEY_PATH} (0600 root, LoadCredential)", dest=KEY_PATH,
                         contents=lambda: plan.api_key + "\n", user="root", group="root",
                         mode="600")
    launcher = managed.put(name=f"launcher {plan.bin_dir}/{LAUNCHER}",
                           src=str(SCRIPTS_DIR / LAUNCHER), dest=f"{plan.bin_dir}/{LAUNCHER}",
                           user="root", group="root", mode="755")
    managed.put(name=f"probe {plan.bin_dir}/{PROBE}", src=str(SCRIPTS_DIR / PROBE),
                dest=f"{plan.bin_dir}/{PROBE}", user="root", group="root", mode="755")
    unit = managed.put(name=f"systemd unit {UNIT_PATH}", text=render_unit(plan), dest=UNIT_PATH,
                       user="root", group="root", mode="644")
    del manifest  # smg rereads it itself: a changed worker list needs no restart
    live = managed.unit_state(UNIT_NAME, (*RESTART_FILES, f"{plan.bin_dir}/{LAUNCHER}"))
    restart_files = [path for path, op in ((UNIT_PATH, unit), (KEY_PATH, key),
                                           (f"{plan.bin_dir}/{LAUNCHER}", launcher))
                     if op is not None]
    steps = activation_steps(live, files_changed=bool(restart_files),
                             unit_changed=unit is not None)
    planned.restart("gateway", restart_reason(restart_files, steps, live.stale, "gateway"))
    if steps:
        managed.systemctl(name=f"activate {UNIT_NAME}: {', '.join(steps)}", unit=UNIT_NAME,
                          steps=tuple(steps))


class RouterProbe(FactBase):
    """smg_probe.py's JSON line (liveness, then the workers' states)."""

    def command(self, script: str, port: int, expect: int, live_timeout: float,
                ready_timeout: float) -> str:
        return (f"python3 {shlex.quote(script)} --port {int(port)} --key-file {KEY_PATH} "
                f"--expect {int(expect)} --live-timeout {live_timeout} "
                f"--ready-timeout {ready_timeout} 2>&1 || true")

    def process(self, output: list[str]) -> list[str]:
        return list(output)


class Journal(FactBase):
    def command(self, unit: str, lines: int) -> str:
        return f"journalctl -u {shlex.quote(unit)} -n {int(lines)} --no-pager -o cat 2>&1 || true"

    def process(self, output: list[str]) -> list[str]:
        return list(output)


@operation(is_idempotent=True)
def check_router(plan: RouterPlan, live_timeout: float = 90.0):
    """Wait for the gateway and its workers on the host; yield nothing when it passes."""
    if not state.is_executing:
        return
    expect = len(plan.served)
    lines = host.get_fact(RouterProbe, script=f"{plan.bin_dir}/{PROBE}", port=plan.port,
                          expect=expect, live_timeout=live_timeout,
                          ready_timeout=plan.ready_timeout if expect else 0)
    try:
        result = json.loads((lines or [""])[-1])
    except ValueError:
        result = {"live": False, "error": " ".join(lines or [])[-300:], "workers": []}
    if not result.get("live"):
        journal = host.get_fact(Journal, unit=UNIT_NAME, lines=15) or []
        yield fail_host(f"router: {UNIT_NAME} is not answering GET /liveness on port "
                        f"{plan.port} after {live_timeout:.0f} s ({result.get('error')}); "
                        "last journal lines:", [line[:300] for line in journal])
        return
    workers = result.get("workers") or []
    ready = [w for w in workers if w.get("status") == "ready"]
    states = ", ".join(f"{w.get('url')} {w.get('status')}" for w in workers) or "no workers"
    if result.get("error"):
        yield fail_host(f"router: GET /workers failed: {result['error']}", [])
        return
    if len(ready) == expect and len(workers) == expect:
        logger.info(f"{host.name}: router: {len(ready)}/{expect} workers ready on "
                    f"{plan.listen}:{plan.port} ({states}; {result.get('waited')} s)")
        host.noop(f"gateway answers with {len(ready)}/{expect} workers ready")
        return
    if expect == 0:
        logger.warning(f"{host.name}: router: no worker in the manifest; smg drains the "
                       f"ones it had ({states})")
    else:
        logger.warning(f"{host.name}: router: {len(ready)}/{expect} workers ready after "
                       f"{result.get('waited')} s ({states}); smg keeps retrying a worker "
                       "that is not up yet (router_worker_startup_timeout)")
    host.noop("gateway answers; not every worker is ready yet")
