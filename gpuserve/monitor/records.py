"""A host's last benchmark run from the controller's results directory, for the monitor
plan's thresholds and labels (the serve deploy writes results/<host>/)."""

from __future__ import annotations

from pathlib import Path

from gpuserve.errors import GpuserveError
from gpuserve.fleet.status import last_run
from gpuserve.measure.results import ResultRecord, read_results, safe_name, validate_results_dir


def last_recorded_run(name: str, data: dict) -> tuple[ResultRecord | None, str | None]:
    """(the last run, None), or (None, why it could not be read); (None, None) when
    recording is off or the host has no records yet."""
    from gpuserve.serve.checks import DEFAULTS, results_root

    try:
        directory = validate_results_dir(data.get("results_dir", DEFAULTS["results_dir"]),
                                         "results_dir")
        if directory is None:
            return None, None
        host_dir = results_root(directory) / safe_name(name)
        if not Path(host_dir).is_dir():
            return None, None
        return last_run(read_results(host_dir), name), None
    except (GpuserveError, OSError) as exc:
        return None, str(exc)
