"""Where gpuserve's own files are: one place, so moving a module never breaks a data path."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# Catalogs, locks, model records, rules, host tables and the scripts run on hosts.
DATA_DIR = PACKAGE_DIR / "data"
# Stdlib-only scripts the roles upload to hosts (probe, smoke, redact, verify).
SCRIPTS_DIR = DATA_DIR / "scripts"
# The shipped launch profiles live beside the package in the repository.
PROFILES_DIR = PACKAGE_DIR.parent / "profiles"
