"""The remove deploy's mark on the controller: the host's server was removed.

Why: the monitor's targets come from the inventory; the remove deploy writes
``results/<host>/.removed`` (the UTC time; the records stay) so that the monitor plan
leaves out the SGLang target of a host marked removed after its newest record, and a
serve deploy's next record brings it back (gpuserve/operate/monitor_note.py says so).
"""

from __future__ import annotations

from pathlib import Path

REMOVED_MARKER = ".removed"


def removed_marker(name: str, data: dict, source: str) -> Path | None:
    """Where the remove deploy marks ``name`` removed; None with recording off."""
    from gpuserve.measure.results import safe_name, validate_results_dir
    from gpuserve.serve.checks import DEFAULTS, results_root

    directory = validate_results_dir(data.get("results_dir", DEFAULTS["results_dir"]), source)
    return None if directory is None else results_root(directory) / safe_name(name) / \
        REMOVED_MARKER


def mark_removed(path: Path, when: str) -> None:
    """Write the marker (the UTC time of the removal), creating the host's directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(when + "\n", encoding="utf-8")


def removed_after(host_dir: Path, newest_record: str | None) -> str | None:
    """The removal's time when ``host_dir`` holds a marker newer than the host's newest
    record (``newest_record``: its timestamp; None: no record), else None."""
    try:
        when = (host_dir / REMOVED_MARKER).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return when if when and (newest_record is None or when > newest_record) else None


def marked_since_last_record(marker: Path) -> bool:
    """Whether ``marker`` already says the host was removed after its newest record (a
    rerun of the remove deploy then changes nothing)."""
    from gpuserve.errors import GpuserveError
    from gpuserve.measure.results import read_results

    if not marker.is_file():
        return False
    try:
        records = read_results(marker.parent)
    except (GpuserveError, OSError):
        return False
    newest = max((r.timestamp for r in records if r.timestamp), default=None)
    return removed_after(marker.parent, newest) is not None
