"""``secret_file``: put a file whose contents must never be shown.

Why not ``files.put``/``files.template``: with ``--diff`` pyinfra prints every line of
the new file (pyinfra/operations/files.py, ``put``: ``generate_color_diff``), and an
SFTP upload creates the file (or its /tmp copy under sudo) with the login umask before
the chmod, so for a moment it is world-readable. Here the contents travel on the
command's stdin into ``umask 077 && cat > tmp``, are chowned and chmodded, then moved
into place: never on argv, never readable by others, never printed. Idempotency is by
sha1 of the contents plus owner and mode, like ``files.put``.
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Sha1File


@operation()
def secret_file(dest: str, contents: str, user: str = "root", group: str = "root",
                mode: str = "600"):
    """Ensure ``dest`` holds ``contents`` with owner/mode; the contents are never logged.

    Always call with ``name=`` so the operation's auto-generated name (which would
    include the arguments) does not print ``contents``.
    """
    want = hashlib.sha1(contents.encode()).hexdigest()
    info = host.get_fact(File, path=dest)
    current = host.get_fact(Sha1File, path=dest) if info else None
    same_content = current == want
    same_meta = bool(info) and (info.get("user"), info.get("group"), info.get("mode")) == (
        user, group, int(mode))
    if same_content and same_meta:
        host.noop(f"{dest} is up to date (contents secret)")
        return

    if state.config.DIFF:
        verb = "modify" if info else "create"
        host.log(f"Will {verb} {dest} (contents secret, diff not shown)")

    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.gpuserve-new")
    script = (
        f"umask 077 && cat > {_q(tmp)}"
        f" && chown {_q(user + ':' + group)} {_q(tmp)}"
        f" && chmod {_q(mode)} {_q(tmp)}"
        f" && mv -f {_q(tmp)} {_q(dest)}"
    )
    if same_content:
        script = (
            f"chown {_q(user + ':' + group)} {_q(dest)} && chmod {_q(mode)} {_q(dest)}"
        )
        yield StringCommand("sh", "-c", QuoteString(script))
        return
    yield StringCommand("sh", "-c", QuoteString(script), _stdin=contents)


def _q(value: str) -> str:
    return shlex.quote(value)
