"""The thresholds a launch's quality check applies: the profile's ``quality:`` block,
parsed with the profile (gpuserve/launch/quality_spec.py, so that the profile loader
needs nothing of this package); defaults and their sources: docs/quality.md."""

from __future__ import annotations

from gpuserve.launch.quality_spec import QualitySpec, parse_quality

__all__ = ["QualitySpec", "parse_quality"]
