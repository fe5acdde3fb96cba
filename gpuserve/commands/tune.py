"""``gpuserve tune INVENTORY TUNE.yaml``: search a host's launch space with the serve deploy.

Why a driver around pyinfra rather than one deploy: pyinfra builds every operation of a
run before it executes any, while a tune's next candidate depends on the last
measurement. So each candidate is one run of the real serve deploy (``pyinfra -y
INVENTORY gpuserve.roles.deploys.serve_sglang --data profile=<candidate file>``): render,
on-host preflight, install, switch with health gate and rollback, smoke, SGLang's own
benchmark per load level, records, exactly as a user's own switch. Before that one
read-only run (``tune_snapshot``) brings the host's facts to the controller, where every
candidate is judged and pruned without loading (gpuserve/tune/). docs/tune.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import GpuserveError, InputError
from gpuserve.measure.record_files import safe_name
from gpuserve.measure.results import read_results, utc_now
from gpuserve.memory.startup_log import diagnose, parse_log
from gpuserve.tune.candidates import Candidate, profile_text, scenario_level
from gpuserve.tune.outcome import FIGURES, LoadStatus, Outcome, from_dict
from gpuserve.tune.report import plot, summary, table, winner_text
from gpuserve.tune.search import Measurement, run_search
from gpuserve.tune.session import comm_from, precheck, prepare
from gpuserve.tune.snapshot import draft_data, error_line, failed_run, last_start, parse_snapshot
from gpuserve.tune.space import OBJECTIVES, load_tune

SERVE = "gpuserve.roles.deploys.serve_sglang"
SNAPSHOT = "gpuserve.roles.deploys.tune.tune_snapshot"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_READY = re.compile(r"health: ready after (\d+) s")
_ECHO = re.compile(r": (health|smoke|bench|preflight): |gpuserve: error|rolled back|Error")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="search a host's launch space: prune, measure, pick",
                       description="Tune one host: the incumbent, one knob at a time, then "
                       "the best combinations, each through the serve deploy (docs/tune.md).")
    p.add_argument("inventory", help="pyinfra inventory (one host, or use --limit)")
    p.add_argument("tune_file", help="the tune file (profiles/tune/<name>.tune.yaml)")
    p.add_argument("--results", default="results", help="records directory (default: "
                   "results, as the serve deploy's results_dir)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="host data override passed to every deploy (pyinfra --data)")
    p.add_argument("--limit", help="the inventory host to tune, or several with the same "
                   "GPUs, lock and checkpoint, comma-separated: one search spread over them "
                   "(docs/tune.md, \"A fleet in parallel\")")
    p.add_argument("--leave", default="original", choices=("original", *OBJECTIVES),
                   help="leave the host (each host) on its original profile (default) or a "
                   "winner")
    p.add_argument("--pyinfra", default=str(Path(sys.executable).with_name("pyinfra")),
                   help="the pyinfra executable")
    p.set_defaults(func=run)


class FileStore:
    """Outcomes as ``<dir>/<candidate>.json`` (schema gpuserve.tune-candidate/1)."""

    def __init__(self, directory: Path, tune: str):
        self.directory, self.tune = directory, tune

    def get(self, name: str) -> Outcome | None:
        path = self.directory / f"{name}.json"
        if not path.exists():
            return None
        try:  # bounded, and a FIFO or a device in the results is never opened for reading
            return from_dict(safeload.load_json_file(path))
        except (InputError, ValueError):
            return None

    def put(self, outcome: Outcome) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{outcome.candidate}.tmp"
        tmp.write_text(json.dumps(outcome.to_dict(self.tune), default=str) + "\n")
        os.replace(tmp, self.directory / f"{outcome.candidate}.json")


class PyinfraRunner:
    """Runs the deploys as subprocesses, echoing their progress lines. ``limit``: the
    host (else ``--limit``); ``stopping``: a fleet's Ctrl-C, after which a deploy that
    ends (or would start) raises KeyboardInterrupt in its thread, as Ctrl-C does in the
    one host's."""

    def __init__(self, args: argparse.Namespace, results: Path, limit: str | None = None,
                 stopping=None):
        self.args, self.results = args, results
        self.limit = limit or args.limit
        self.stopping = stopping

    def _stopped(self) -> None:
        if self.stopping is not None and self.stopping.is_set():
            raise KeyboardInterrupt

    def deploy(self, op: str, *data: str) -> tuple[int, str]:
        self._stopped()
        argv = [self.args.pyinfra, "-y", self.args.inventory, op,
                "--data", f"results_dir={self.results}"]
        for item in [*self.args.data, *data]:
            argv += ["--data", item]
        if self.limit:
            argv += ["--limit", self.limit]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        assert proc.stdout is not None
        lines = []
        for raw in proc.stdout:
            line = _ANSI.sub("", raw.rstrip("\n"))
            lines.append(line)
            if _ECHO.search(line):
                print(f"    | {line.strip()}", flush=True)
        rc = proc.wait()
        self._stopped()
        return rc, "\n".join(lines)


class PyinfraExecutor:
    """The search's executor: one serve deploy per candidate load or sweep."""

    def __init__(self, runner: PyinfraRunner, spec, work: Path, host: str, snapshot_path: Path):
        self.runner, self.spec, self.work, self.host = runner, spec, work, host
        self.snapshot_path = snapshot_path
        self.good: Path | None = None  # the last candidate file that measured cleanly
        self.taken: set[str] = set()  # records already read (timestamps are to the second)
        self.calibrates = True  # reads SGLang's free memory after the incumbent's start
        # (a fleet's other hosts do not: only the first host's calibrates the planner)

    def now(self) -> float:
        return time.monotonic()

    def measure(self, candidate: Candidate, profile, levels, first: bool, repeat: int = 1
                ) -> Measurement:
        if not levels:  # no bench section would mean the profile's own scenarios
            raise ValueError(f"{candidate.name}: no load level to measure")
        path = self.work / "profiles" / f"{candidate.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        cap = profile.memory.max_running_requests
        levels = tuple(c for c in levels if cap is None or c <= cap) or tuple(levels[:1])
        path.write_text(profile_text(self.spec, candidate, path.parent, levels,
                                     repeat=repeat))
        since = utc_now()
        # the same server again (a sweep, a repeat): its benchmark must run even where
        # the bench section equals the last one (bench auto skips an unchanged one)
        rc, out = self.runner.deploy(SERVE, f"profile={path}",
                                     *([] if first else ["bench=always"]))
        if rc != 0:
            m = self._failed(out, path)
            if m.status == LoadStatus.FAILED and "rolled back to" not in m.reason:
                self.restore()
                m.reason += f"; the tune switched the host back to {self.good or 'its own'}"
            return m
        m = Measurement(LoadStatus.OK, load_s=_ready_s(out))
        self._take_records(m, candidate.name, since, levels)
        if m.status == LoadStatus.FAILED and m.reason.startswith("crashed while serving"):
            m.diagnosis = _diagnosis(self._journal(path))  # the deploy itself passed
        if first and candidate.phase == "incumbent" and self.calibrates:
            m.after_weights_gib = self._after_weights(path)
        if m.status == LoadStatus.OK:
            self.good = path
        else:
            self.restore()
        return m

    def _take_records(self, m: Measurement, name: str, since: str, levels) -> None:
        """The bench records of this run; a run whose requests did not all complete
        (the server crashed while serving) is a failure."""
        for record in self._records(name, since):
            level = scenario_level(record.scenario)
            if level not in levels or record.source in self.taken:
                continue
            self.taken.add(record.source)
            m.levels[level] = {k: record.figures.get(k) for k in FIGURES}
            m.runs.setdefault(level, []).append(m.levels[level])
            m.records.append(record.source.rsplit(":", 1)[0] if record.source else "")
            done = record.figures.get("completed")
            asked = max(2, self.spec.prompts_per_level * level)  # bench_section's count
            if isinstance(done, int | float) and asked and done < asked:
                m.status = LoadStatus.FAILED
                m.reason = (f"crashed while serving: {int(done)} of {asked} requests "
                            f"completed at concurrency {level}")
        missing = [c for c in levels if c not in m.levels]
        if missing and m.status == LoadStatus.OK:
            m.status, m.reason = LoadStatus.FAILED, (
                f"no bench record for concurrency {missing} (results_dir is "
                f"{self.runner.results}; is bench off in host data?)")

    def restore(self) -> None:
        """Switch back to the last candidate that measured cleanly (else the inventory's
        profile): the serve deploy rolls back a failed start itself, not a server that
        dies later, under load."""
        data = ["bench=off", *([f"profile={self.good}"] if self.good else [])]
        print(f"tune: switching the host back to {self.good or 'its inventory profile'}",
              flush=True)
        self.runner.deploy(SERVE, *data)

    def _records(self, profile: str, since: str):
        directory = self.runner.results / safe_name(self.host)
        if not directory.is_dir():
            return []
        return [r for r in read_results(directory) if r.kind == "bench"
                and r.profile == profile and (r.timestamp or "") >= since]

    def _after_weights(self, profile_path: Path) -> float | None:
        rc, _ = self.runner.deploy(SNAPSHOT, f"profile={profile_path}",
                                   f"tune_snapshot={self.snapshot_path}")
        if rc != 0:
            return None
        timing = last_start(parse_snapshot(self.snapshot_path).journal)
        if timing is None:
            return None
        return diagnose(parse_log(timing.log, "journal")).avail_after_weights_gib

    def _failed(self, out: str, path: Path) -> Measurement:
        """A failed deploy: its reason, the startup-log diagnosis (from the deploy's
        journal lines, else from the journal read after it) and the rollback."""
        reason = _failure_reason(out)
        refused = "Beginning operation run" not in out and (
            "preflight" in reason or "gpuserve: error" in reason)
        journal = out.split("last journal lines of", 1)[-1] if "last journal lines of" in \
            out else ""
        if not journal and not refused:
            journal = self._journal(path)
        diagnosis = _diagnosis(journal)
        rolled = re.search(r"the host was rolled back to profile (\S+)", out)
        if rolled:
            reason += f"; rolled back to {rolled.group(1).rstrip(',')}"
        return Measurement(LoadStatus.REFUSED if refused else LoadStatus.FAILED,
                           reason=reason[:600], diagnosis=diagnosis)

    def _journal(self, path: Path) -> str:
        """The service journal of the failed start (the newest recent one naming an error,
        else the last), read with the snapshot deploy."""
        rc, _ = self.runner.deploy(SNAPSHOT, f"profile={path}",
                                   f"tune_snapshot={self.snapshot_path}")
        return failed_run(parse_snapshot(self.snapshot_path).journal) if rc == 0 else ""


_FAILURE = re.compile(r"(?:\] |: )(health|bench|smoke|quality): (.*(?:failed|stopped|fatal|not "
                      r"healthy|exited|did not finish|wrote no result|ended).*)")


def _diagnosis(journal: str) -> dict | None:
    """The startup-log diagnosis of a failed start or a crash, from the service journal
    (None without one)."""
    if not journal:
        return None
    d = diagnose(parse_log(journal, "journal"))
    return {"outcome": d.outcome, "error": error_line(journal), "rest_gib": d.rest_gib,
            "avail_after_weights_gib": d.avail_after_weights_gib, "lines": d.lines[:6],
            "fixes": d.fixes[:3]}


def _failure_reason(out: str) -> str:
    for line in out.splitlines():
        m = _FAILURE.search(line)
        if m:
            return f"{m.group(1)}: {m.group(2).strip()}"
    return next((line.strip() for line in out.splitlines() if "gpuserve: error" in line),
                "the deploy failed")


def _ready_s(out: str) -> float | None:
    m = _READY.search(out)
    return float(m.group(1)) if m else None


def check_data(items: list[str]) -> None:
    """``--data`` read as pyinfra's CLI reads it (gpuserve check's parser), before any
    connection; a secret is refused: every deploy of the tune would carry it on its
    command line."""
    from gpuserve.commands.check import parse_data
    from gpuserve.launch.secrets import is_secret_env_name

    for key in parse_data(items):
        if is_secret_env_name(key):
            raise InputError("--data", key[:80], "carries a secret: set it in the inventory's "
                             "host data, never on a command line (its value is not shown)")


def run(args: argparse.Namespace) -> int:
    check_data(args.data)
    spec, raw_knobs = load_tune(args.tune_file)  # bad input: before any host is touched
    precheck(spec, raw_knobs)
    hosts = limit_hosts(args.limit)
    if len(hosts) > 1:
        from gpuserve.commands._tune_fleet import Parts, run_fleet

        return run_fleet(args, spec, raw_knobs, hosts, Parts(
            PyinfraRunner, PyinfraExecutor, FileStore, _report, _leave, SNAPSHOT))
    results = Path(args.results).resolve()
    runner = PyinfraRunner(args, results)
    work = results / ".tune" / spec.name
    snapshot_path = work / "snapshot.json"
    print(f"tune {spec.name}: reading the host (one read-only run)", flush=True)
    rc, out = runner.deploy(SNAPSHOT, f"profile={spec.incumbent}",
                            f"tune_snapshot={snapshot_path}", *draft_data(spec, raw_knobs))
    if rc != 0:
        raise GpuserveError(f"tune {spec.name}: the host snapshot failed (nothing changed):\n"
                            + "\n".join(out.splitlines()[-15:]))
    snapshot = parse_snapshot(snapshot_path)
    measures: list[dict] = []
    host_dir = results / safe_name(snapshot.host)
    if host_dir.is_dir():
        read_results(host_dir, [], measures)
    extra = "|".join(sorted(args.data))
    prepared = prepare(spec, raw_knobs, snapshot,
                       comm=comm_from(measures, snapshot.host, snapshot.host_facts),
                       log=lambda line: print(line, flush=True), stamp=utc_now,
                       extra_key=extra)
    store_dir = host_dir / f"tune-{spec.name}"
    store = FileStore(store_dir, spec.name)
    executor = PyinfraExecutor(runner, spec, store_dir, snapshot.host, snapshot_path)
    tune = run_search(spec, prepared.knobs, prepared.ctx, executor, store)
    _report(tune, prepared, store_dir, args)
    _leave(tune, runner, store_dir, args)
    return 130 if tune.tally.interrupted else 0


def limit_hosts(limit: str | None) -> list[str]:
    """``--limit``'s hosts: one, or several comma-separated (a fleet)."""
    names = [n.strip() for n in (limit or "").split(",") if n.strip()]
    if limit is not None and not names:
        raise InputError("--limit", None, "names no host")
    if len(set(names)) < len(names):
        raise InputError("--limit", None, "names a host twice")
    return names


def _report(tune, prepared, store_dir: Path, args) -> None:
    print()
    print("\n".join(table(tune)))
    print()
    print("\n".join(summary(tune)))
    for objective in tune.spec.objectives:
        top = tune.best(objective.name)
        if top is None:
            continue
        path = store_dir / f"{tune.spec.name}-{objective.name}.yaml"
        path.write_text(winner_text(tune, top, objective.name, prepared.snapshot, store_dir,
                                    prepared.knobs))
        print(f"winner {objective.name}: {path} (--data profile={path})")
    png = plot(tune, store_dir / f"{tune.spec.name}.png")
    print(f"plot: {png}" if png else "plot: skipped (matplotlib not installed)")
    print(f"compare: gpuserve compare {store_dir.parent} --tune {tune.spec.name}")


def _leave(tune, runner: PyinfraRunner, store_dir: Path, args) -> None:
    data = ["bench=off"]  # just measured; the records are there
    if args.leave != "original":
        path = store_dir / f"{tune.spec.name}-{args.leave}.yaml"
        if not path.is_file():
            print(f"tune: no winner for {args.leave}: leaving the original profile")
        else:
            data.append(f"profile={path}")
    label = next((d for d in data if d.startswith("profile=")), "the inventory's profile")
    print(f"tune: leaving the host on {label}", flush=True)
    try:
        rc, _ = runner.deploy(SERVE, *data)
    except KeyboardInterrupt:
        rc = 130
    if rc != 0:
        raise InputError(args.inventory, None, "the final switch failed; the host is on the "
                         "last profile that passed its health gate (see above)")
