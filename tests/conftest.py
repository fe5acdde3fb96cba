"""Shared test helpers for every tier."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
