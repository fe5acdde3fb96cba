"""Read many facts in one remote command, so that a rerun with nothing to do costs little.

Why: pyinfra 3.10 runs one remote command per fact read, and its file operations read
two or three facts per file at prepare and again at execute time: a no-op rerun of the
serve deploy ran 57 commands on the lab host. Here a deploy declares its reads up front
(:func:`prefetch`), they run as one ``sh`` script, and each fact's own ``process``
parses its slice, so the values are exactly what ``host.get_fact`` would return.

How: docs/reruns.md, "gpuserve.roles.base.prefetch: one script, and reading its values"
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, state
from pyinfra.api import FactBase, StringCommand

from gpuserve.facts.base import complete_jobs, in_parallel
from gpuserve.facts.compat import changed_on_host
from gpuserve.roles.base.run_context import run_context

_MISSING = "##gpuserve-prefetch-missing-command##"
BATCH_PREFIX = "_batch"  # the batch's shell functions and job frame (in_parallel)


@dataclass(frozen=True)
class Read:
    """One fact read: the fact class and its keyword arguments (hashable values)."""

    cls: type[FactBase]
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, fact: type[FactBase], /, **kwargs: Any) -> Read:
        return cls(fact, tuple(sorted(kwargs.items())))


@dataclass
class _Store:
    values: dict[Read, Any] = field(default_factory=dict)
    deferred: list[Read] = field(default_factory=list)
    taken: dict[Read, float] = field(default_factory=dict)  # time.monotonic() of the read


def _store(create: bool = True) -> _Store | None:
    """This host's prefetched values in the run's context (roles/base/run_context.py)."""
    mine = run_context().host(host.name)
    if mine.reads is None and create:
        mine.reads = _Store()
    return mine.reads


def _command_text(command: object) -> str:
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    return str(command)


def batch_script(reads: list[Read], marker: str,
                 facts: list[FactBase] | None = None) -> str:
    """The shell script that runs every read's command and ends its output with
    ``<marker> <index> <exit status>`` on a line of its own (stderr is dropped, like a
    fact's). ``$(...)`` takes the trailing newlines off, as pyinfra's line split does.
    ``facts``: the instances to build the commands with (some facts keep state from
    ``command`` for ``process``, e.g. ``FileContents``); new ones by default.

    The reads run at the same time and print in order (``in_parallel``): a batch costs
    its slowest read (the doctor's ``nvidia-smi`` runs, the checkpoint scan's Python
    start) rather than their sum."""
    jobs = []
    for index, read in enumerate(reads):
        fact = facts[index] if facts is not None else read.cls()
        kwargs = dict(read.kwargs)
        command = _command_text(fact.command(**kwargs))
        required = fact.requires_command(**kwargs)
        if required:
            command = (f"if command -v {required} >/dev/null 2>&1; then {{ {command}\n}}; "
                       f"else echo '{_MISSING}'; fi")
        # a group, not a subshell: ``$(...)`` is one already (an ``exit`` or ``cd`` in a
        # command stays inside it), and under TCG every process costs tens of ms
        jobs.append(f"_o=$( {{ {command}\n}} 2>/dev/null </dev/null ); _s=$?; "
                    f"[ -z \"$_o\" ] || printf '%s\\n' \"$_o\"; "
                    f"echo \"{marker} {index} $_s\"")
    return in_parallel(jobs, prefix=BATCH_PREFIX)


def split_output(lines: list[str], marker: str, count: int) -> list[tuple[int, list[str]] | None]:
    """Per read: (exit status, its output lines), or None when its marker is missing or
    its output did not arrive whole (``complete_jobs``)."""
    out: list[tuple[int, list[str]] | None] = [None] * count
    current: list[str] = []
    for line in complete_jobs(lines, prefix=BATCH_PREFIX):
        if line.startswith(marker + " "):
            try:
                _, index, status = line.split(" ")
                out[int(index)] = (int(status), current)
            except (ValueError, IndexError):
                pass
            current = []
        else:
            current.append(line)
    return out


class Batch(FactBase):
    """The raw output of :func:`batch_script` (lines)."""

    def command(self, script: str) -> str:
        return script

    def process(self, output: list[str]) -> list[str]:
        return list(output)


def prefetch(reads: Iterable[Read]) -> None:
    """Run ``reads`` on the current host in one command and keep their values.

    A fact class with ``group_command(kwargs_list)``/``group_process(kwargs_list,
    output)`` has all its reads run as one command (e.g. gpuserve.roles.base.managed.PathState: one
    ``stat`` for every path). A read whose command fails (non-zero exit) is not kept:
    :func:`fact` then runs it on its own, so a failing fact behaves exactly as without
    the prefetch. Reads given to :func:`defer` before join this batch."""
    store = _store()
    todo = [r for r in dict.fromkeys([*store.deferred, *reads]) if r not in store.values]
    store.deferred.clear()
    if not todo:
        return
    groups: dict[type[FactBase], list[Read]] = {}
    single: list[Read] = []
    for read in todo:
        if hasattr(read.cls, "group_command"):
            groups.setdefault(read.cls, []).append(read)
        else:
            single.append(read)
    grouped = [Read.of(_Group, fact_cls=cls, reads=tuple(members))
               for cls, members in groups.items()]
    runs = [*single, *grouped]
    marker = f"##gpuserve-prefetch-{secrets.token_hex(6)}##"
    facts = [read.cls() for read in runs]
    lines = host.get_fact(Batch, script=batch_script(runs, marker, facts)) or []
    taken = time.monotonic()
    store.taken.update(dict.fromkeys(todo, taken))
    results = split_output(lines, marker, len(runs))
    for read, fact_obj, result in zip(runs, facts, results, strict=True):
        if result is None or result[0] != 0:
            continue
        output = result[1]
        if read.cls is _Group:
            kwargs = dict(read.kwargs)
            members = kwargs["reads"]
            values = kwargs["fact_cls"].group_process([dict(m.kwargs) for m in members], output)
            store.values.update(zip(members, values, strict=True))
        else:
            # as pyinfra's _get_fact: no output is the fact's default, not process([])
            store.values[read] = (fact_obj.default() if output in ([], [_MISSING])
                                  else fact_obj.process(output))


def defer(reads: Iterable[Read]) -> None:
    """Add ``reads`` to this host's next :func:`prefetch` batch instead of running one
    of their own: for reads that depend on an earlier batch's values (a path named
    after a library version) while a later batch is coming anyway (a role's second
    prefetch). A read still pending when it is needed is simply read on its own
    (:func:`fact`), so deferring never changes a value, only when it is fetched."""
    store = _store()
    store.deferred.extend(reads)


class _Group(FactBase):
    """Several reads of one fact class as one command (see :func:`prefetch`)."""

    def command(self, fact_cls: type[FactBase], reads: tuple[Read, ...]) -> str:
        return fact_cls.group_command([dict(r.kwargs) for r in reads])


def fact(cls: type[FactBase], **kwargs: Any) -> Any:
    """``host.get_fact(cls, **kwargs)``, from the prefetch when it holds the read."""
    read = Read.of(cls, **kwargs)
    store = _store(create=False)
    if store is not None and read in store.values:
        return store.values[read]
    return host.get_fact(cls, **kwargs)


def prefetched(read: Read, max_age: float | None = None) -> Any:
    """The batch's value of ``read``, or None when no batch kept it or it is older than
    ``max_age`` seconds (never a read of its own: for reads only worth their batch
    value, such as the gate's first probe)."""
    store = _store(create=False)
    if store is None or read not in store.values:
        return None
    if max_age is not None and time.monotonic() - store.taken.get(read, 0.0) > max_age:
        return None
    return store.values[read]


def changed_so_far() -> bool:
    """At execute time: whether an operation of this deploy has already changed this
    host (run commands), so that the prefetched state may be out of date.

    Why not pyinfra's prepare-time count (``StateHostMeta.ops_change``): pyinfra 3.10
    skips change detection on a plain run ("Skipping change detection"), and the count
    stays 0 whatever the run changes."""
    return state.is_executing and changed_on_host(state, host)


def fact_if_unchanged(cls: type[FactBase], **kwargs: Any) -> Any:
    """For reads at execute time: the prefetched value while no earlier operation of the
    deploy has changed this host (so it is still as prefetched), else a fresh read."""
    if changed_so_far():
        return host.get_fact(cls, **kwargs)
    return fact(cls, **kwargs)


def forget() -> None:
    """Drop the current host's prefetched values (tests; a second deploy in-process)."""
    run_context().host(host.name).reads = None


class _Reader:
    """``host``'s ``name`` and ``get_fact`` with reads from the prefetch (for helpers
    such as ``gpuserve.facts.document.host_facts_document`` that take a host)."""

    @property
    def name(self) -> str:
        return host.name

    @staticmethod
    def get_fact(cls: type[FactBase], **kwargs: Any) -> Any:
        return fact(cls, **kwargs)


def reader() -> _Reader:
    return _Reader()
