"""Where gpuserve's own files are: one place, so moving a module never breaks a data path.

gpuserve runs two ways (docs/deploys.md): from a checkout of the repository (editable
install: ``roles/`` and ``templates/`` beside the package) or installed from the wheel
(``gpuserve.roles`` and ``gpuserve.templates`` inside it). Relative paths a user gives
(host data ``results_dir``, a bare profile name) start at the repository root in a
checkout and at the current working directory (the user's pyinfra project) otherwise.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# Catalogs, locks, model records, rules, host tables and the scripts run on hosts.
DATA_DIR = PACKAGE_DIR / "data"
# The model architecture records (one YAML per architecture) the planner and doctor read.
MODELS_DIR = DATA_DIR / "models"
# The draft model records (EAGLE heads, small STANDALONE drafts) the planner charges.
DRAFT_MODELS_DIR = MODELS_DIR / "drafts"
# Stdlib-only scripts the roles upload to hosts (probe, smoke, redact, verify).
SCRIPTS_DIR = DATA_DIR / "scripts"
# The repository this package runs from, or None when it runs installed from the wheel.
CHECKOUT: Path | None = (
    PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "pyproject.toml").is_file()
    and (PACKAGE_DIR.parent / "roles" / "__init__.py").is_file() else None)
# The Jinja templates of units and config files: templates/ in a checkout, the data
# package gpuserve.templates (the same files, mapped by pyproject.toml) in the wheel.
TEMPLATES_DIR = CHECKOUT / "templates" if CHECKOUT else PACKAGE_DIR / "templates"
# Where relative paths start: the repository root in a checkout; else the relative path
# "." (so the current working directory when the path is used: the user's project).
PROJECT_ROOT = CHECKOUT or Path()
# The launch profiles bare names resolve to: profiles/ of the repository, or of the
# current working directory when installed.
PROFILES_DIR = PROJECT_ROOT / "profiles"


def model_record_names() -> list[str]:
    """The names of the shipped model records (``model.arch`` values), sorted."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def draft_record_names() -> list[str]:
    """The names of the shipped draft records (``speculative.draft_arch`` values), sorted."""
    return sorted(p.stem for p in DRAFT_MODELS_DIR.glob("*.yaml"))
