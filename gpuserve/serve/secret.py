"""Secrets in host data (``hf_token``, ``sglang_api_key``): checked before any change.

The files that hold them are written by :func:`roles.base.managed.secret` (contents on stdin,
never on argv, never in pyinfra's output or ``--diff``, never readable by others).
"""

from __future__ import annotations

import re

from gpuserve.errors import InputError

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
