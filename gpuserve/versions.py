"""The one version comparison of the project: PEP 440 through ``packaging.version``.

SGLang releases (``0.5.23``, ``0.5.10.post1``, ``0.5.24rc0``, a local ``0.5.23+lab``),
NVIDIA driver versions (``580.65.06``), CUDA toolkits, Python and glibc all compare
here, so that a pre-release sorts before its release and a local build after it,
the same way in every module (hand-written tuples disagreed, and one raised TypeError
comparing ``rc0`` with an integer).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeVar

from packaging.version import InvalidVersion, Version

T = TypeVar("T")

_LEADING = re.compile(r"\d+(?:\.\d+)*")


def parse(text: str) -> Version:
    """``text`` as a version; ``ValueError`` naming it when it is none.

    A leading ``v`` or ``sglang==`` is tolerated (how users and pip write them)."""
    cleaned = str(text).strip().removeprefix("sglang==")
    try:
        return Version(cleaned)
    except InvalidVersion:
        raise ValueError(f"not a version: {text!r}") from None


def loose(text: str | None) -> Version | None:
    """The first dotted number in a tool's output (``V12.8.93``, ``580.126.20``) as a
    version; None when there is none (an unknown driver or toolkit)."""
    if not text:
        return None
    match = _LEADING.search(str(text))
    return Version(match.group(0)) if match else None


def public(text: str) -> str:
    """``0.5.23+lab`` -> ``0.5.23``: a local build of a release has that release's flags
    (the text itself, not a normalised form: catalogs are named by it)."""
    return str(text).split("+", 1)[0]


def at_least(version: str, minimum: str) -> bool:
    """``version >= minimum`` (``ValueError`` when either is not a version)."""
    return parse(version) >= parse(minimum)


def newest(items: Iterable[T], key: Callable[[T], str] = str) -> T:
    """The item with the highest version (``ValueError`` when there is none); ties
    go to the first."""
    return max(items, key=lambda item: parse(key(item)))


def ordered(items: Iterable[T], key: Callable[[T], str] = str) -> list[T]:
    """The items oldest version first (stable for equal versions)."""
    return sorted(items, key=lambda item: parse(key(item)))
