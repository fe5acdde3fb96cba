"""The quality records beside the throughput records (``gpuserve compare``): the latest
quality check per host and profile, found under the directories compare reads."""

from __future__ import annotations

from pathlib import Path

from gpuserve.quality.judge import failed_findings
from gpuserve.quality.record import QUALITY_DIR, SCHEMA, newest_runs
from gpuserve.table import table


def _roots(paths: list[str]) -> list[Path]:
    """The results roots among ``paths`` holding quality records (a results_dir, or its
    ``quality`` folder itself)."""
    roots = []
    for p in map(Path, paths):
        if (p / QUALITY_DIR).is_dir():
            roots.append(p)
        elif p.name == QUALITY_DIR and p.is_dir():
            roots.append(p.parent)
    return roots


def latest_quality(paths: list[str], host: str | None = None,
                   profile: str | None = None) -> list[dict]:
    """One row per (host, profile): its newest check's verdict and headline figures."""
    latest: dict[tuple[str, str], dict] = {}
    for root in _roots(paths):
        for path, run in newest_runs(root, host):
            if profile and run.profile != profile:
                continue
            key = (run.host, run.profile)
            if key in latest and latest[key]["timestamp"] >= run.timestamp:
                continue
            latest[key] = {
                "host": run.host, "profile": run.profile, "timestamp": run.timestamp,
                "passed": bool(run.verdict.get("passed")), "reference": run.reference,
                "failed": [f["metric"] for f in failed_findings(run.verdict)],
                "figures": run.figures, "source": str(path)}
    return [latest[k] for k in sorted(latest)]


def _fig(figures: dict, key: str, digits: int = 4) -> str:
    value = figures.get(key)
    return "-" if value is None else f"{value:.{digits}g}"


def format_quality(rows: list[dict]) -> str:
    """A table: host, profile, verdict, KLD mean/p99, greedy agreement, task accuracy."""
    if not rows:
        return ""
    head = ("host", "profile", "quality", "KLD mean", "KLD p99", "greedy", "accuracy",
            "reference")
    cells = [head]
    for r in rows:
        f = r["figures"]
        acc = " ".join(f"{k.removesuffix('_accuracy')} {f[k]:.2f}" for k in sorted(f)
                       if k.endswith("_accuracy") and f[k] is not None) or "-"
        verdict = "pass" if r["passed"] else "FAIL " + ",".join(r["failed"])
        cells.append((r["host"], r["profile"], verdict, _fig(f, "kld_mean"),
                      _fig(f, "kld_p99"), _fig(f, "greedy_agreement", 2), acc,
                      r["reference"] or "none (sanity only)"))
    lines = table([[str(c) for c in row] for row in cells], rule=False)
    return "\n".join(["quality (the latest check per host and profile; docs/quality.md)",
                      *lines])


#: compare's note for a quality record it read as a result file
SKIP_NOTE = f"'{SCHEMA}'"
