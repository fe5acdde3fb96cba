"""A host's last benchmark run from the controller's results directory, for the monitor
plan's thresholds and labels (the serve deploy writes results/<host>/)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from gpuserve.errors import GpuserveError
from gpuserve.fleet.status import last_run
from gpuserve.measure.results import ResultRecord, read_results, safe_name, validate_results_dir
from gpuserve.serve.running import Running, running_of_records


class Recorded(NamedTuple):
    """What the controller's records say of a host, for the monitor plan."""

    run: ResultRecord | None = None  # the last run (thresholds, the gpu label)
    running: Running | None = None  # what runs, by the last passing deploy's record
    removed: str | None = None  # when deploy/remove.py took its server off, if since
    error: str | None = None  # why the records could not be read


def recorded(name: str, data: dict) -> Recorded:
    """The host's records under its results directory (empty with recording off or no
    records yet; gpuserve/serve/running.py ``running_of_records``, and a removal marked
    after the newest record: gpuserve/operate/monitor_note.py)."""
    from gpuserve.monitor.removed import removed_after
    from gpuserve.serve.checks import DEFAULTS, results_root

    try:
        directory = validate_results_dir(data.get("results_dir", DEFAULTS["results_dir"]),
                                         "results_dir")
        if directory is None:
            return Recorded()
        host_dir = results_root(directory) / safe_name(name)
        if not Path(host_dir).is_dir():
            return Recorded()
        records = read_results(host_dir)
        newest = max((r.timestamp for r in records if r.timestamp), default=None)
        removed = removed_after(host_dir, newest)
        return Recorded(last_run(records, name),
                        None if removed else running_of_records(records, name), removed)
    except (GpuserveError, OSError) as exc:
        return Recorded(error=str(exc))
