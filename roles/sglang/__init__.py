"""Install SGLang from a lock into an immutable, verified venv for a dedicated service user.

Why: one venv per lock, installed hash-checked, verified as the service user and only
then stamped, owned by root and only read by the service, so a unit and its venv switch
and roll back together, an interrupted install is never served, and a compromised server
cannot rewrite its own code.

How: docs/sglang-versions.md, "gpuserve.roles.sglang: install, verify, activate"
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pyinfra import host, logger, state
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.operations import server

from gpuserve.errors import InputError
from gpuserve.launch.install_progress import UV_LINES, uv_progress
from gpuserve.launch.interpreter import InterpreterChoice
from gpuserve.launch.lock_choice import public_version
from gpuserve.launch.locks import Lock
from gpuserve.launch.venvs import (
    STAMP,
    listing_command,
    parse_listing,
    referenced_venvs,
    requirements_path,
    venv_path,
    venvs_to_prune,
)
from gpuserve.launch.verify import judge
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.preview import lock_install
from gpuserve.roles.base import managed, planned, progress
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.interpreter import install_interpreter
from gpuserve.roles.base.inventory import inventory_source
from gpuserve.roles.base.prefetch import Read, fact, fact_if_unchanged
from gpuserve.serve import uv
from gpuserve.serve.install import (
    PIP_CONFIG,
    bin_dir,
    pip_args,
    pip_config_text,
    state_dir,
    validate_pip_urls,
)

__all__ = ["account_is_ours", "ACCOUNT_MARK", "account_reads", "check_account", "clear_leftovers",
           "directories", "ere_literal", "install_sglang", "LEGACY_MARKS", "locked_venv",
           "NOLOGIN", "parse_account", "prune_reads", "prune_venvs", "PruneState", "reads",
           "ServiceAccount", "VenvReport", "VenvVerified", "VERIFY", "verify_venv"]

VERIFY = "sglang_verify.py"
#: The GECOS comment of every account gpuserve creates: the mark that lets a later deploy
#: tell its own service account from one it must never touch.
ACCOUNT_MARK = "gpuserve service account"
#: The longest a venv install may run before the host fails (a stuck mirror).
INSTALL_TIMEOUT_S = 6 * 3600
#: The comment earlier gpuserve versions gave the account (accepted, and rewritten).
LEGACY_MARKS = ("gpuserve SGLang server",)


def check_account(existing: dict | None, group_exists: bool, user: str, source: str) -> None:
    """Refuse an existing account or group gpuserve did not create, before any change.

    ``existing``: the account's /etc/passwd entry keyed as pyinfra's ``Users`` fact keys
    it (uid, comment, home, shell, group; :class:`ServiceAccount`), None when absent;
    ``group_exists``: whether a group of that name exists.

    Why: ``server.user`` would otherwise take over whatever account has that name (its
    home, shell and groups changed; root's SSH login locked) and run the server as it.
    gpuserve's own accounts carry :data:`ACCOUNT_MARK` (or an earlier version's comment)
    in the GECOS field; an existing group without that user (``sudo``, ``docker``,
    ``shadow`` ...) would hand its privileges to the new account.
    """
    if existing is not None:
        uid = str(existing.get("uid"))
        gecos = existing.get("comment") or ""
        if uid == "0":
            raise InputError(source, "sglang_user", f"{user} has UID 0 on this host (a root "
                             "account): the server must not run as root; leave sglang_user "
                             "unset (sglang) or name an account that does not exist yet")
        if gecos.split(",")[0] not in (ACCOUNT_MARK, *LEGACY_MARKS):
            raise InputError(source, "sglang_user", f"{user} already exists on this host and "
                             f"gpuserve did not create it (its comment is {gecos!r:.60}, not "
                             f"{ACCOUNT_MARK!r}); gpuserve never modifies an existing account: "
                             "name an account that does not exist yet, which gpuserve "
                             "creates, or remove that one if it is a leftover")
    elif group_exists:
        raise InputError(source, "sglang_user", f"a group named {user} already exists on "
                         "this host but no such user: the new account would join it and "
                         "gain its privileges; name an account that does not exist yet, or "
                         f"remove the group (groupdel {user}) if an interrupted deploy "
                         "left it")


class ServiceAccount(FactBase):
    """``user``'s /etc/passwd entry (as pyinfra's ``Users`` fact keys it: uid, comment,
    home, shell, group) or None, and whether a group of that name exists.

    Why not ``Users``: it runs ``lastlog`` and ``groups`` for every account on the host
    (17 s on the lab host under TCG); a deploy needs one account."""

    @staticmethod
    def default() -> dict:
        return {"entry": None, "group_exists": False}

    def command(self, user: str) -> str:
        q = shlex.quote(user)
        # read builtins, not head and sed: four processes fewer in every first batch
        return (f"getent passwd {q} | {{ IFS= read -r l && printf 'passwd=%s\\n' \"$l\"; }}; "
                f"getent group {q} | {{ IFS= read -r l && printf 'group=%s\\n' \"$l\"; }}; "
                f"g=$(id -gn {q} 2>/dev/null) && echo \"primary=$g\"; true")

    def process(self, output: list[str]) -> dict:
        return parse_account(output)


def parse_account(lines: list[str]) -> dict:
    """The lines of :class:`ServiceAccount` (``passwd=``, ``group=``, ``primary=``)."""
    values = dict(line.partition("=")[::2] for line in lines if "=" in line)
    entry = None
    fields = values.get("passwd", "").split(":")
    if len(fields) == 7:
        entry = {"uid": fields[2], "comment": fields[4], "home": fields[5],
                 "shell": fields[6], "group": values.get("primary")}
    return {"entry": entry, "group_exists": bool(values.get("group"))}


class VenvVerified(FactBase):
    """The verification stamp's first line (the lock hash) when the venv is finished."""

    def command(self, venv: str) -> str:
        return f"cat {shlex.quote(f'{venv}/{STAMP}')} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output and output[0].strip() else None

    @staticmethod
    def group_command(kwargs_list: list[dict]) -> str:
        """Every venv's first stamp line as ``<index> <line>``, with shell builtins only
        (the deploy reads the venvs of every candidate lock in its first batch)."""
        stamps = [shlex.quote(f"{k['venv']}/{STAMP}") for k in kwargs_list]
        return "; ".join(f'_v=; {{ read -r _v < {stamp}; }} 2>/dev/null; echo "{i} $_v"'
                         for i, stamp in enumerate(stamps)) + "; true"

    @staticmethod
    def group_process(kwargs_list: list[dict], output: list[str]) -> list[str | None]:
        found: dict[int, str] = {}
        for line in output:
            index, _, value = line.partition(" ")
            if index.isdigit() and value.strip():
                found[int(index)] = value.strip()
        return [found.get(i) for i in range(len(kwargs_list))]


class VenvReport(FactBase):
    """The verification script's output, run as the service user (never as root)."""

    def command(self, venv: str, user: str, script: str, home: str) -> str:
        q = shlex.quote
        return (f"cd {q(home)} && runuser -u {q(user)} -- env HOME={q(home)} "
                f"{q(f'{venv}/bin/python')} {q(script)} 2>&1 || true")

    def process(self, output: list[str]) -> list[str]:
        return list(output)


class PruneState(FactBase):
    """What :func:`prune_venvs` decides from, in one command: the ``ExecStart`` lines of
    the given unit files (absent files: none), then ``MTIME VERIFIED PATH`` per venv
    under ``<home>/venvs``. The two kinds of line cannot be mistaken for each other."""

    def command(self, home: str, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        # -a: a unit file with a stray NUL is still text (grep would print "Binary file
        # ... matches" instead of the line); systemd also accepts "ExecStart =" indented
        return (f"grep -ah '^[[:space:]]*ExecStart[[:space:]]*=' {quoted} 2>/dev/null "
                f"</dev/null; {listing_command(home)}")

    @staticmethod
    def default() -> dict[str, list[str]]:
        return {"units": [], "listing": []}  # no output: no unit, no venv

    def process(self, output: list[str]) -> dict[str, list[str]]:
        units = [line for line in output if line.lstrip().startswith("ExecStart")]
        return {"units": units, "listing": [line for line in output if line not in units]}


@operation()
def locked_venv(venv: str, lock: Lock, requirements: str, pip_options: list[str],
                pip_config: Callable[[], str] | None = None, pip_config_path: str = "",
                python: str = "python3"):
    """Build the lock's venv unless a verified one is there (then: no command).

    ``pip_config`` (a function, so that pyinfra's operation arguments never hold the
    text) returns the pip config file with the mirror credentials; it is written from
    stdin to ``pip_config_path`` (0600 root), with uv's equivalent beside it, for the
    install and both are removed after it, whatever its exit status."""
    if host.get_fact(VenvVerified, venv=venv) == lock.hash:
        host.noop(f"{venv} is verified for lock {lock.name}")
        return
    if pip_config is not None:
        yield managed.write_secret_command(pip_config_path, pip_config())
        yield managed.write_secret_command(uv_config_path(pip_config_path) or "",
                                           uv.uv_config_text(pip_config()))
    steps = build_steps(venv, requirements, pip_options,
                        pip_config_path if pip_config is not None else None, python)
    # detached, polled with a progress line every 10 s (roles/base/progress.py); an unstamped
    # venv is an interrupted or failed install: start it again from nothing
    run_dir = progress.fresh_dir(f"venv-{venv.rsplit('/', 1)[-1]}")
    yield progress.start_command(run_dir, "\n".join(steps), before=clear_leftovers(venv))
    if not state.is_executing:
        return
    job = progress.wait(run_dir, UV_LINES, lambda lines, s: uv_progress(lines, lock, s),
                        label=f"venv {venv.rsplit('/', 1)[-1]}", timeout=INSTALL_TIMEOUT_S)
    if job.rc != 0:
        yield fail_host(f"venv: building {venv} from lock {lock.name} failed "
                        f"({job.outcome(INSTALL_TIMEOUT_S)}); the "
                        "service was not changed:", job.tail)
        return
    yield StringCommand("rm", "-rf", QuoteString(run_dir))


def build_steps(venv: str, requirements: str, pip_options: list[str],
                pip_config_path: str | None = None, python: str = "python3") -> list[str]:
    """The install's shell steps: the credentials files removed at exit whatever the
    status, the pinned uv (gpuserve/serve/uv.py), the venv and uv's hash-checked install
    of the lock without resolving, ``uv pip check``."""
    q = shlex.quote
    # A step that fails (a full disk, a bad hash, a broken set) removes the venv at once:
    # half a venv is never served anyway, and on a full disk it would keep the space the
    # next attempt needs. Only an interrupted deploy leaves one, rebuilt by the next run.
    # The space left is measured before the removal: a venv tool hides the
    # "No space left on device" behind "returned non-zero exit status 1".
    parent = q(venv.rsplit("/", 1)[0])
    failed = (f"{{ free=$(df -Pm {parent} | tail -n 1 | tr -s ' ' | cut -d ' ' -f 4); "
              f'rm -rf {q(venv)}; echo "gpuserve: building {venv} failed (exit $status, '
              '${free:-?} MiB free on its filesystem); the unfinished venv was removed" >&2; '
              "exit $status; }")
    pin = uv.pin()
    uv_config = uv_config_path(pip_config_path)
    steps = [uv.bootstrap_step(venv, python, pip_options, pin.version, pin.requirement(),
                               pip_config_path),
             *uv.install_steps(venv, python, requirements, pip_options, pin.version,
                               uv_config)]
    trap = ([f"trap {q('rm -f -- ' + q(pip_config_path) + ' ' + q(uv_config))} EXIT"]
            if pip_config_path and uv_config else [])
    return trap + [f"{step} || {{ status=$?; {failed}; }}" for step in steps]


def uv_config_path(pip_config_path: str | None) -> str | None:
    """uv's credentials file beside pip's (``<pip's>.uv.toml``); None without one."""
    return f"{pip_config_path}.uv.toml" if pip_config_path else None


def ere_literal(text: str) -> str:
    """``text`` as a POSIX extended regex matching only itself: each special character
    in brackets (``.`` -> ``[.]``), so the pattern's own text never matches it either."""
    return "".join(f"[{c}]" if c in ".+*?()[]{}|^$\\" else c for c in text)


def clear_leftovers(venv: str) -> str:
    """Shell that stops what still builds ``venv`` and removes it, then ``&&``.

    Why: a deploy cut off mid-build (an SSH drop) leaves ``uv venv`` or ``uv pip``
    (``--python <venv>/bin/python``) running on the host (no pty, so no SIGHUP), still
    writing into the directory; the rerun's ``rm -rf`` then fails ("Directory not
    empty") or, worse, the old process writes into the new venv. The patterns are
    bracketed literals, and the shell running them (whose text holds the plain path)
    and its parent are skipped."""
    q = shlex.quote
    pattern = ere_literal(venv)
    # this very shell (and its parent) holds the plain path too: never itself
    return (f"if command -v pgrep >/dev/null 2>&1; then "
            f"for p in $(pgrep -f -- {q('venv ' + pattern)}; "
            f"pgrep -f -- {q(pattern + '/bin/p')}); do "
            f"[ \"$p\" = \"$$\" ] || [ \"$p\" = \"$PPID\" ] || kill \"$p\" 2>/dev/null; done; "
            f"fi; for i in 1 2 3 4 5; do rm -rf {q(venv)} 2>/dev/null && break; sleep 1; "
            f"done; [ ! -e {q(venv)} ] && ")


@operation(is_idempotent=True)
def verify_venv(venv: str, lock: Lock, user: str, script: str, user_home: str,
                expect_gpus: int):
    """Run the verification as the service user; stamp the venv only when it passes.

    A failure removes the unfinished venv and fails the host before the unit changes."""
    if not state.is_executing:
        return
    if host.get_fact(VenvVerified, venv=venv) == lock.hash:
        host.noop(f"{venv} is verified")
        return
    result = judge(host.get_fact(VenvReport, venv=venv, user=user, script=script,
                                 home=user_home), lock,
                   expect_gpus)
    if not result.ok:
        yield StringCommand("rm", "-rf", QuoteString(venv))
        yield fail_host(f"venv: {venv} failed verification against lock {lock.name} "
                    f"({result.summary}); it was removed and the service was not changed:",
                    list(result.problems))
        return
    logger.info(f"{host.name}: venv: verified {result.summary}")
    stamp = f"{lock.hash}\n{lock.name}\n{result.summary}\n"
    yield StringCommand("sh", "-c", QuoteString(
        f"printf %s {shlex.quote(stamp)} > {shlex.quote(f'{venv}/{STAMP}')}"))


@operation(is_idempotent=True)
def prune_venvs(home: str, keep: int, unit_paths: tuple[str, ...]):
    """Delete venvs beyond the ``keep`` newest verified ones; never one a unit names."""
    if not state.is_executing:
        return
    # after a change, one fresh read (not one per kind of line: a switch)
    seen = fact_if_unchanged(PruneState, home=home, paths=unit_paths)
    doomed = venvs_to_prune(parse_listing(seen["listing"], home),
                            referenced_venvs(seen["units"], home), keep)
    if not doomed:
        host.noop(f"no venvs to prune (keeping {keep} and those the units name)")
        return
    for path in doomed:
        logger.info(f"{host.name}: venv: pruning {path}")
        yield StringCommand("rm", "-rf", QuoteString(path))


def directories(user: str, home: str) -> tuple[tuple[str, str, str], ...]:
    """(path, owner, mode) of every directory :func:`install_sglang` manages."""
    return ((home, "root", "755"), (f"{home}/venvs", "root", "755"),
            (f"{home}/locks", "root", "755"), (bin_dir(home), "root", "755"),
            (state_dir(home), user, "750"))


def account_reads(user: str) -> list[Read]:
    """What :func:`install_sglang` reads about accounts and packages (deploy prefetch)."""
    return [Read.of(ServiceAccount, user=user), managed.read_package("python3-venv")]


def reads(user: str, home: str, lock: Lock, interpreters: tuple[str, ...] = ()
          ) -> list[Read]:
    """Every path and stamp :func:`install_sglang` reads, for the deploy's prefetch (the
    venv of python3 and of each of ``interpreters``, the paths a choice may name)."""
    return [*(managed.read(path) for path, _, _ in directories(user, home)),
            managed.read(requirements_path(home, lock)), managed.read(f"{home}/bin/{VERIFY}"),
            *(Read.of(VenvVerified, venv=venv_path(home, lock, python))
              for python in ("python3", *interpreters))]


def account_is_ours(entry: dict | None, group_exists: bool, user: str, home: str) -> bool:
    """Whether the account already is exactly what ``server.group``/``server.user``
    below would make (then neither runs: each reads /etc/passwd and /etc/group again)."""
    return bool(group_exists and entry and entry.get("group") == user
                and entry.get("home") == state_dir(home)
                and entry.get("shell") == NOLOGIN
                and (entry.get("comment") or "").split(",")[0] == ACCOUNT_MARK)


NOLOGIN = "/usr/sbin/nologin"


@deploy("Install SGLang")
def install_sglang(user: str, home: str, lock: Lock, index_url: str | None = None,
                   find_links: str | None = None, expect_gpus: int = 0,
                   interpreter: InterpreterChoice | None = None,
                   trusted: tuple[str, ...] = ()) -> str:
    """Service account, the lock's verified venv; returns the venv's path.

    Reads come from the deploy's prefetch where it has them (roles/base/prefetch.py); every
    item that already matches adds no operation (roles/base/managed.py)."""
    account = fact(ServiceAccount, user=user)
    # read before any change: an existing account gpuserve did not create is refused
    check_account(account["entry"], account["group_exists"], user, inventory_source())
    if not account_is_ours(account["entry"], account["group_exists"], user, home):
        planned.action(f"make the service account {user} (system user and group)")
        server.group(name=f"Service group {user}", group=user, system=True)
        server.user(
            name=f"Service user {user}",
            user=user,
            group=user,
            home=state_dir(home),
            shell=NOLOGIN,
            system=True,
            create_home=False,
            ensure_home=False,
            comment=ACCOUNT_MARK,
        )
    for path, owner, mode in directories(user, home):
        managed.directory(name=f"{path} ({owner}, {mode})", path=path, user=owner,
                          group=owner, mode=mode)
    install_interpreter(interpreter, "the SGLang venv")
    venv = venv_path(home, lock, interpreter and interpreter.path)
    requirements = requirements_path(home, lock)
    managed.put(name=f"lock {lock.name} ({len(lock.packages)} hashed wheels)",
                text=lock.requirements_text(), dest=requirements, user="root",
                group="root", mode="644")
    # the serve plan validated these already (``trusted``: its trusted_mirrors); checked
    # again so that no caller can skip the rule
    validate_pip_urls(index_url, find_links, list(trusted), inventory_source())
    credentials = pip_config_text(index_url, find_links)

    def pip_credentials() -> str:  # a function: pyinfra shows its name, not the text
        return credentials or ""

    verified = fact(VenvVerified, venv=venv) == lock.hash
    if not verified:
        planned.action(f"install the venv {venv} and verify it against the lock",
                       would="install " + lock_install(
                           lock.name, "SGLang", public_version(lock.sglang),
                           len(lock.packages), lock.download_bytes, venv))
        locked_venv(name=f"venv {venv} from lock {lock.name}", venv=venv, lock=lock,
                    requirements=requirements,
                    pip_options=pip_args(index_url, find_links, trusted=trusted),
                    pip_config=pip_credentials if credentials else None,
                    pip_config_path=f"{home}/{PIP_CONFIG}",
                    python=interpreter.path if interpreter else "python3")
    managed.put(name=f"host script {home}/bin/{VERIFY}", src=str(SCRIPTS_DIR / VERIFY),
                dest=f"{home}/bin/{VERIFY}", user="root", group="root", mode="755")
    if not verified:
        verify_venv(name=f"verify {venv} as {user} against the lock", venv=venv, lock=lock,
                    user=user, script=f"{home}/bin/{VERIFY}", user_home=state_dir(home),
                    expect_gpus=expect_gpus)
    return venv


def prune_reads(home: str, unit_paths: tuple[str, ...]) -> list[Read]:
    """What :func:`prune_venvs` reads, for the deploy's prefetch."""
    return [Read.of(PruneState, home=home, paths=unit_paths)]
