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


def print_file(path: str) -> str:
    """Shell that prints a small regular file line by line with builtins (``read``,
    ``printf``), exiting non-zero when it is not a regular file or cannot be opened;
    stderr is dropped. Why not ``cat``: every process costs 70-90 ms under TCG (a
    millisecond on a real host), and the first batch of every rerun reads several such
    files. ``path`` is a shell word, quoted by the caller. Only for files of a few KB
    at most: dash's ``read`` takes one system call per byte, so past about 2 KB ``cat``
    is the cheaper one on a real host."""
    return (f"{{ [ -f {path} ] && while IFS= read -r _l || [ -n \"$_l\" ]; do "
            f"printf '%s\\n' \"$_l\"; done < {path}; }} 2>/dev/null")


def _job_tag(prefix: str) -> str:
    return f"##gpuserve-job{prefix}##"


def in_parallel(jobs: list[str], prefix: str = "_p") -> str:
    """Shell that runs ``jobs`` (snippets printing to stdout) at the same time and prints
    their outputs in order, as if they had run one after the other.

    Why: on a rerun most of a read's time is waiting for tools that start slowly
    (``nvidia-smi`` on an 8-GPU box, a Python start); run side by side they cost the
    slowest one, not the sum. Each job writes its own file in a private temporary
    directory (``mktemp -d``: 0700, removed at exit); all are printed by one ``cat``.
    Without a temporary directory (a full or read-only /tmp) they run in turn. Each
    job's output is framed by a begin and an end line, so that :func:`complete_jobs`
    keeps only jobs whose output arrived whole (a file cut short on a full disk never
    passes for a shorter answer). ``prefix`` names the shell functions, the directory
    variable and the frame, so that scripts of this kind can nest."""
    if not jobs:
        return "true"
    tag = _job_tag(prefix)
    functions = [f"{prefix}{i}() {{\necho '{tag} {i} begin'\n{job}\necho '{tag} {i} end'\n}}"
                 for i, job in enumerate(jobs)]
    indexes = range(len(jobs))
    started = " ".join(f'{prefix}{i} >"${prefix}t/{i}" &' for i in indexes)
    files = " ".join(f'"${prefix}t/{i}"' for i in indexes)
    serial = "; ".join(f"{prefix}{i}" for i in indexes)
    return "\n".join([
        *functions,
        f"if {prefix}t=$(mktemp -d 2>/dev/null); then trap 'rm -rf \"${prefix}t\"' EXIT; "
        f"{started} wait; cat {files} 2>/dev/null; else {serial}; fi; true"])


def complete_jobs(lines: list[str], prefix: str = "_p") -> list[str]:
    """The output lines of :func:`in_parallel`'s jobs that arrived whole (their begin and
    end lines both there, in order), without the frame; a job cut short is left out."""
    tag = _job_tag(prefix) + " "
    out: list[str] = []
    current: list[str] | None = None
    index = ""
    for line in lines:
        if line.startswith(tag):
            which, _, edge = line[len(tag):].strip().partition(" ")
            if edge == "begin":
                current, index = [], which
                continue
            if edge == "end" and current is not None and which == index:
                out.extend(current)
            current = None
            continue
        if current is not None:
            current.append(line)
    return out


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
