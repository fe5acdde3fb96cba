"""Linux's bound on one argv or environment string, checked before a unit is written.

Why: the kernel's ``execve`` refuses any single argument or environment string longer
than ``MAX_ARG_STRLEN`` (32 pages, 131,072 bytes with its terminating NUL;
include/uapi/linux/binfmts.h) with E2BIG. The server's arguments travel in one
EnvironmentFile variable (``GPUSERVE_SGLANG_ARGS``, gpuserve/serve/render.py), so 16,000
``extra_args`` or one 140,000-character ``--chat-template`` passed every check and then
the unit could not start, after the host was changed. The total of argv and environment
is bounded too (``ARG_MAX``, a quarter of the stack limit: 2 MiB by default), but with
each string under 128 KiB and the arguments carried twice (variable and argv), the total
stays far below it.
"""

from __future__ import annotations

from collections.abc import Callable

#: The longest argv or environment string ``execve`` takes, its NUL included.
MAX_ARG_STRLEN = 32 * 4096


def exec_bytes(text: str) -> int:
    """The size ``execve`` counts for ``text``: its UTF-8 bytes and the NUL."""
    return len(text.encode("utf-8", "surrogatepass")) + 1


def too_long(size: int, what: str) -> str:
    return (f"{what}: {size:,} bytes, over Linux's limit of {MAX_ARG_STRLEN:,} bytes on "
            "one argument or environment string (MAX_ARG_STRLEN): the server could not "
            "start")


def args_problem(args: list[str], env_string: str,
                 field_of: Callable[[str], str]) -> tuple[str, str] | None:
    """(field, message) when one of ``args`` or ``env_string`` (the ``NAME=value`` that
    carries them all) is over :data:`MAX_ARG_STRLEN`, else None. ``field_of(arg)`` names
    the profile field an argument came from; for the whole variable the field that
    contributes the most bytes is named."""
    for arg in args:
        size = exec_bytes(arg)
        if size > MAX_ARG_STRLEN:
            return field_of(arg), too_long(size, f"one argument ({arg[:24]!r}...)")
    size = exec_bytes(env_string)
    if size <= MAX_ARG_STRLEN:
        return None
    shares: dict[str, int] = {}
    for arg in args:
        field = field_of(arg).split("[")[0]  # extra_args[3] and extra_args[9] add up
        shares[field] = shares.get(field, 0) + exec_bytes(arg)
    field = max(shares, key=shares.__getitem__) if shares else "extra_args"
    name = env_string.split("=", 1)[0]
    return field, too_long(size, f"the server's arguments ({len(args):,}, in {name})") + (
        f"; {field} gives {shares.get(field, 0):,} bytes of them")


def env_problem(key: str, value: str) -> str | None:
    """The message when the environment string ``key=value`` is over the limit."""
    size = exec_bytes(f"{key}={value}")
    return too_long(size, f"the environment string {key}=...") if size > MAX_ARG_STRLEN \
        else None
