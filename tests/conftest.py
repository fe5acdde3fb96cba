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
    """Every test runs as pyinfra runs: gevent-patched before the first one starts.

    pyinfra's CLI package monkey-patches the process with gevent when it is first
    imported (pyinfra_cli/__init__.py: ``monkey.patch_all()``). Collection already
    imports it in most runs (test modules import deploy code); where it did not, a unit
    test loading an inventory in-process (``gpuserve check``) imported it after another
    test had started threads (the Hub stand-in's servers), and the patch broke the
    import lock ("cannot release un-acquired lock"). So it is imported here, after
    collection and before any test, whatever the selection or order.
    """
    import pyinfra_cli  # noqa: F401  (the patch is the point)
