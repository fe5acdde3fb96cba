"""Throughput checks after the health gate: SGLang's own benchmark client, per scenario,
recorded on the controller and gated.

Why this shape: a benchmark takes minutes, so it runs only when the served configuration
differs from the one the host last passed (its mark), runs in the background on the host
while the deploy polls it and prints progress, and every finished run is recorded, even
one that fails its gate: nothing measured is lost.

How: docs/benchmarks.md, "gpuserve.roles.checks.bench: when, how and the gate"
"""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import host, logger
from pyinfra.api import FactBase, StringCommand

from gpuserve.errors import InputError
from gpuserve.facts.base import print_file
from gpuserve.launch.bench import (
    RunStatus,
    Scenario,
    parse_status,
    progress_line,
)
from gpuserve.measure.results import (
    RecordSpec,
    read_results,
    safe_name,
)
from gpuserve.roles.prefetch import Read
from gpuserve.serve.checks import mark_path, results_root


class BenchMark(FactBase):
    """The configuration the host last measured and passed (``fingerprint``), or None."""

    def command(self, path: str) -> str:
        return f"{print_file(shlex.quote(path))} || true"

    def process(self, output: list[str]) -> str | None:
        try:
            doc = json.loads("\n".join(output))
        except json.JSONDecodeError:
            return None
        return doc.get("fingerprint") if isinstance(doc, dict) else None


class BenchStatus(FactBase):
    """One ``sglang_bench.py status`` report (JSON text); a read."""

    def command(self, script: str, run_dir: str) -> str:
        return " ".join(shlex.quote(a) for a in ("python3", script, "status", "--run-dir",
                                                 run_dir))

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def _script_command(script: str, *args: str) -> StringCommand:
    return StringCommand(" ".join(shlex.quote(a) for a in ("python3", script, *args)))


def _results_for(record: RecordSpec | None) -> list:
    if record is None:
        return []
    directory = results_root(record.results_dir) / safe_name(host.name)
    if not directory.is_dir():
        return []
    try:
        return read_results(directory)
    except InputError as e:
        logger.warning(f"{host.name}: bench: earlier records not read ({e}); no regression "
                       "baseline")
        return []


def _poll(script: str, run_dir: str, scenario: Scenario, timeout: float, interval: float,
          report_every: float) -> tuple[RunStatus, bool]:
    """Poll until the run ends or ``timeout`` passes: (last status, timed out)."""
    start = time.monotonic()
    last_report, last_done = -report_every, -1
    while True:
        status = parse_status(host.get_fact(BenchStatus, script=script, run_dir=run_dir))
        if status.state != "running":
            return status, False
        if time.monotonic() - start > timeout:
            return status, True
        elapsed = time.monotonic() - start
        if elapsed - last_report >= report_every or (
                status.done != last_done and elapsed - last_report >= report_every / 3):
            logger.info(progress_line(host.name, scenario, status))
            last_report, last_done = elapsed, status.done
        time.sleep(interval)


def reads(home: str) -> list[Read]:
    """What :func:`throughput_checks` reads before deciding to run, for the prefetch."""
    return [Read.of(BenchMark, path=mark_path(home))]
