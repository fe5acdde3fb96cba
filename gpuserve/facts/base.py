"""Shared behaviour of gpuserve facts: parse with a pure parser, absent on garbage."""

from __future__ import annotations

import logging
from typing import Generic, TypeVar

from pyinfra.api import FactBase

T = TypeVar("T")

logger = logging.getLogger("gpuserve.facts")


def quiet(command: str) -> str:
    """Run ``command``; print its stdout only if it exits 0, and always exit 0.

    pyinfra fails the host when a fact's command exits non-zero. Tools such as
    ``nvidia-smi`` exit non-zero for ordinary states (no driver loaded) and print the
    error on stdout, so their output is kept only on success.
    """
    return f"_o=$({command} 2>/dev/null) && [ -n \"$_o\" ] && printf '%s\\n' \"$_o\"; true"


class ParsedFact(FactBase[T], Generic[T]):
    """A fact whose ``parse`` raises ValueError on output it does not recognise.

    pyinfra aborts the whole run when ``process`` raises anything but
    FactProcessError, and a host whose tool prints something odd is not broken, so a
    ValueError is logged and the fact's absent value returned instead.
    """

    abstract = True

    def parse(self, output: list[str]) -> T:
        raise NotImplementedError

    def process(self, output: list[str]) -> T:
        try:
            return self.parse(output)
        except ValueError as exc:
            logger.warning("fact %s: unrecognised output, treated as absent: %s", self.name, exc)
            return self.default()
