"""Shared test helpers for every tier."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


def pytest_collection_finish(session: pytest.Session) -> None:
    """Unit tests run as pyinfra runs: gevent-patched before the first one starts.

    pyinfra's CLI package monkey-patches the process with gevent when it is first
    imported (pyinfra_cli/__init__.py: ``monkey.patch_all()``). Unit tests that load
    inventories in-process (``gpuserve check``) import it; done after another test has
    started threads (the Hub stand-in's servers), the patch breaks the import lock
    ("cannot release un-acquired lock"). So a run that selected any unit test is
    patched here, after collection and before any test; a lab-only run (the lab tiers,
    whose traffic and watchdogs are real threads) is left as it is.
    """
    unit = Path(__file__).resolve().parent / "unit"
    if any(Path(str(item.path)).is_relative_to(unit) for item in session.items):
        import pyinfra_cli  # noqa: F401  (the patch is the point)
