"""A host's last benchmark run from the controller's results directory, for the monitor
plan's thresholds and labels (the serve deploy writes results/<host>/)."""

from __future__ import annotations

from pathlib import Path

from gpuserve.errors import GpuserveError
from gpuserve.fleet.status import last_run
from gpuserve.measure.results import ResultRecord, read_results, safe_name, validate_results_dir
from gpuserve.serve.running import Running, running_of_records


def recorded(name: str, data: dict) -> tuple[ResultRecord | None, Running | None, str | None]:
    """(the last run, what runs by the last passing deploy's record, None), or (None,
    None, why the records could not be read); Nones when recording is off or the host
    has no records yet (gpuserve/serve/running.py ``running_of_records``)."""
    from gpuserve.serve.checks import DEFAULTS, results_root

    try:
        directory = validate_results_dir(data.get("results_dir", DEFAULTS["results_dir"]),
                                         "results_dir")
        if directory is None:
            return None, None, None
        host_dir = results_root(directory) / safe_name(name)
        if not Path(host_dir).is_dir():
            return None, None, None
        records = read_results(host_dir)
        return last_run(records, name), running_of_records(records, name), None
    except (GpuserveError, OSError) as exc:
        return None, None, str(exc)
