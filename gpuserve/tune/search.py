"""The search: incumbent, one knob at a time, retries, then each objective's combinations.

Pure: the loads and benchmarks happen behind an :class:`Executor` (the pyinfra serve
deploy in ``gpuserve tune``; a performance surface in the lab's bench script), the
records behind a :class:`Store`, so the same search runs on a GPU box and in a test.

Order: the incumbent first (its start calibrates the memory planner: judge.py; its load
levels run ``repeats.incumbent`` times in the same server: the host's noise), then every
value of every knob alone, judged on the controller (pruned ones never load) and
ordered by predicted tok/s, then one retry of each value that failed alone for memory,
combined with the values that relieve it, then per objective combinations of the knobs'
best values for that objective. Each measured candidate runs concurrency 1 first; one
that is clearly dominated there stops (:func:`_dominated`), the rest sweep the other
load levels in the same server, and run again there while they are within the noise of
the leader (gpuserve/tune/noise.py). A candidate with an outcome in the store is not
measured again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuserve.launch.bench import MAX_SCENARIOS
from gpuserve.tune.candidates import Candidate, combinations, one_knob
from gpuserve.tune.judge import risk
from gpuserve.tune.noise import POWER, FleetNoise, Noise, Where, mean_figures, pooled
from gpuserve.tune.outcome import (
    LoadStatus,
    Outcome,
    OutcomeStatus,
    best,
    primary,
    score,
    score_level,
)
from gpuserve.tune.predict import Comm
from gpuserve.tune.retry import neighbours, retries, within_noise
from gpuserve.tune.space import FOLLOW_UP, Knob, KnobValue, TuneSpec


@dataclass
class Measurement:
    status: LoadStatus
    levels: dict[int, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""
    load_s: float | None = None
    diagnosis: dict[str, Any] | None = None
    records: list[str] = field(default_factory=list)
    after_weights_gib: float | None = None  # SGLang's own figure of this start
    runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # each run's, when
    # a level ran more than once (``repeat``); ``levels`` then holds the last
    extra_loads: int = 0  # loads on other hosts this measurement made (a fleet's
    # incumbent on each host: gpuserve/tune/schedule.py)


class Executor(Protocol):
    def measure(self, candidate: Candidate, profile: Any, levels: tuple[int, ...],
                first: bool, repeat: int = 1) -> Measurement:
        """Load ``candidate`` (``first``) or keep it loaded, and run the benchmark at each
        of ``levels``, ``repeat`` times each."""

    def now(self) -> float: ...


class Store(Protocol):
    def get(self, name: str) -> Outcome | None: ...

    def put(self, outcome: Outcome) -> None: ...


@dataclass
class Context:
    """What the search needs besides the spec: how to build a candidate's profile, how
    to judge one, and the host's figures."""

    profile_for: Callable[[Candidate], Any]
    judge: Callable[[Any, float | None], Any]  # (profile, calibration) -> Verdict
    planner_after: Callable[[Any], float | None]  # profile -> planned GiB after weights
    config_key: str
    incumbent: Any  # the incumbent Profile
    comm: Comm = field(default_factory=Comm)
    load_estimate_s: float | None = None  # from the host's last start
    log: Callable[[str], None] = print
    stamp: Callable[[], str] = lambda: ""


@dataclass
class Tally:
    generated: int = 0
    pruned: int = 0
    measured: int = 0
    failed: int = 0
    stopped: int = 0
    loads: int = 0
    repeats: int = 0  # rounds of benchmark runs again in a loaded server (no load)
    repeat_runs: int = 0  # the benchmark runs those rounds took (runs x levels)
    retried: int = 0
    reused: int = 0
    interrupted: bool = False
    budget_hit: str = ""


@dataclass
class TuneRun:
    spec: TuneSpec
    outcomes: list[Outcome]
    tally: Tally
    calibration_gib: float | None
    noise: Noise | FleetNoise | None = None

    def best(self, objective: str) -> Outcome | None:
        """The objective's winner: the highest mean, if it beats the incumbent beyond the
        noise; else the incumbent stays (:meth:`gain`)."""
        top = best(self.outcomes, objective, self.spec)
        base = self.incumbent
        if self.gain(objective, top).startswith("no significant gain"):
            return base
        return top

    @property
    def incumbent(self) -> Outcome | None:
        return next((o for o in self.outcomes if o.phase == "incumbent"), None)

    def gain(self, objective: str, top: Outcome | None = None) -> str:
        """"no significant gain ..." when the highest mean does not beat the incumbent
        beyond the noise; else how much it gains ("" without a figure)."""
        top = top or best(self.outcomes, objective, self.spec)
        base = self.incumbent
        if top is None or base is None or top is base:
            return ""
        s_top, l_top = score_level(top, objective, self.spec)
        s_base, l_base = score_level(base, objective, self.spec)
        if s_top is None or s_base is None or s_base <= 0:
            return ""
        pct = 100 * (s_top / s_base - 1)
        if self.noise is not None and not self.noise.beats(
                s_top, top.count(l_top), s_base, base.count(l_base),
                (Where(top.candidate, l_top), Where(base.candidate, l_base))):
            return (f"no significant gain: {top.label} {pct:+.1f} % over the incumbent is "
                    f"within the noise ({100 * self.noise.rel_sd_of(top.candidate):.1f} % "
                    "per run)")
        return f"{pct:+.1f} % over the incumbent"


class _State:
    def __init__(self, spec: TuneSpec, ctx: Context, executor: Executor, store: Store):
        self.spec, self.ctx, self.executor, self.store = spec, ctx, executor, store
        self.outcomes: list[Outcome] = []
        self.tally = Tally()
        self.calibration: float | None = None
        self.start = executor.now()
        self.planned = 0
        self.index = 0
        self.per_load_s: list[float] = []
        self.verdicts: dict[str, Any] = {}
        self.noise: Noise | FleetNoise | None = None
        # loads of one incumbent and the one-knob sweep (a fleet's other incumbents left
        # out: the follow-ups' cap is one host's), and the tally when the sweep ended
        self.sweep_loads: int | None = None
        self.sweep_end = 0
        self.first_load_s: float | None = None  # the incumbent's load and first runs

    def update_noise(self, extra: Outcome | None = None) -> None:
        every = [*self.outcomes, *([extra] if extra else [])]
        per_host = getattr(self.executor, "noise_of", None)  # a fleet's: per host
        if per_host is not None:
            self.noise = per_host(every)
            return
        self.noise = pooled(runs for o in every
                            for runs in (o.numbers.get("runs") or {}).values()
                            if isinstance(runs, list))

    def elapsed(self) -> float:
        return self.executor.now() - self.start

    def best_line(self) -> str:
        name = primary(self.spec)
        top = best(self.outcomes, name, self.spec)
        if top is None:
            return f"best {name}: none yet"
        return f"best {name} {score(top, name, self.spec):.1f} tok/s ({top.label})"

    def say(self, candidate: Candidate, phase: str) -> None:
        self.ctx.log(f"tune: candidate {self.index}/{self.planned} [{candidate.phase}] "
                     f"{candidate.label}: {phase}; {_clock(self.elapsed())} elapsed; "
                     f"{self.best_line()}")

    def budget_left(self) -> str:
        """Why the budget is spent ("" while it is not)."""
        b = self.spec.budget
        if b.loads is not None and self.tally.loads >= b.loads:
            return f"budget of {b.loads} loads spent"
        if b.wall_s is not None:
            per = (sum(self.per_load_s) / len(self.per_load_s)) if self.per_load_s else 0
            if self.elapsed() + per > b.wall_s:
                return f"wall budget {_clock(b.wall_s)} would be passed"
        return ""


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else \
        f"{s // 60}m{s % 60:02d}s"


def run_search(spec: TuneSpec, knobs: tuple[Knob, ...], ctx: Context, executor: Executor,
               store: Store) -> TuneRun:
    """Run the tune; KeyboardInterrupt stops it between steps (``tally.interrupted``)."""
    st = _State(spec, ctx, executor, store)
    incumbent = Candidate(_name(spec, {}, ctx), "incumbent", {})
    singles = one_knob(spec, knobs, ctx.incumbent, ctx.config_key)
    st.planned = 1 + len(singles) + _combo_estimate(spec, knobs)
    st.tally.generated = 1 + len(singles)
    try:
        _estimate(st, singles)  # before any load: the host's own last start time
        _step(st, incumbent)
        incumbents = st.tally.loads  # over a fleet, one per host
        _calibrate(st)
        _noise_line(st)
        _estimate(st, singles)
        _each(st, _ordered(st, singles), _step)
        st.sweep_end = st.tally.loads
        st.sweep_loads = st.sweep_end - max(incumbents - 1, 0)
        # retries and each objective's combinations follow from the one-knob outcomes
        # alone: all known now (a fleet measures them side by side: _phases)
        retried = retries(spec, knobs, st.outcomes, ctx, spec.objectives[0].name, st.noise)
        seen = {o.candidate for o in st.outcomes} | {c.name for c in retried}
        groups = [retried]
        for objective in spec.objectives:
            combos = combinations(spec, _winners(st, knobs, objective.name), ctx.config_key,
                                  seen)
            seen |= {c.name for c in combos}
            groups.append(combos)
        _phases(st, groups)
        _climb(st, knobs, seen)
    except BudgetSpent as e:
        ctx.log(f"tune: stopping: {e}")
    except KeyboardInterrupt:
        st.tally.interrupted = True
        ctx.log("tune: interrupted; the host keeps the last profile that passed its health "
                "gate (or the rollback's)")
    st.update_noise()
    return TuneRun(spec, st.outcomes, st.tally, st.calibration, st.noise)


def _climb(st: _State, knobs: tuple[Knob, ...], seen: set[str]) -> None:
    """What the follow-up budget has left, in rounds (one launch per host): the launches
    one knob away from a launch within the noise of an objective's best whose changed
    value did best alone (against the incumbent, over every objective), chosen anew after
    each round, so a launch that wins moves the search to its own neighbours."""
    width = max(1, len(getattr(st.executor, "hosts", ()) or ()))
    while True:
        pool: list[tuple[float, Candidate]] = []
        for objective in st.spec.objectives:
            pool += neighbours(st.spec, knobs, st.outcomes, st.ctx.config_key,
                               objective.name, seen, st.noise)
        if _spare_follow_ups(st) <= 0:  # a rerun's stored outcomes cost no load
            pool = [(p, c) for p, c in pool if st.store.get(c.name) is not None]
        pool.sort(key=lambda pc: -pc[0])
        round_: list[Candidate] = []
        for _, candidate in pool:
            if len(round_) < width and candidate.name not in {c.name for c in round_}:
                round_.append(candidate)
        if not round_:
            return
        seen |= {c.name for c in round_}
        _phase(st, round_)


def _spare_follow_ups(st: _State) -> int:
    """Follow-up loads left under the cap (:data:`FOLLOW_UP` x the sweep's loads); 0
    before the sweep has ended."""
    if st.sweep_loads is None:
        return 0
    return _follow_up_cap(st) - (st.tally.loads - st.sweep_end)


def _follow_up_cap(st: _State) -> int:
    return math.floor(FOLLOW_UP * (st.sweep_loads or 0))


def _phases(st: _State, groups: list[list[Candidate]]) -> None:
    """Each group a phase of its own; over a fleet, one phase (no host waits for the
    slowest of a group before the next group starts)."""
    if getattr(st.executor, "spread", None) is None:
        for group in groups:
            _phase(st, group)
    else:
        _phase(st, *groups)


def _phase(st: _State, *groups: list[Candidate]) -> None:
    candidates = [c for group in groups for c in group]
    st.planned = st.index + len(candidates)
    st.tally.generated += len(candidates)

    def one(st: _State, candidate: Candidate) -> None:
        if st.sweep_loads is not None and _spare_follow_ups(st) <= 0 and \
                st.store.get(candidate.name) is None:
            st.index += 1
            st.say(candidate, f"skipped: follow-ups after the sweep load at most "
                   f"{_follow_up_cap(st)} launches ({FOLLOW_UP:g} x the sweep's "
                   f"{st.sweep_loads})")
            return
        _step(st, candidate)

    _each(st, [c for group in groups for c in _ordered(st, group)], one)


def _each(st: _State, candidates: list[Candidate], step: Callable[[_State, Candidate], None]
          ) -> None:
    """``step`` each candidate in order; over a fleet, each on whichever host is free
    (the executor's ``spread``: gpuserve/tune/schedule.py)."""
    spread = getattr(st.executor, "spread", None)
    if spread is None:
        for candidate in candidates:
            step(st, candidate)
    else:
        spread(candidates, lambda candidate: step(st, candidate))


def _noise_line(st: _State) -> None:
    st.update_noise()
    if st.noise is None:
        st.ctx.log("tune: run-to-run noise not measured (repeats.incumbent is 1): every "
                   "difference counts")
        return
    st.ctx.log(f"tune: run-to-run noise on this host: {100 * st.noise.rel_sd:.2f} % per "
               f"benchmark run ({st.noise.dof} degrees of freedom from the incumbent's "
               f"{st.spec.repeats.incumbent} runs per load level in one server)")


def _name(spec: TuneSpec, choice: dict, ctx: Context) -> str:
    from gpuserve.tune.candidates import candidate_name

    return candidate_name(spec, choice, ctx.config_key)


def _combo_estimate(spec: TuneSpec, knobs: tuple[Knob, ...]) -> int:
    k = min(spec.combine, len(knobs))
    return max(0, 2 ** k - k - 1) * len(spec.objectives)


def _calibrate(st: _State) -> None:
    """Measured minus planned free GiB after weights, from the incumbent's start."""
    first = st.outcomes[0] if st.outcomes else None
    measured = first.numbers.get("measured_after_weights_gib") if first else None
    if measured is None:
        return
    planned = st.ctx.planner_after(st.ctx.incumbent)
    if planned is None:
        return
    st.calibration = float(measured) - planned
    st.ctx.log(f"tune: memory calibration from the incumbent's start: SGLang reported "
               f"{measured:.2f} GiB/GPU free after weights, the planner {planned:.2f}: "
               f"offset {st.calibration:+.2f} GiB applied to every candidate")


def _estimate(st: _State, singles: list[Candidate]) -> None:
    walls = st.per_load_s or [o.numbers["wall_s"] for o in st.outcomes
                              if isinstance(o.numbers.get("wall_s"), int | float)]
    per = (sum(walls) / len(walls)) if walls else st.ctx.load_estimate_s
    b = st.spec.budget
    limit = [f"{b.loads} loads" if b.loads else "", _clock(b.wall_s) if b.wall_s else ""]
    st.ctx.log(f"tune: {len(singles)} one-knob candidates and up to "
               f"{st.planned - 1 - len(singles)} combinations; budget "
               f"{' and '.join(x for x in limit if x)}; "
               + (f"about {_clock(per)} per candidate on this host ("
                  + ("measured by this tune" if walls else "its last start, from the journal; "
                     "benchmarks come on top") + "), so at most "
                  f"{_clock(per * min(st.planned, b.loads or st.planned))}" if per else
                  "no measured load time on this host yet"))


def _ordered(st: _State, candidates: list[Candidate]) -> list[Candidate]:
    """Judge every candidate (pruned ones are stored now), the rest by prediction."""
    keep = []
    for candidate in candidates:
        if st.store.get(candidate.name) is not None:
            keep.append((float("inf"), candidate))  # reused: costs nothing, first
            continue
        profile = st.ctx.profile_for(candidate)
        verdict = st.ctx.judge(profile, st.calibration)
        if verdict.pruned:
            st.index += 1
            outcome = Outcome(candidate.name, candidate.phase, candidate.labels(),
                              OutcomeStatus.PRUNED, gpus=profile.gpus, reason=verdict.pruned,
                              numbers=verdict.numbers, timestamp=st.ctx.stamp())
            st.store.put(outcome)
            st.outcomes.append(outcome)
            st.tally.pruned += 1
            st.say(candidate, f"pruned before loading: {verdict.pruned}")
            continue
        pred = verdict.prediction
        key = (pred.single_tok_s if primary(st.spec) == "single_stream" else pred.peak_tok_s) \
            if pred else 0.0
        st.verdicts[candidate.name] = verdict
        why = risk(verdict)
        if why:  # room inside the calibration's (or the draft estimate's) error: loaded last
            key = -1e12 + key
            st.ctx.log(f"tune: {candidate.label}: {why}: loaded after the launches that "
                       "surely fit")
        keep.append((key, candidate))
    return [c for _, c in sorted(keep, key=lambda t: -t[0])]


def _step(st: _State, candidate: Candidate) -> None:
    st.index += 1
    stored = st.store.get(candidate.name)
    if stored is not None:
        st.outcomes.append(stored)
        st.tally.reused += 1
        st.say(candidate, f"recorded earlier ({stored.status}), not measured again")
        return
    why = st.budget_left()
    if why:
        st.tally.budget_hit = why
        st.say(candidate, f"skipped: {why}")
        raise BudgetSpent(why)
    _measure(st, candidate)


class BudgetSpent(Exception):
    """Leaves the search when the budget is spent."""


def _measure(st: _State, candidate: Candidate) -> None:
    profile = st.ctx.profile_for(candidate)
    verdict = st.verdicts.get(candidate.name) or st.ctx.judge(profile, st.calibration)
    pred = verdict.prediction.to_dict() if verdict.prediction else None
    outcome = Outcome(candidate.name, candidate.phase, candidate.labels(), OutcomeStatus.MEASURED,
                      gpus=profile.gpus, numbers=dict(verdict.numbers), prediction=pred,
                      timestamp=st.ctx.stamp())
    # the incumbent is never stopped early: all its load levels in one run
    # its load levels repeated in the same run: the host's noise
    incumbent = candidate.phase == "incumbent"
    levels = st.spec.loads if incumbent else st.spec.loads[:1]
    repeat = st.spec.repeats.incumbent if incumbent else 1
    st.say(candidate, f"loading and measuring concurrency {', '.join(map(str, levels))}"
           + (f", {repeat} runs each" if repeat > 1 else ""))
    t0 = st.executor.now()
    st.tally.loads += 1  # counted while it loads: over a fleet, others check the budget
    first = st.executor.measure(candidate, profile, levels, True, repeat)
    if incumbent:
        st.first_load_s = st.executor.now() - t0
    st.tally.loads += first.extra_loads - (first.status == LoadStatus.REFUSED)
    samples: dict[int, list[dict]] = {}
    _take(outcome, first, samples)
    if first.status != LoadStatus.OK:
        outcome.status = OutcomeStatus.FAILED
        st.tally.failed += 1
    else:
        _after_first(st, candidate, profile, outcome, samples)
        st.tally.measured += 1
    st.per_load_s.append(st.executor.now() - t0)
    outcome.numbers["wall_s"] = round(st.per_load_s[-1], 1)
    st.store.put(outcome)
    st.outcomes.append(outcome)
    st.update_noise()
    st.say(candidate, f"{outcome.status}: " + _result_line(outcome, st.noise))


def _after_first(st: _State, candidate: Candidate, profile, outcome: Outcome,
                 samples: dict[int, list[dict]]) -> None:
    """Stop a dominated candidate; else sweep the other load levels and run again
    while it is within the noise of the leader, all in the same server."""
    stop = _dominated(st, outcome)
    if stop:
        outcome.status, outcome.reason = OutcomeStatus.STOPPED, stop
        st.tally.stopped += 1
        st.say(candidate, f"stopped early: {stop}")
        return
    if candidate.phase != "incumbent" and st.spec.loads[1:]:
        st.say(candidate, f"sweeping concurrency {', '.join(map(str, st.spec.loads[1:]))}")
        rest = st.executor.measure(candidate, profile, st.spec.loads[1:], False)
        _take(outcome, rest, samples)
        if rest.status != LoadStatus.OK:
            outcome.reason = f"sweep incomplete: {rest.reason}"
            return
    st.update_noise(outcome)
    for _ in range(st.spec.repeats.most):  # each round adds runs: bounded by ``most``
        wanted = _to_repeat(st, candidate, outcome)
        if not wanted:
            return
        levels = tuple(sorted(wanted))
        have = min(len(outcome.runs(c)) for c in levels)
        runs = min(wanted[c] - len(outcome.runs(c)) for c in levels)
        if candidate.phase != "incumbent":  # a race: doubling rounds, stopped once separated
            runs = min(runs, max(2, have))
        # one deploy's bench section holds at most MAX_SCENARIOS scenarios
        runs = max(1, min(runs, MAX_SCENARIOS // len(levels)))
        gate = any(wanted[c] > _target_runs(st, candidate) for c in levels)
        if not _room_for(st, outcome, levels, runs):
            st.say(candidate, "no more runs: the wall budget keeps its time for the loads "
                   "still planned")
            return
        st.say(candidate, f"running concurrency {', '.join(map(str, levels))} {runs} more "
               "times in the same server (" + ("the host's noise and the baseline every "
               "candidate is compared with" if candidate.phase == "incumbent"
               else "its gain over the incumbent not yet beyond the noise" if gate
               else "within the noise of the leader") + ")")
        again = st.executor.measure(candidate, profile, levels, False, runs)
        if again.status != LoadStatus.OK:
            outcome.reason = f"repeat incomplete: {again.reason}"
            return
        st.tally.repeats += 1
        st.tally.repeat_runs += runs * len(levels)
        _take(outcome, again, samples)
        st.update_noise(outcome)


#: the square-root rule's k: a baseline compared with k launches runs sqrt(k) times as
#: often as each (Dunnett); about four launches near the top contend in a tune's race
CONTENDERS = 4


def _target_runs(st: _State, candidate: Candidate) -> int:
    """Runs per level a candidate may reach.

    Two launches each run :meth:`Noise.runs_needed` times tell a gain of
    ``repeats.resolution`` from the host's noise. The incumbent is the baseline of
    every comparison, so it takes more and each candidate fewer for the same
    resolution (the square-root rule, :data:`CONTENDERS`): a candidate 3/4 of that
    count, at most ``repeats.most``; the incumbent twice a candidate's, at least
    ``repeats.incumbent``, at most twice ``repeats.most`` (it is run before any
    candidate is known, and its runs are one benchmark session in its server)."""
    r = st.spec.repeats
    if st.noise is None:
        return r.incumbent if candidate.phase == "incumbent" else 1
    equal = st.noise.upper().runs_needed(r.resolution, candidate.name)
    root = math.sqrt(CONTENDERS)
    each = math.ceil(equal * (1 + 1 / root) / 2)
    if candidate.phase == "incumbent":
        return min(2 * r.most, max(r.incumbent, math.ceil(root * each)))
    return min(r.most, each)


def _to_repeat(st: _State, candidate: Candidate, outcome: Outcome) -> dict[int, int]:
    """The load levels to run again, each with the runs it should reach (a race:
    repeats go where the pick is undecided).

    The incumbent: every level until it has ``repeats.incumbent`` runs (the noise),
    then each objective's level up to :func:`_target_runs`: every winner must beat it,
    so it is measured as well as any candidate can be. A candidate: each objective's
    level while it leads (it is what the rest are compared with) or is not separated
    from the leader, up to :func:`_target_runs`, and on up to the incumbent's runs
    there while its gain over the incumbent is undecided (:func:`_undecided`)."""
    target = _target_runs(st, candidate)
    if candidate.phase == "incumbent":
        first = {c: st.spec.repeats.incumbent for c in st.spec.loads
                 if len(outcome.runs(c)) < st.spec.repeats.incumbent}
        if first:
            return first
    if st.noise is None:
        return {}
    levels: dict[int, int] = {}
    for objective in st.spec.objectives:
        mine, level = score_level(outcome, objective.name, st.spec)
        if mine is None or level is None:
            continue
        runs = len(outcome.runs(level))
        if candidate.phase == "incumbent":
            if runs < target:
                levels[level] = max(levels.get(level, 0), target)
            continue
        top = best(st.outcomes, objective.name, st.spec)
        theirs, at = score_level(top, objective.name, st.spec) if top else (None, None)
        if theirs is None:
            continue
        leads = mine > theirs
        if not leads and st.noise.separated(mine, runs, theirs, top.count(at),
                                            (Where(outcome.candidate, level),
                                             Where(top.candidate, at))):
            continue
        want = max(target, _undecided(st, objective.name, Where(outcome.candidate, level),
                                      mine, runs))
        if runs < want:
            levels[level] = max(levels.get(level, 0), want)
    return levels


def _run_s(st: _State, outcome: Outcome, level: int) -> float | None:
    """One benchmark run's seconds at ``level``: its requests' output over the tok/s."""
    tok = (outcome.levels.get(level) or {}).get("output_throughput")
    if not isinstance(tok, int | float) or tok <= 0:
        return None
    return level * st.spec.prompts_per_level * st.spec.output_len / tok


def _room_for(st: _State, outcome: Outcome, levels: tuple[int, ...], runs: int) -> bool:
    """Whether a round of ``runs`` more runs at ``levels`` leaves the wall budget time
    for the loads still planned (each at the host's load time, then one run at every
    level): repeats never crowd out the candidates a tune is for."""
    wall = st.spec.budget.wall_s
    load_s = st.ctx.load_estimate_s or st.first_load_s
    if wall is None or not load_s:
        return True
    round_s = runs * sum(_run_s(st, outcome, c) or 0.0 for c in levels)
    # each load still planned: its start, then one run at every level (its sweep)
    base = next((o for o in st.outcomes if o.phase == "incumbent"), outcome)
    sweep_s = sum(_run_s(st, base, c) or 0.0 for c in st.spec.loads)
    left = max(0, st.planned - st.index)
    if st.spec.budget.loads is not None:
        left = min(left, max(0, st.spec.budget.loads - st.tally.loads))
    return st.elapsed() + round_s + left * (load_s + sweep_s) <= wall


def _undecided(st: _State, objective: str, where: Where, mine: float, runs: int) -> int:
    """Runs a contender (leading or within the noise of the leader) may reach while its
    gain over the incumbent is undecided; 0 when it is decided.

    The winner is the contender with the highest mean, and it must beat the incumbent
    beyond the noise, so that test's power is what tells a gain from "no significant
    gain". A contender whose mean is above the incumbent's, not yet beyond the noise,
    may run as often as the incumbent ran at that level (beyond that the incumbent's
    own error dominates the difference's), unless even that many runs are futile: its
    chance to pass then, were its true value its mean now, below one in five (runs
    are planned to find a gain four times in five: :data:`POWER`). ``where``: the
    contender and its level (over a fleet, its host's noise)."""
    base = next((o for o in st.outcomes if o.phase == "incumbent"), None)
    ref, at = score_level(base, objective, st.spec) if base else (None, None)
    if ref is None or st.noise is None or mine <= ref:
        return 0
    pair = (where, Where(base.candidate, at))
    if st.noise.beats(mine, runs, ref, base.count(at), pair):
        return 0
    most = min(base.count(at), 2 * st.spec.repeats.most)
    if st.noise.conditional_power(mine, runs, ref, base.count(at), most, pair) < 1 - POWER:
        return 0
    return most


def _take(outcome: Outcome, m: Measurement, samples: dict[int, list[dict]]) -> None:
    """A run's figures: each level's mean over its runs, and its tok/s per run."""
    runs = outcome.numbers.setdefault("runs", {})
    for level, figures in m.levels.items():
        samples.setdefault(level, []).extend(m.runs.get(level) or [figures])
        outcome.levels[level] = mean_figures(samples[level])
        tok = [f.get("output_throughput") for f in samples[level]]
        runs[str(level)] = [round(float(t), 3) for t in tok if isinstance(t, int | float)]
    outcome.records.extend(m.records)
    if m.load_s is not None:
        outcome.load_s = m.load_s
    if m.diagnosis is not None:
        outcome.diagnosis = m.diagnosis
    if m.after_weights_gib is not None:
        outcome.numbers["measured_after_weights_gib"] = round(m.after_weights_gib, 2)
    if m.status != LoadStatus.OK and not outcome.reason:
        outcome.reason = m.reason


def _dominated(st: _State, outcome: Outcome) -> str:
    """Why ``outcome`` (measured at concurrency 1 only) cannot win, or "".

    Per-stream speed does not rise with load, so at concurrency c a candidate serves at
    most c x its single stream. With only the single-stream objective, a single stream
    below ``early_stop`` x the best is enough; with throughput objectives it must also
    be beaten at every load level by a measured candidate's throughput over that bound
    (EP8 on the field-notes box is slower alone and faster in a batch); with goodput
    alone, missing an SLO at concurrency 1, where latency is lowest, is enough."""
    single = outcome.single
    if single is None:
        return ""
    names = [o.name for o in st.spec.objectives]
    good = st.spec.objective("goodput")
    if good and names == ["goodput"]:
        from gpuserve.tune.outcome import meets

        if not meets(outcome.levels.get(1, {}), good.slo):
            return "misses the goodput SLO already at concurrency 1, where latency is lowest"
    top = max((o.single for o in st.outcomes if o.single is not None), default=None)
    if not (st.spec.early_stop and top and single < st.spec.early_stop * top):
        return ""
    why = (f"single stream {single:.1f} tok/s is below {st.spec.early_stop:g} x the best "
           f"so far ({top:.1f})")
    if names == ["single_stream"]:
        return why
    rest = st.spec.loads[1:]
    for other in st.outcomes:
        if all((other.figure(c) or 0) >= c * single for c in rest):
            return (f"{why}, and {other.label} already serves more at every load than "
                    f"{single:.1f} x concurrency, this candidate's ceiling")
    return ""


def _result_line(o: Outcome, noise: Noise | FleetNoise | None = None) -> str:
    parts = []
    for level, figures in sorted(o.levels.items()):
        tok = figures.get("output_throughput")
        if isinstance(tok, int | float):
            n = len(o.runs(level))
            spread = f" +- {noise.half_width(tok, n, Where(o.candidate, level)):.1f} " \
                f"({n} runs)" if noise and n > 1 \
                else ""
            parts.append(f"c{level} {tok:.1f}{spread}")
    pred = o.prediction or {}
    text = ", ".join(parts) or o.reason or "no figures"
    if pred.get("single_tok_s") and o.single:
        text += (f" (predicted single {pred['single_tok_s']:.1f}, measured/predicted "
                 f"{o.single / pred['single_tok_s']:.2f})")
    return text


def _winners(st: _State, knobs: tuple[Knob, ...], objective: str
             ) -> list[tuple[str, list[KnobValue]]]:
    """Per knob whose best one-knob value for ``objective`` beats the incumbent's mean:
    that value and every other value of the knob that beats it too and is within the
    noise of the best (which of two tied values measured higher is the noise's choice,
    so both go on to combinations), the knobs best gain first (each objective combines
    its own best values)."""
    base = next((o for o in st.outcomes if o.phase == "incumbent"), None)
    base_score = score(base, objective, st.spec) if base else None
    gains = []
    for knob in knobs:
        mine = [(s, o) for o in st.outcomes if o.phase == "one knob" and knob.name in o.choice
                and (s := score(o, objective, st.spec)) is not None
                and (base_score is None or s > base_score)]
        if not mine:
            continue
        mine.sort(key=lambda t: -t[0])
        s, top = mine[0]
        family = sum(1 for o in st.outcomes if o.phase == "one knob" and knob.name in o.choice
                     and score(o, objective, st.spec) is not None)
        tied = [o for _, o in mine
                if o is top or within_noise(o, top, objective, st.spec, st.noise, family)]
        values = [next(v for v in knob.values if v.label == o.choice[knob.name])
                  for o in tied]
        gains.append((s, knob.name, values))
    gains.sort(key=lambda t: -t[0])
    return [(name, values) for _, name, values in gains]

