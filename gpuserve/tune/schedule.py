"""A fleet's tune: one search, its candidates spread over several hosts with the same GPUs.

Why one search and not N: the search's decisions (order, early stops, repeats, which
combinations) depend on every measurement so far; N searches would measure the same
candidates N times. So :class:`Fleet` is the search's executor: a phase's candidates
go to whichever host is free (:class:`Scheduler`), one load per host at a time, and the
search's decisions are taken one at a time under a baton (:class:`Baton`), in the order
the measurements end: the same order of measurements gives the same tune.

Each host measures the incumbent first (its repeats are that host's noise), and every
figure a host measures is scaled by the ratio of the first host's incumbent to its own
at that load level: a candidate is judged against the incumbent measured on the host
it ran on, in the first host's units, at that host's own noise (:meth:`Fleet.noise_of`).
How, and what that means for significance: docs/tune.md, "A fleet in parallel".
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuserve.tune.candidates import Candidate
from gpuserve.tune.noise import FleetNoise, fleet_noise
from gpuserve.tune.outcome import LoadStatus, Outcome
from gpuserve.tune.search import Measurement


class Scheduler:
    """Hands a phase's candidates, in the search's order, to whichever host asks first."""

    def __init__(self, candidates: Iterable[Candidate]):
        self.queue = list(candidates)
        self.assigned: dict[str, list[str]] = {}
        self.stopped = False

    def next(self, host: str) -> Candidate | None:
        """The next candidate for ``host`` (free now), or None when none is left."""
        if self.stopped or not self.queue:
            return None
        candidate = self.queue.pop(0)
        self.assigned.setdefault(host, []).append(candidate.name)
        return candidate

    def stop(self) -> None:
        self.stopped = True


class Baton:
    """Who may take the search's next decision: one thread at a time.

    ``ordered`` (a simulation: every measurement returns at once with its simulated
    time): the baton goes only when every worker waits for it, to the one whose host's
    clock is earliest (ties by host order), so threads replay a discrete-event run and
    the tune is the same each time. Otherwise the first to ask gets it."""

    def __init__(self, ordered: bool):
        self.ordered = ordered
        self.cond = threading.Condition()
        self.holder: int | None = None
        self.waiting: dict[int, tuple] = {}
        self.live = 0
        self.tickets = itertools.count()

    def acquire(self, key: tuple) -> None:
        me = threading.get_ident()
        with self.cond:
            self.waiting[me] = key if self.ordered else (next(self.tickets),)
            self.cond.notify_all()  # the last to wait may make another's turn
            self.cond.wait_for(lambda: self._turn(me))
            del self.waiting[me]
            self.holder = me

    def _turn(self, me: int) -> bool:
        if self.holder is not None:
            return False
        if self.ordered and len(self.waiting) < self.live:
            return False
        return min(self.waiting, key=self.waiting.__getitem__) == me

    def release(self) -> None:
        with self.cond:
            self.holder = None
            self.cond.notify_all()

    def join(self, count: int) -> None:
        with self.cond:
            self.live += count
            self.cond.notify_all()


@dataclass
class HostState:
    """One host of the fleet: its incumbent's runs (its noise, its scale) and clock."""

    name: str
    index: int
    runs: dict[int, list[dict]] = field(default_factory=dict)
    clock: float = 0.0
    loads: int = 0
    dropped: str = ""

    def throughput(self, level: int) -> float | None:
        values = [r.get("output_throughput") for r in self.runs.get(level, [])]
        values = [float(v) for v in values if isinstance(v, int | float) and v > 0]
        return sum(values) / len(values) if values else None


def scale_figures(figures: dict[str, Any], factor: float) -> dict[str, Any]:
    """A run's figures in the reference host's units: throughput times ``factor``,
    latencies (``*_ms``) divided by it."""
    out = dict(figures)
    for key, value in figures.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if key == "output_throughput":
            out[key] = value * factor
        elif key.endswith("_ms") and factor > 0:
            out[key] = value / factor
    return out


class Fleet:
    """The search's executor over several hosts (see the module doc).

    ``executors``: host name -> that host's own executor, the first the reference host.
    ``ordered``: their ``now()`` is simulated time (bench, tests): see :class:`Baton`."""

    def __init__(self, executors: dict[str, Any], *, ordered: bool = False,
                 log: Callable[[str], None] = print):
        self.executors = executors
        self.hosts = [HostState(name, i) for i, name in enumerate(executors)]
        self.ordered, self.log = ordered, log
        self.baton = Baton(ordered)
        self.local = threading.local()
        self.stopping = threading.Event()
        self.assigned: list[dict[str, list[str]]] = []  # each spread's, for the record
        self.rounds = 0
        self.where: dict[str, str] = {}  # candidate -> the host that measured it
        self.noise: FleetNoise | None = None  # the search's last (noise_of)

    # -- the Executor protocol ---------------------------------------------------------
    def now(self) -> float:
        if not self.ordered:
            return self.executors[self.hosts[0].name].now()
        mine = self.current()
        return mine.clock if mine else max(h.clock for h in self.live())

    def measure(self, candidate: Candidate, profile, levels: tuple[int, ...], first: bool,
                repeat: int = 1) -> Measurement:
        if candidate.phase == "incumbent":
            return self._everywhere(candidate, profile, levels, first, repeat)
        host = self.current() or self.hosts[0]
        self.where[candidate.name] = host.name
        worker = self.current() is not None
        if worker:
            self.baton.release()
        try:
            m = self._timed(host, candidate, profile, levels, first, repeat)
        finally:
            if worker:
                self.baton.acquire((host.clock, host.index))
        if self.stopping.is_set():
            raise KeyboardInterrupt  # interrupted: nothing of it is recorded
        return self.scaled(host, m)

    # -- spreading a phase ---------------------------------------------------------------
    def spread(self, candidates: Sequence[Candidate], step: Callable[[Candidate], None]
               ) -> None:
        """Run ``step`` for every candidate, each on whichever host is free; returns when
        all are done. An error in one (the budget spent) stops the handing out and is
        raised here once every host's running step has ended; so is Ctrl-C."""
        if not self.assigned:  # the incumbents are in: each host's noise and scale
            for line in self.noise_lines():
                self.log(line)
        hosts = self.live()
        if self.ordered:  # a phase starts when the last one ended, on every host
            for h in hosts:
                h.clock = max(x.clock for x in hosts)
        sched = Scheduler(candidates)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=self._work, args=(h, sched, step, errors),
                                    name=f"tune-{h.name}", daemon=True) for h in hosts]
        self.baton.join(len(threads))
        for t in threads:
            t.start()
        interrupted = self._wait(threads, sched.stop)
        self.assigned.append(sched.assigned)
        if interrupted or self.stopping.is_set():
            raise KeyboardInterrupt
        if errors:
            raise errors[0]

    def _wait(self, threads: list[threading.Thread], stop: Callable[[], None]) -> bool:
        """Join ``threads``; on Ctrl-C stop handing out and wait for each host's running
        deploy to end (whether it was interrupted is the answer)."""
        def interrupted() -> None:
            stop()
            self.stopping.set()
            self.log("tune: interrupted: waiting for each host's running deploy to end")

        return join_all(threads, interrupted)

    def _work(self, host: HostState, sched: Scheduler, step: Callable[[Candidate], None],
              errors: list[BaseException]) -> None:
        self.local.host = host
        try:
            while True:
                self.baton.acquire((host.clock, host.index))
                try:
                    candidate = None if errors or self.stopping.is_set() else \
                        sched.next(host.name)
                    if candidate is None:
                        return
                    step(candidate)
                except KeyboardInterrupt:  # this host's deploy was interrupted
                    self.stopping.set()
                    sched.stop()
                    return
                except BaseException as e:  # noqa: BLE001 - raised again by spread()
                    errors.append(e)
                    sched.stop()
                    return
                finally:
                    self.baton.release()
        finally:
            self.baton.join(-1)

    # -- per host -------------------------------------------------------------------------
    def current(self) -> HostState | None:
        return getattr(self.local, "host", None)

    def live(self) -> list[HostState]:
        return [h for h in self.hosts if not h.dropped]

    def _timed(self, host: HostState, candidate, profile, levels, first, repeat
               ) -> Measurement:
        executor = self.executors[host.name]
        t0 = executor.now()
        m = executor.measure(candidate, profile, levels, first, repeat)
        host.clock += executor.now() - t0
        if first and m.status != LoadStatus.REFUSED:
            host.loads += 1
        return m

    def scaled(self, host: HostState, m: Measurement) -> Measurement:
        """``m`` in the reference host's units (the first host's own: as measured)."""
        ref = self.hosts[0]
        if host is ref:
            return m
        factors = {}
        for level in set(m.levels) | set(m.runs):
            mine, theirs = host.throughput(level), ref.throughput(level)
            factors[level] = theirs / mine if mine and theirs else 1.0
        m.levels = {c: scale_figures(f, factors[c]) for c, f in m.levels.items()}
        m.runs = {c: [scale_figures(f, factors[c]) for f in runs] for c, runs in m.runs.items()}
        return m

    def _everywhere(self, candidate, profile, levels, first, repeat) -> Measurement:
        """The incumbent on every host at once; the first host's is the search's, the
        others' runs are their hosts' noise and scale. A host whose incumbent fails
        leaves the tune (its deploy rolled it back)."""
        hosts = self.live()
        results: dict[str, Measurement] = {}

        def one(h: HostState) -> None:
            try:
                results[h.name] = self._timed(h, candidate, profile, levels, first, repeat)
            except KeyboardInterrupt:
                return

        if self.ordered:
            for h in hosts:
                one(h)
        else:
            threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in hosts]
            for t in threads:
                t.start()
            if self._wait(threads, lambda: None) or self.stopping.is_set():
                raise KeyboardInterrupt
        for h in hosts:
            m = results.get(h.name) or Measurement(LoadStatus.FAILED, reason="no result")
            for level, runs in m.runs.items():
                h.runs.setdefault(level, []).extend(runs)
            if m.status != LoadStatus.OK and h is not self.hosts[0]:
                h.dropped = f"its incumbent {m.status}: {m.reason}"[:300]
                self.log(f"tune: {h.name} leaves the tune: {h.dropped}")
        main = results.get(self.hosts[0].name) or Measurement(LoadStatus.FAILED, reason="no result")
        main.extra_loads = sum(1 for h in hosts[1:] if first and
                               results[h.name].status != LoadStatus.REFUSED)
        return main

    def noise_of(self, outcomes: Iterable[Outcome]) -> FleetNoise | None:
        """The search's noise (gpuserve/tune/noise.py ``FleetNoise``): per host, its
        incumbent's runs and the repeated runs of the candidates it measured."""
        groups = {h.name: [[r.get("output_throughput") for r in runs]
                           for runs in h.runs.values()] for h in self.hosts}
        incumbent = ""
        for o in outcomes:
            if o.phase == "incumbent":  # its runs are the reference host's, counted there
                incumbent = o.candidate
                continue
            host = self.where.get(o.candidate) or o.numbers.get("host")
            host = host if host in groups else self.hosts[0].name
            self.where.setdefault(o.candidate, host)  # one recorded by an earlier run
            runs = [r for r in (o.numbers.get("runs") or {}).values() if isinstance(r, list)]
            groups[host].extend(runs)
        self.noise = fleet_noise(groups, self.where,
                                 {h.name: {c: len(r) for c, r in h.runs.items()}
                                  for h in self.hosts}, incumbent)
        return self.noise

    def noise_lines(self) -> list[str]:
        """Each host's run-to-run noise (its own runs, and as the search uses it: with
        the other hosts' as a prior) and its scale."""
        lines = []
        ref = self.hosts[0]
        noise = self.noise or self.noise_of([])
        for h in self.live():
            own = noise.own.get(h.name) if noise else None
            used = noise.hosts.get(h.name) if noise else None
            scale = ", ".join(f"c{c} x{ref.throughput(c) / h.throughput(c):.3f}"
                              for c in sorted(h.runs) if h.throughput(c)
                              and ref.throughput(c))
            lines.append(f"tune: {h.name}: run-to-run noise "
                         + (f"{100 * own.rel_sd:.2f} % per benchmark run ({own.dof} "
                            "degrees of freedom)" if own else "not measured")
                         + (f"; judged at {100 * used.rel_sd:.2f} % ({used.dof} with the "
                            "other hosts' as a prior)" if used and used != own else "")
                         + ("" if h is ref else f"; its figures scaled to {ref.name}'s "
                            f"incumbent: {scale or 'none'}"))
        return lines


def join_all(threads: list[threading.Thread],
             on_interrupt: Callable[[], None] | None = None) -> bool:
    """Join ``threads``, Ctrl-C included: each one is still waited for (a host's
    running deploy is never abandoned); ``on_interrupt`` is called at each Ctrl-C.
    Whether one came is the answer."""
    interrupted = False
    for t in threads:
        while t.is_alive():
            try:
                t.join(0.2)
            except KeyboardInterrupt:
                interrupted = True
                if on_interrupt is not None:
                    on_interrupt()
    return interrupted
