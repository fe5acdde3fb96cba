"""The serve deploy's checks, as decided at prepare time: their host data, where the
controller keeps result records, and the throughput checks' plan. Pure: roles/checks
runs the health gate, the smoke completion and the throughput checks from these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuserve.launch.bench import BenchMode, BenchSpec, OnRegression
from gpuserve.paths import PROJECT_ROOT

DEFAULTS = {
    # seconds to wait for /health == 200 after a (re)start before failing the host
    # accepts: int or float (seconds, at most 86400)
    "health_timeout": 900,
    # controller directory for result records (results/<host>/<time>-smoke-<profile>.json,
    # see gpuserve/measure/results.py); relative to the repository root, or to the current
    # working directory when gpuserve runs installed from the wheel; "" records nothing
    # accepts: str (a path; "" turns recording off)
    "results_dir": "results",
    # throughput checks (roles/checks/bench.py): auto = when the served configuration is
    # new to the host, always, or off
    # accepts: str: auto, always or off
    "bench": "auto",
    # a missed throughput gate: report (keep serving) or rollback; None = the profile's
    # bench.on_regression, else report
    # accepts: str (report or rollback) or None
    "on_regression": None,
    # memory fit from the checkpoint's headers + the doctor's rules, before any change
    # (gpuserve/serve/preflight.py): enforce, warn or off
    # accepts: str: enforce, warn or off
    "preflight": "enforce",
    # the output-quality check of a new launch (roles/checks/quality.py, docs/quality.md);
    # false skips it on this host (the profile's quality.check turns it off everywhere)
    # accepts: bool
    "quality_check": True,
}

def results_root(results_dir: str) -> Path:
    """``results_dir`` as a controller path: relative ones start at the repository root
    in a checkout; installed from the wheel, at the current working directory (the user's
    pyinfra project: ``gpuserve.paths.PROJECT_ROOT``)."""
    path = Path(results_dir).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


@dataclass(frozen=True)
class BenchPlan:
    """Everything the throughput checks need, decided at prepare time (gpuserve/plans/serve.py)."""

    mode: BenchMode
    spec: BenchSpec
    fingerprint: str  # run_fingerprint(launch hash, lock, scenarios)
    on_regression: OnRegression
    profile: str
    python: str  # the SGLang venv's interpreter
    user: str  # the service user the client runs as
    port: int
    served_name: str
    tokenizer: str  # the model directory
    config_path: str  # the server's --config file (API key), "" when none
    runs_dir: str  # <home>/bench: one directory per run
    mark_path: str

    def __repr__(self) -> str:  # operation arguments are logged: keep it short
        return f"BenchPlan({self.profile}, {self.mode})"


def mark_path(home: str) -> str:
    """Where the host keeps the configuration it last measured and passed."""
    return f"{home}/bench/last-pass.json"
