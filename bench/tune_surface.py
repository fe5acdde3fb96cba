"""What `gpuserve tune` finds on each shipped lab surface, against the surface's optimum.

    .venv/bin/python bench/tune_surface.py                 # every lab/surfaces/*.yaml
    .venv/bin/python bench/tune_surface.py --noise 0.02 --seeds 30   # picks under noise
    .venv/bin/python bench/tune_surface.py --lab           # also one real lab tune (wall time)
    .venv/bin/python bench/tune_surface.py --noise 0.02 --seeds 30 \
        --surfaces lab/surfaces/*.yaml bench/surfaces/*.yaml  # and surfaces the tuner never saw
    .venv/bin/python bench/tune_surface.py --hosts 2,4     # a fleet's simulated wall time

For each surface it runs the tuner's own search (gpuserve/tune: the same preparation,
pruning, calibration, order, early stop and combinations as ``gpuserve tune``) over
the lab's tune file (tests/fixtures/tune/lab.tune.yaml), answering each load with what
the SGLang stand-in would do for that launch on that surface (lab/surface.py
``evaluate``: the launch is rendered for the host's SGLang and parsed by its flag
catalog, as the stand-in's parser would). It prints candidates generated, pruned and
measured, loads used, and the best found per objective against ``true_optimum`` over
every launch of the space, and the loads against a one-knob-at-a-time sweep (the
incumbent and every value alone that was not pruned). With ``--noise SD --seeds N`` each
benchmark run's figures are drawn around the surface's with that relative standard
deviation (``--start-noise`` adds one draw per server start), N seeded tunes per
surface, and it prints per objective how often the pick lands within 1 % and 3 % of
the optimum (judged by the pick's noise-free figure), and the benchmark runs those
tunes took. ``--surfaces`` takes other surface files: bench/surfaces/ holds some the
lab does not ship (bench/surfaces/README.md), to check the search on surfaces it was
not written for. With ``--lab`` it also runs
``gpuserve tune`` on the running lab host ($GPUSERVE_LAB_NAME, inventory/lab.py) on
the default surface and prints what a tune costs there in wall time. With ``--hosts N``
it also runs each surface's tune over a simulated fleet of N such hosts (gpuserve/tune/
schedule.py, the same search spread over them) and prints its simulated wall time beside
one host's, the loads on each host and the rounds (the most loads any host ran), for
the lab tune file and the lab's fleet tune file (tests/fixtures/tune/lab-fleet.tune.yaml).
With ``--host-noise 0.01,0.03 --seeds N`` it also runs N seeded tunes of the lab tune
file over a simulated fleet whose hosts differ in noise (one sd per host) and prints
how often the picks land within 1 % and 3 % of the optimum, judged with each host's own
noise (the tuner's rule) beside the rule that pooled every host's runs into one noise.

The host is the lab's: the reference box's GPUs and host facts, the composed GLM-5 NVFP4
checkpoint (the same headers the on-host preflight reads).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuserve.launch import catalog  # noqa: E402
from gpuserve.launch.dialect import render_launch  # noqa: E402
from gpuserve.memory.checkpoint import scan_module  # noqa: E402
from gpuserve.tune.candidates import Candidate  # noqa: E402
from gpuserve.tune.noise import pooled  # noqa: E402
from gpuserve.tune.predict import Comm  # noqa: E402
from gpuserve.tune.schedule import Fleet  # noqa: E402
from gpuserve.tune.search import Measurement, run_search  # noqa: E402
from gpuserve.tune.session import prepare  # noqa: E402
from gpuserve.tune.snapshot import HostSnapshot  # noqa: E402
from gpuserve.tune.space import Repeats, candidate_profile, load_tune  # noqa: E402
from lab import surface as surfaces  # noqa: E402
from tests.checkpoints import compose_record  # noqa: E402

TUNE = REPO / "tests/fixtures/tune/lab.tune.yaml"
FLEET_TUNE = REPO / "tests/fixtures/tune/lab-fleet.tune.yaml"  # one knob, sixteen values
BOX = REPO / "tests/fixtures/hostfacts/reference-box-kvm.json"
VERSION = "0.5.23"
LOAD_S = 3.0  # inventory/lab.py's simulated weight load
#: one server start on the reference box when no start was measured: "a load about 10
#: minutes" for GLM-5 NVFP4 TP8 (7-8 minutes of start-up in a public deployment guide's
#: log, 332 s of it the field notes' weights load; docs/startup.md records each start's
#: phases); a benchmark run costs its requests' output tokens over the surface's rate
REFERENCE_LOAD_S = 600.0
GLM5_TUNE = REPO / "profiles/tune/glm5-nvfp4-tp8.tune.yaml"


def launch_of(profile) -> dict:
    """The server args the stand-in's parser would hold for ``profile`` (dest names)."""
    launch = render_launch(profile, VERSION)
    ns = catalog.load_catalog(VERSION).parse(launch.args)
    return {k: v for k, v in vars(ns).items() if v is not None}


class SurfaceHost:
    """The search's executor: each load answered by ``surface.evaluate``, each benchmark
    run's figures drawn around it with the surface's noise (lab/surface.py)."""

    def __init__(self, surface, spec):
        self.surface, self.spec, self.t, self.loads = surface, spec, 0.0, 0
        self.runs = 0
        self.bench_s = 0.0  # benchmark runs' own time (requests over the surface's rate)
        self.start_factor = 1.0

    def now(self) -> float:
        return self.t

    def measure(self, candidate: Candidate, profile, levels, first, repeat=1
                ) -> Measurement:
        launch = launch_of(profile)
        # the search's clock is the reference box's: a load takes REFERENCE_LOAD_S
        self.t += REFERENCE_LOAD_S if first else 0.0
        self.loads += bool(first)
        noise = self.surface.noise
        if first:
            self.start_factor = surfaces.noise_factor(noise["start"], noise["seed"], "start",
                                                      str(self.loads))
        m = Measurement("ok")
        for c in levels:
            ev = self.surface.evaluate(launch, c, self.spec.input_len, self.spec.output_len)
            if first and candidate.phase == "incumbent":
                m.after_weights_gib = ev.memory.get("free_after_weights_gb")
            if not ev.ok:
                return Measurement("failed", reason=f"{ev.failed}: {ev.error}"[:200])
            for _ in range(repeat):
                self.runs += 1
                f = self.start_factor * surfaces.noise_factor(noise["run"], noise["seed"],
                                                              "run", str(self.runs))
                itl = 1000.0 / (ev.per_stream_tps * f) if ev.per_stream_tps else None
                m.levels[c] = {"output_throughput": ev.output_tps * f,
                               "median_ttft_ms": ev.ttft_s * 1000,
                               "p99_ttft_ms": ev.ttft_s * 1000,
                               "median_itl_ms": itl, "p99_itl_ms": itl}
                m.runs.setdefault(c, []).append(m.levels[c])
                took = c * self.spec.prompts_per_level * self.spec.output_len / max(
                    ev.output_tps, 1e-9)
                self.t += took
                self.bench_s += took
        return m

    def reference_s(self, load_s: float = REFERENCE_LOAD_S) -> float:
        """The tune's wall time on the reference box: each load at ``load_s``, each
        benchmark run at its requests over the surface's rate."""
        return self.loads * load_s + self.bench_s


class Memory(dict):
    def get(self, name):  # type: ignore[override]
        return dict.get(self, name)

    def put(self, outcome) -> None:
        self[outcome.candidate] = outcome


def snapshot(tmp: Path) -> HostSnapshot:
    box = json.loads(BOX.read_text())
    model = compose_record("glm-5-nvfp4", tmp / "GLM-5-NVFP4", shards=20)
    return HostSnapshot(host="lab-gpu", sglang_version=VERSION, lock="lab",
                        gpus=box["gpus"], checkpoint=json.dumps(scan_module().scan(str(model))),
                        host_facts=box, host_json=None)


def every_launch(spec, knobs) -> list[dict]:
    """Every combination of the space's values (the optimum's field)."""
    out = []
    for values in itertools.product(*(k.values for k in knobs)):
        choice = {k.name: v for k, v in zip(knobs, values, strict=True)}
        out.append(launch_of(candidate_profile(spec, choice, "space")))
    return out


OBJECTIVES = (("single_stream", "single_stream"), ("pareto", "throughput"))


class PooledFleet(Fleet):
    """The rule a fleet's tune had before each host's noise: one noise pooled from every
    candidate's repeated runs on any host, the scale's error left out (for comparison)."""

    def noise_of(self, outcomes):
        super().noise_of(outcomes)
        return pooled(runs for o in outcomes for runs in (o.numbers.get("runs") or {}).values()
                      if isinstance(runs, list))


def fleet_hosts(path: Path, spec, sds: tuple[float, ...], seed_noise: dict) -> dict:
    """Simulated hosts of one surface, host i drawing its runs at ``sds[i]`` (each its own
    seed)."""
    executors = {}
    for i, sd in enumerate(sds):
        surface = surfaces.load(path)
        surface.noise = {**seed_noise, "run": sd, "seed": f"{seed_noise['seed']}|host{i + 1}"}
        executors[f"sim-{i + 1}"] = SurfaceHost(surface, spec)
    return executors


def one_surface(path: Path, snap: HostSnapshot, noise: tuple[float, float] = (0.0, 0.0),
                seeds: int = 0, host_noise: tuple[float, ...] = (),
                tune_file: Path = TUNE) -> dict:
    """The tune on one surface: noise-free, then ``seeds`` tunes under ``noise`` (run,
    start), and over a fleet whose hosts' noise is ``host_noise`` (each rule); each pick
    judged by its noise-free figure against the optimum."""
    surface = surfaces.load(path)
    spec, raw = load_tune(tune_file)
    # the tuner's own repeats, not the lab file's bound for the shared CI machine
    spec = dataclasses.replace(spec, repeats=Repeats())
    prepared = prepare(spec, raw, snap, comm=Comm(105.6, 9.59), log=lambda line: None,
                       stamp=lambda: "")
    # the host's last start, as gpuserve tune reads it from the journal: the reference
    # box's load time (the search keeps a wall budget's time for the loads it plans)
    ctx = dataclasses.replace(prepared.ctx, load_estimate_s=REFERENCE_LOAD_S)
    by_name = {k.name: k for k in prepared.knobs}
    launches = every_launch(spec, prepared.knobs)
    optima = {objective: surfaces.true_optimum(
        surface, launches, figure, concurrencies=spec.loads, input_len=spec.input_len,
        output_len=spec.output_len, metric="output").value for objective, figure in OBJECTIVES}

    def true_value(outcome, objective: str) -> float | None:
        if outcome is None:
            return None
        choice = {k: next(v for v in by_name[k].values if v.label == label)
                  for k, label in outcome.choice.items()}
        launch = launch_of(candidate_profile(spec, choice, "pick"))
        levels = (1,) if objective == "single_stream" else spec.loads
        evs = [surface.evaluate(launch, c, spec.input_len, spec.output_len) for c in levels]
        return max((e.output_tps for e in evs if e.ok), default=None)

    def tune(seed_noise: dict, fleet: type[Fleet] | None = None) -> tuple:
        surface.noise = seed_noise
        host = SurfaceHost(surface, spec)
        t0 = time.perf_counter()
        if fleet is None:
            run = run_search(spec, prepared.knobs, ctx, host, Memory())
        else:  # every host's runs and loads counted; the sweep's incumbent on each
            hosts = fleet_hosts(path, spec, host_noise, seed_noise)
            run = run_search(spec, prepared.knobs, ctx,
                             fleet(hosts, ordered=True, log=lambda line: None), Memory())
            host.runs = sum(h.runs for h in hosts.values())
        sweep = (len(host_noise) if fleet else 1) + sum(
            1 for o in run.outcomes if o.phase == "one knob" and o.loaded
            and o.status != "pruned")
        picks = {o: (true_value(run.best(o), o), run.best(o)) for o, _ in OBJECTIVES}
        return run, host, sweep, picks, time.perf_counter() - t0

    run, host, sweep, picks, search_s = tune({"run": 0.0, "start": 0.0, "seed": 0})
    t = run.tally
    out = {"surface": path.name, "space": len(launches), "generated": t.generated,
           "pruned": t.pruned, "measured": t.measured, "failed": t.failed,
           "stopped": t.stopped, "loads": t.loads, "sweep_loads": sweep,
           "retried": sum(1 for o in run.outcomes if o.phase == "retry"),
           "sim_wall_s": host.loads * LOAD_S + host.bench_s, "search_cpu_s": search_s,
           "runs": host.runs,
           "ref_wall_s": host.reference_s(), "tune": tune_file.name,
           "rows": {o: (v, optima[o], top.label if top else "-")
                    for o, (v, top) in picks.items()}, "noisy": None,
           "host_noise": host_noise}
    if seeds and any(noise):
        out["noisy"] = noisy_picks(tune, optima, noise, seeds)
    if seeds and host_noise:
        out["fleet_noisy"] = {rule: noisy_picks(lambda n, kind=kind: tune(n, kind), optima,
                                                noise, seeds)
                              for rule, kind in (("each host's noise", Fleet),
                                                 ("pooled noise", PooledFleet))}
    return out


def fleet_tune(path: Path, snap: HostSnapshot, hosts: int, tune_file: Path = TUNE):
    """The noise-free tune of ``path`` over ``hosts`` simulated hosts: (run, fleet, one
    host's run, its SurfaceHost)."""
    spec, raw = load_tune(tune_file)
    prepared = prepare(spec, raw, snap, comm=Comm(105.6, 9.59), log=lambda line: None,
                       stamp=lambda: "")
    one = SurfaceHost(surfaces.load(path), spec)
    single = run_search(spec, prepared.knobs, prepared.ctx, one, Memory())
    executors = {f"sim-{i + 1}": SurfaceHost(surfaces.load(path), spec) for i in range(hosts)}
    fleet = Fleet(executors, ordered=True, log=lambda line: None)
    prepared = prepare(spec, raw, snap, comm=Comm(105.6, 9.59), log=lambda line: None,
                       stamp=lambda: "")
    run = run_search(spec, prepared.knobs, prepared.ctx, fleet, Memory())
    return run, fleet, single, one


def fleet_report(path: Path, snap: HostSnapshot, hosts: int, tune_file: Path = TUNE) -> None:
    """One line: the fleet's simulated wall time against one host's, side by side."""
    run, fleet, single, one = fleet_tune(path, snap, hosts, tune_file)
    wall = max(h.clock for h in fleet.hosts)
    names = [o.name for o in run.spec.objectives]
    same = all(run.best(o) and single.best(o) and run.best(o).candidate ==
               single.best(o).candidate for o in names)
    print(f"  {tune_file.name}, fleet of {hosts}: simulated wall {wall:.0f} s vs one "
          f"host's {one.t:.0f} s "
          f"(x{wall / one.t:.2f}); loads {run.tally.loads} vs {single.tally.loads} "
          f"(per host {', '.join(str(h.loads) for h in fleet.hosts)}); rounds "
          f"{max(h.loads for h in fleet.hosts)} vs {one.loads}; picks "
          f"{'the same' if same else 'DIFFERENT'}")


def noisy_picks(tune, optima: dict, noise: tuple[float, float], seeds: int) -> dict:
    """Per objective: picks within 1 % and 3 % of the optimum over ``seeds`` tunes, and
    the loads and repeats those tunes used against a one-knob sweep's."""
    within = {o: [0, 0] for o, _ in OBJECTIVES}
    ratios, repeats, runs, walls = [], [], [], []
    for seed in range(seeds):
        run, host, sweep, picks, _ = tune({"run": noise[0], "start": noise[1], "seed": seed})
        walls.append(host.reference_s())
        ratios.append(run.tally.loads / sweep)
        repeats.append(run.tally.repeats)
        runs.append(host.runs)
        for objective, (value, _) in picks.items():
            opt = optima[objective]
            within[objective][0] += value is not None and value >= opt * 0.99 - 1e-9
            within[objective][1] += value is not None and value >= opt * 0.97 - 1e-9
    return {"within": within, "seeds": seeds, "loads_ratio_max": max(ratios),
            "loads_ratio_median": sorted(ratios)[len(ratios) // 2],
            "repeats_median": sorted(repeats)[len(repeats) // 2],
            "runs_median": sorted(runs)[len(runs) // 2], "runs_max": max(runs),
            "ref_wall_median": sorted(walls)[len(walls) // 2], "ref_wall_max": max(walls)}


def lab_tune() -> float | None:
    """One real tune on the running lab host: wall seconds (None when it failed)."""
    env = dict(os.environ)
    if not env.get("GPUSERVE_LAB_NAME"):
        print("--lab: set GPUSERVE_LAB_NAME to a running lab instance (python -m lab up)")
        return None
    extra = json.dumps({"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "3",
                        "GPUSERVE_LAB_STANDIN_SURFACE": "field-notes"})
    with tempfile.TemporaryDirectory() as results:
        t0 = time.monotonic()
        r = subprocess.run([str(REPO / ".venv/bin/gpuserve"), "tune", "inventory/lab.py",
                            str(TUNE), "--results", results, "--data",
                            f"sglang_extra_env={extra}"], cwd=REPO, env=env, text=True,
                           capture_output=True)
        took = time.monotonic() - t0
    print(r.stdout[-3000:])
    return took if r.returncode == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lab", action="store_true", help="also run one tune on the lab host")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="relative sd of each benchmark run (e.g. 0.02)")
    ap.add_argument("--start-noise", type=float, default=0.0,
                    help="relative sd of each server start (default 0)")
    ap.add_argument("--seeds", type=int, default=30, help="seeded tunes under noise")
    ap.add_argument("--hosts", default="",
                    help="fleet sizes to simulate, comma-separated (e.g. 2,4)")
    ap.add_argument("--host-noise", default="",
                    help="relative sd of each simulated fleet host's runs, comma-separated "
                         "(e.g. 0.01,0.03): picks of a fleet whose hosts' noise differs")
    ap.add_argument("--surfaces", nargs="*", type=Path,
                    help="surface files (default: every lab/surfaces/*.yaml)")
    args = ap.parse_args()
    ok = True
    paths = args.surfaces or sorted((REPO / "lab/surfaces").glob("*.yaml"))
    host_noise = tuple(float(x) for x in args.host_noise.split(",") if x.strip())
    seeds = args.seeds if args.noise or args.start_noise or host_noise else 0
    with tempfile.TemporaryDirectory() as tmp:
        snap = snapshot(Path(tmp))
        # the GLM-5 tune file first, on the reference box's own surface: its wall time
        r = one_surface(REPO / "lab/surfaces/field-notes.yaml", snap,
                        (args.noise, args.start_noise), seeds, tune_file=GLM5_TUNE)
        ok &= report(r) and reference_goal(r)
        for path in paths:
            r = one_surface(path, snap, (args.noise, args.start_noise), seeds, host_noise)
            ok &= report(r)
            for tune_file in (TUNE, FLEET_TUNE) if args.hosts else ():
                for n in [int(x) for x in args.hosts.split(",") if x.strip()]:
                    fleet_report(path, snap, n, tune_file)
    if args.lab:
        took = lab_tune()
        print(f"lab tune wall time: {took:.0f} s" if took else "lab tune failed")
    return 0 if ok else 1


def reference_goal(r: dict) -> bool:
    """The GLM-5 tune within 2 hours on the reference box (every seeded tune's)."""
    noisy = r["noisy"]
    worst = noisy["ref_wall_max"] if noisy else r["ref_wall_s"]
    print(f"  GLM-5 tune within 2 h of reference-box time: "
          f"{'yes' if worst <= 7200 else 'NO'} (worst {worst / 3600:.2f} h)")
    return worst <= 7200


def report(r: dict) -> bool:
    """Print one surface's figures; whether it met the goals (optimum noise-free; under
    noise >= 95 % within 3 % and >= 80 % within 1 %; loads <= 1.5 x the sweep's)."""
    ok = r["loads"] <= 1.5 * r["sweep_loads"]
    print(f"surface {r['surface']} ({r['tune']}): space {r['space']} launches; candidates "
          f"generated {r['generated']}, pruned {r['pruned']}, measured "
          f"{r['measured']} ({r['stopped']} stopped early), failed {r['failed']}, "
          f"retried {r['retried']}; loads used {r['loads']} (one-knob sweep "
          f"{r['sweep_loads']}: x{r['loads'] / r['sweep_loads']:.2f}); {r['runs']} benchmark "
          f"runs; simulated lab time "
          f"{r['sim_wall_s']:.0f} s of loads and benchmarks (search CPU "
          f"{r['search_cpu_s']:.1f} s); reference-box time {r['ref_wall_s'] / 3600:.2f} h "
          f"({r['loads']} loads at {REFERENCE_LOAD_S:.0f} s, benchmarks "
          f"{(r['ref_wall_s'] - r['loads'] * REFERENCE_LOAD_S) / 60:.0f} min)")
    for objective, (found, opt, label) in r["rows"].items():
        same = found is not None and abs(found - opt) <= 1e-6 * max(opt, 1)
        ok &= same
        print(f"  {objective}: best found {found or 0:,.2f} tok/s ({label}); true "
              f"optimum {opt:,.2f} tok/s: {'equal' if same else 'DIFFERENT'}")
    noisy = r["noisy"]
    if noisy:
        n = noisy["seeds"]
        for objective, (one, three) in noisy["within"].items():
            ok &= three >= 0.95 * n and one >= 0.8 * n
            print(f"  {objective} under noise: {one}/{n} picks within 1 % of the optimum "
                  f"({100 * one / n:.0f} %), {three}/{n} within 3 % ({100 * three / n:.0f} %)")
        ok &= noisy["loads_ratio_max"] <= 1.5
        print(f"  loads under noise: median x{noisy['loads_ratio_median']:.2f}, max "
              f"x{noisy['loads_ratio_max']:.2f} of the one-knob sweep; median "
              f"{noisy['repeats_median']} rounds of repeated benchmark runs (no load); "
              f"benchmark runs in all (every level of every run): median "
              f"{noisy['runs_median']}, max {noisy['runs_max']}; reference-box time median "
              f"{noisy['ref_wall_median'] / 3600:.2f} h, max "
              f"{noisy['ref_wall_max'] / 3600:.2f} h")
    for rule, noisy in (r.get("fleet_noisy") or {}).items():
        n = noisy["seeds"]
        print(f"  fleet of {len(r['host_noise'])} (run sd "
              f"{', '.join(f'{100 * x:g} %' for x in r['host_noise'])}), {rule}: " + "; ".join(
                  f"{objective} {one}/{n} within 1 %, {three}/{n} within 3 %"
                  for objective, (one, three) in noisy["within"].items())
              + f"; benchmark runs median {noisy['runs_median']}, loads median "
              f"x{noisy['loads_ratio_median']:.2f} of the sweep")
    return ok


if __name__ == "__main__":
    sys.exit(main())
