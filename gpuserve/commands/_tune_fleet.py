"""``gpuserve tune INVENTORY TUNE.yaml --limit gpu1,gpu2``: one search over several hosts.

The I/O of a fleet's tune: the inventory's hosts compared before any connection, one
read-only snapshot per host (side by side) compared before any load, one serve-deploy
executor per host (gpuserve/commands/tune.py) under gpuserve/tune/schedule.py's
:class:`Fleet`, records per host under ``--results/<host>/``, and each host left as
``--leave`` says. docs/tune.md, "A fleet in parallel".
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuserve.errors import GpuserveError, InputError
from gpuserve.measure.record_files import safe_name
from gpuserve.measure.results import read_results, utc_now
from gpuserve.tune.outcome import Outcome
from gpuserve.tune.sameness import data_fields, require_same, snapshot_fields
from gpuserve.tune.schedule import Fleet, join_all
from gpuserve.tune.search import run_search
from gpuserve.tune.session import comm_from, prepare
from gpuserve.tune.snapshot import HostSnapshot, draft_data, parse_snapshot


class FleetStore:
    """Outcomes under the directory of the host that measured them; a rerun finds them
    on any host's (gpuserve/commands/tune.py ``FileStore`` per host)."""

    def __init__(self, stores: dict[str, Any], fleet: Fleet):
        self.stores, self.fleet = stores, fleet

    def get(self, name: str) -> Outcome | None:
        return next((o for o in (s.get(name) for s in self.stores.values()) if o), None)

    def put(self, outcome: Outcome) -> None:
        host = (self.fleet.current() or self.fleet.hosts[0]).name
        if outcome.loaded:
            outcome.numbers["host"] = host
        self.stores[host].put(outcome)


def side_by_side(names: list[str], work: Callable[[str], Any]) -> dict[str, Any]:
    """``work(name)`` for every host at once: each result, or the exception it raised
    (Ctrl-C waits for every one to end)."""
    out: dict[str, Any] = {}

    def one(name: str) -> None:
        try:
            out[name] = work(name)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out[name] = e

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    if join_all(threads):
        raise KeyboardInterrupt
    return out


def check_inventory(args: argparse.Namespace, names: list[str]) -> None:
    """Every ``--limit`` host is in the inventory, and their host data agree on what
    chooses the SGLang build and the driver/CUDA lane: before any connection."""
    from gpuserve.commands.check import load_hosts, parse_data

    hosts = dict(load_hosts(args.inventory, parse_data(args.data))[0])
    unknown = [n for n in names if n not in hosts]
    if unknown:
        raise InputError(args.inventory, "--limit", f"unknown host {unknown[0]!r:.80}; the "
                         f"inventory's hosts: {', '.join(list(hosts)[:20])}")
    require_same(args.inventory, [(n, data_fields(hosts[n])) for n in names],
                 "inventory host data")


@dataclass(frozen=True)
class Parts:
    """The one host's tune's pieces (gpuserve/commands/tune.py), one per host here."""

    runner: Callable[..., Any]  # PyinfraRunner
    executor: Callable[..., Any]  # PyinfraExecutor
    store: Callable[..., Any]  # FileStore
    report: Callable[..., None]
    leave: Callable[..., None]
    snapshot_op: str


def snapshots(args, runners: dict, spec, work: Path, op: str, extra: tuple[str, ...] = ()
              ) -> dict[str, HostSnapshot]:
    """Each host's read-only snapshot, side by side; compared before any load."""
    names = list(runners)
    paths = {n: work / f"snapshot-{safe_name(n)}.json" for n in names}
    print(f"tune {spec.name}: reading {len(names)} hosts (one read-only run each, side by "
          "side)", flush=True)
    done = side_by_side(names, lambda n: runners[n].deploy(
        op, f"profile={spec.incumbent}", f"tune_snapshot={paths[n]}", *extra))
    for name in names:
        result = done[name]
        if isinstance(result, BaseException):
            raise result
        rc, out = result
        if rc != 0:
            raise GpuserveError(f"tune {spec.name}: the snapshot of {name} failed (nothing "
                                "changed):\n" + "\n".join(out.splitlines()[-15:]))
    snaps = {n: parse_snapshot(paths[n]) for n in names}
    require_same(args.inventory, [(n, snapshot_fields(snaps[n])) for n in names],
                 "as each host's read-only snapshot found them, before any load")
    return snaps


def run_fleet(args: argparse.Namespace, spec, raw_knobs, names: list[str], parts: Parts
              ) -> int:
    check_inventory(args, names)
    results = Path(args.results).resolve()
    work = results / ".tune" / spec.name
    stopping = threading.Event()
    runners = {n: parts.runner(args, results, limit=n, stopping=stopping) for n in names}
    snaps = snapshots(args, runners, spec, work, parts.snapshot_op,
                      tuple(draft_data(spec, raw_knobs)))
    dirs = {n: results / safe_name(n) / f"tune-{spec.name}" for n in names}
    executors = {n: parts.executor(runners[n], spec, dirs[n], snaps[n].host,
                                    work / f"snapshot-{safe_name(n)}.json") for n in names}
    for name in names[1:]:  # the first host's start calibrates; the others' would wait
        executors[name].calibrates = False  # for a read-only run whose figure is unused
    fleet = Fleet(executors, log=lambda line: _say(fleet, line))
    fleet.stopping = stopping
    ref = snaps[names[0]]
    measures: list[dict] = []
    if (results / safe_name(ref.host)).is_dir():
        read_results(results / safe_name(ref.host), [], measures)
    prepared = prepare(spec, raw_knobs, ref, comm=comm_from(measures, ref.host,
                                                            ref.host_facts),
                       log=fleet.log, stamp=utc_now,
                       extra_key="|".join(sorted(args.data)) + "|fleet=" + ",".join(names))
    store = FleetStore({n: parts.store(dirs[n], spec.name) for n in names}, fleet)
    tune = run_search(spec, prepared.knobs, prepared.ctx, fleet, store)
    stopping.clear()
    parts.report(tune, prepared, dirs[names[0]], args)
    _record(fleet, tune, dirs[names[0]] / f"{spec.name}-fleet.json")
    errors = side_by_side(names, lambda n: parts.leave(tune, runners[n], dirs[names[0]], args))
    failed = [n for n, e in errors.items() if isinstance(e, BaseException)]
    if failed:
        raise InputError(args.inventory, None, f"the final switch failed on "
                         f"{', '.join(failed)}; each is on the last profile that passed its "
                         "health gate (see above)")
    return 130 if tune.tally.interrupted else 0


def _say(fleet: Fleet, line: str) -> None:
    host = fleet.current()
    print(f"[{host.name}] {line}" if host else line, flush=True)


def _record(fleet: Fleet, tune, path: Path) -> None:
    """The fleet's own record beside the winners: hosts, loads and candidates per host,
    each host's noise and scale."""
    doc = {"schema": "gpuserve.tune-fleet/1", "tune": tune.spec.name, "taken": utc_now(),
           "hosts": [{"host": h.name, "loads": h.loads, "dropped": h.dropped or None,
                      "incumbent_tok_s": {str(c): h.throughput(c) for c in sorted(h.runs)}}
                     for h in fleet.hosts],
           "phases": fleet.assigned, "noise": fleet.noise_lines(),
           "loads": tune.tally.loads}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"fleet: {path}")
    for line in doc["noise"]:
        print(line)
