"""A fleet's tune on simulated hosts: the search spread over them (gpuserve/tune/schedule.py).

Each host is the bench's executor (bench/tune_surface.py ``SurfaceHost``: every load and
benchmark run answered by a lab surface, with simulated time); ``Fleet(ordered=True)``
replays them as a discrete-event run. The surfaces and the tune file are the lab's.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

from gpuserve.tune.candidates import Candidate
from gpuserve.tune.predict import Comm
from gpuserve.tune.schedule import Fleet, Scheduler, scale_figures
from gpuserve.tune.search import run_search
from gpuserve.tune.session import prepare
from gpuserve.tune.space import load_tune
from lab import surface as surfaces
from tests.checkpoints import once_in_dir

REPO = Path(__file__).resolve().parents[3]
SURFACES = REPO / "lab/surfaces"


def _bench():
    spec = importlib.util.spec_from_file_location("tune_surface_fleet",
                                                  REPO / "bench/tune_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


@pytest.fixture(scope="module")
def snapshot():
    """The lab host's snapshot (bench/tune_surface.py), built once per test process."""
    return once_in_dir("tune_surface.snapshot", BENCH.snapshot)


def test_scheduler_hands_candidates_in_order_to_whoever_asks() -> None:
    cands = [Candidate(f"c{i}", "one knob", {}) for i in range(4)]
    s = Scheduler(cands)
    assert s.next("b").name == "c0" and s.next("a").name == "c1" and s.next("b").name == "c2"
    s.stop()
    assert s.next("a") is None
    assert s.assigned == {"b": ["c0", "c2"], "a": ["c1"]}


def test_scale_figures_throughput_up_latency_down() -> None:
    out = scale_figures({"output_throughput": 100.0, "p99_itl_ms": 10.0, "completed": 4,
                         "ok": True}, 1.25)
    assert out == {"output_throughput": 125.0, "p99_itl_ms": 8.0, "completed": 4, "ok": True}


@pytest.mark.parametrize("surface", ["field-notes", "h200-nvlink", "pcie-draft-graphs"])
def test_two_hosts_pick_what_one_host_picks_in_less_time(snapshot, surface) -> None:
    run, fleet, single, one = BENCH.fleet_tune(SURFACES / f"{surface}.yaml", snapshot, 2)
    for objective in ("single_stream", "pareto"):
        assert run.best(objective).choice == single.best(objective).choice, objective
    # every host loaded the incumbent and measured candidates; loads counted across hosts
    assert all(h.loads >= 2 for h in fleet.hosts)
    assert run.tally.loads == sum(h.loads for h in fleet.hosts) == single.tally.loads + 1
    wall = max(h.clock for h in fleet.hosts)
    assert wall < 0.8 * one.t, (wall, one.t)


def test_the_same_measurement_order_gives_the_same_tune(snapshot) -> None:
    path = SURFACES / "pcie-draft-graphs.yaml"
    first, fleet_a, _, _ = BENCH.fleet_tune(path, snapshot, 3)
    again, fleet_b, _, _ = BENCH.fleet_tune(path, snapshot, 3)
    assert fleet_a.assigned == fleet_b.assigned and len(fleet_a.assigned) >= 2
    assert [(o.candidate, o.status, o.levels) for o in first.outcomes] == \
        [(o.candidate, o.status, o.levels) for o in again.outcomes]


class SlowerHost(BENCH.SurfaceHost):
    """The same box 10 % slower in every benchmark (clocks, cooling)."""

    def measure(self, *args, **kwargs):
        m = super().measure(*args, **kwargs)
        m.levels = {c: scale_figures(f, 0.9) for c, f in m.levels.items()}
        m.runs = {c: [scale_figures(f, 0.9) for f in runs] for c, runs in m.runs.items()}
        return m


def _fleet(snapshot, path: Path, hosts: dict, body: str | None = None):
    spec, raw = load_tune(BENCH.TUNE)
    if body is not None:
        tune = Path(tempfile.mkdtemp()) / "t.tune.yaml"
        tune.write_text(BENCH.TUNE.read_text().replace("budget: {loads: 14}", body).replace(
            "../profiles/", f"{BENCH.TUNE.parent.parent}/profiles/"))
        spec, raw = load_tune(tune)
    prepared = prepare(spec, raw, snapshot, comm=Comm(105.6, 9.59), log=lambda _: None,
                       stamp=lambda: "")
    executors = {name: cls(surfaces.load(path), spec) for name, cls in hosts.items()}
    lines: list[str] = []
    fleet = Fleet(executors, ordered=True, log=lines.append)
    return run_search(spec, prepared.knobs, prepared.ctx, fleet, BENCH.Memory()), fleet, \
        lines


def test_a_slower_host_is_judged_against_its_own_incumbent(snapshot) -> None:
    """A host 10 % slower would lose every candidate it measured; scaled by its own
    incumbent, its candidates' figures are those of the first host, and the picks the
    same as on two equal hosts."""
    path = SURFACES / "h200-nvlink.yaml"
    equal, _, _ = _fleet(snapshot, path, {"a": BENCH.SurfaceHost, "b": BENCH.SurfaceHost})
    slow, fleet, lines = _fleet(snapshot, path, {"a": BENCH.SurfaceHost, "b": SlowerHost})
    for a, b in zip(equal.outcomes, slow.outcomes, strict=True):
        assert a.candidate == b.candidate
        for level, figures in a.levels.items():
            assert b.levels[level]["output_throughput"] == pytest.approx(
                figures["output_throughput"], rel=1e-9)
    assert any("b: run-to-run noise" in line and "scaled to a's incumbent: c1 x1.111"
               in line for line in lines), lines


def test_budget_counts_every_hosts_loads(snapshot) -> None:
    run, fleet, _ = _fleet(snapshot, SURFACES / "field-notes.yaml",
                           {n: BENCH.SurfaceHost for n in "abc"}, "budget: {loads: 6}")
    assert run.tally.budget_hit == "budget of 6 loads spent"
    assert sum(h.loads for h in fleet.hosts) == run.tally.loads == 6


class InterruptedHost(BENCH.SurfaceHost):
    """Ctrl-C arrives during this host's second load."""

    def measure(self, candidate, profile, levels, first, repeat=1):
        if first and self.loads == 1:
            raise KeyboardInterrupt
        return super().measure(candidate, profile, levels, first, repeat)


def test_ctrl_c_on_one_host_stops_the_fleet_and_records_nothing_interrupted(snapshot
                                                                          ) -> None:
    run, fleet, _ = _fleet(snapshot, SURFACES / "h200-nvlink.yaml",
                           {"a": BENCH.SurfaceHost, "b": InterruptedHost})
    assert run.tally.interrupted
    # the incumbent, and what host a finished before it learnt of the interrupt
    done = {o.candidate for o in run.outcomes}
    assert [o.phase for o in run.outcomes][0] == "incumbent" and len(done) <= 2
    interrupted = fleet.assigned[0]["b"][0]
    assert interrupted not in done
