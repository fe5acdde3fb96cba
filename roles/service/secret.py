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
import re
import shlex
from collections.abc import Callable

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Sha1File

from gpuserve.errors import InputError


@operation()
def secret_file(dest: str, contents: Callable[[], str], user: str = "root",
                group: str = "root", mode: str = "600"):
    """Ensure ``dest`` holds ``contents()`` with owner/mode; the contents are never logged.

    ``contents`` is a function returning the text, not the text: pyinfra keeps an
    operation's arguments and prints them (``--json``, ``-vvv``), and a function prints
    as its name. Always call with ``name=`` so the auto-generated name says nothing
    either.
    """
    if not callable(contents):
        raise TypeError("secret_file(contents=...) takes a function returning the text")
    contents = contents()
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

    if same_content:
        script = (
            f"chown {_q(user + ':' + group)} {_q(dest)} && chmod {_q(mode)} {_q(dest)}"
        )
        yield StringCommand("sh", "-c", QuoteString(script))
        return
    yield write_secret_command(dest, contents, user, group, mode)


def write_secret_command(dest: str, contents: str, user: str = "root", group: str = "root",
                         mode: str = "600") -> StringCommand:
    """The command that writes ``contents`` to ``dest`` from stdin: ``umask 077`` into a
    temporary file beside it, chown, chmod, then rename, so the file is never readable
    by others and the contents are never on argv (nor in pyinfra's output)."""
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.gpuserve-new")
    script = (
        f"umask 077 && cat > {_q(tmp)}"
        f" && chown {_q(user + ':' + group)} {_q(tmp)}"
        f" && chmod {_q(mode)} {_q(tmp)}"
        f" && mv -f {_q(tmp)} {_q(dest)}"
    )
    return StringCommand("sh", "-c", QuoteString(script), _stdin=contents)


def _q(value: str) -> str:
    return shlex.quote(value)


# ----------------------------------------------------------------- host data secrets

#: Shortest secret accepted: anything shorter is guessable, and redaction (which replaces
#: every occurrence of the value in the server's output) would mangle ordinary text.
MIN_SECRET_LENGTH = 16
#: Hugging Face user access tokens: ``hf_`` and letters/digits (34 of them today).
HF_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]+")


def validate_secret(value: object, key: str, source: str) -> str | None:
    """``value`` of host data ``key`` (``hf_token`` / ``sglang_api_key``) when it is a
    usable secret, None when unset; InputError naming ``source`` and ``key`` otherwise.

    The message states the rule, never the value (nor its length: a log line is no place
    for hints about a secret)."""
    if value is None:
        return None
    if not isinstance(value, str):
        # the type only (pyinfra's --data reads an all-digit value as a number)
        raise InputError(source, key, f"must be a string, got a {type(value).__name__} "
                         "(quote it)")
    if not value.strip():
        raise InputError(source, key, "must be a non-empty string")
    if "\n" in value or "\r" in value:
        raise InputError(source, key, "must be a single line")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InputError(source, key, "must not contain control characters")
    if len(value) < MIN_SECRET_LENGTH:
        raise InputError(source, key, f"too short to be a real secret: use at least "
                         f"{MIN_SECRET_LENGTH} characters (the value is not shown)")
    if key == "hf_token" and not HF_TOKEN_SHAPE.fullmatch(value):
        raise InputError(source, key, "does not look like a Hugging Face access token "
                         f"(hf_ followed by letters and digits, at least {MIN_SECRET_LENGTH} "
                         "characters in all; the value is not shown)")
    return value
