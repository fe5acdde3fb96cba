"""The one version comparison (gpuserve/versions.py) and the modules that sort by it."""

from __future__ import annotations

import dataclasses

import pytest

from gpuserve import versions
from gpuserve.launch import catalog, dialect
from gpuserve.launch.lock_choice import HostRuntime, choose_lock, driver_ok
from gpuserve.launch.locks import available_locks
from gpuserve.measure import bench_catalog


def test_releases_post_releases_pre_releases_and_local_builds_in_order():
    ordered = ["0.5.9", "0.5.10", "0.5.10.post1", "0.5.19", "0.5.24rc0", "0.5.24",
               "0.5.24+lab", "0.6.0.dev1", "0.6.0"]
    shuffled = [ordered[i] for i in (5, 0, 8, 3, 6, 1, 7, 4, 2)]
    assert versions.ordered(shuffled) == ordered
    assert versions.newest(shuffled) == "0.6.0"


def test_a_pre_release_is_older_than_its_release_and_a_local_build_newer():
    assert versions.parse("0.5.24rc0") < versions.parse("0.5.24")
    assert versions.parse("0.5.24") < versions.parse("0.5.24+lab")
    assert versions.public("0.5.24+lab") == "0.5.24"
    assert versions.parse("v0.5.23") == versions.parse("sglang==0.5.23")


def test_driver_versions_compare_per_field_numerically():
    assert versions.at_least("580.65.06", "580.65.6")
    assert versions.at_least("580.126.20", "580.65.06")
    assert not versions.at_least("575.57.08", "580.65.06")


def test_loose_reads_a_tool_version_and_says_none_for_none():
    assert versions.loose("V12.8.93") == versions.parse("12.8.93")
    assert versions.loose("Cuda compilation tools, release 13.0") == versions.parse("13.0")
    assert versions.loose(None) is None
    assert versions.loose("unknown") is None


def test_not_a_version_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="'five'"):
        versions.parse("five")


def test_catalogs_with_a_pre_release_sort_without_type_error(tmp_path, monkeypatch):
    # the old key mixed int and str parts: (0, 5, 24) against (0, 5, '24rc0') raised
    for version in ("0.5.23", "0.5.24rc0", "0.5.10.post1", "0.5.24"):
        (tmp_path / f"sglang-{version}.json").write_text("{}")
    monkeypatch.setattr(catalog, "_catalog_dir", lambda: tmp_path)
    assert catalog.available_versions() == ["0.5.10.post1", "0.5.23", "0.5.24rc0", "0.5.24"]


def test_bench_catalogs_sort_pre_releases_first(tmp_path, monkeypatch):
    for version in ("0.5.24", "0.5.24rc1", "0.5.9"):
        (tmp_path / f"sglang-{version}-serving.json").write_text("{}")
    monkeypatch.setattr(bench_catalog, "_catalog_dir", lambda: tmp_path)
    assert bench_catalog.available_bench_versions() == ["0.5.9", "0.5.24rc1", "0.5.24"]


def test_dialect_rules_hold_post_releases_inside_their_range():
    rule = dialect.Rule(since="0.5.15", until="0.5.21")
    assert rule.applies("0.5.15.post1") and rule.applies("0.5.21")
    assert not rule.applies("0.5.14") and not rule.applies("0.5.21.post1")
    assert dialect.Rule(since="0.5.24").applies("0.5.24+lab")
    assert not dialect.Rule(since="0.5.24").applies("0.5.24rc0")


def _runtime(driver: str) -> HostRuntime:
    return HostRuntime(name="h", python="3.11", glibc="2.36", driver=driver,
                       cuda_toolkit=None, free_bytes=None, gpus=1)


def test_the_lock_choice_takes_a_release_over_its_pre_release_and_a_local_build_over_both():
    base = next(lk for lk in available_locks() if lk.sglang == "0.5.23" and lk.python == "3.11")
    rc, local = (dataclasses.replace(base, sglang=v) for v in ("0.5.24rc0", "0.5.23+lab"))
    release = dataclasses.replace(base, sglang="0.5.24")
    runtime = _runtime("580.126.20")
    assert choose_lock([rc, release, base], runtime, versions=None, pinned=None,
                       profile="p").sglang == "0.5.24"
    assert choose_lock([local, base, rc], runtime, versions=None, pinned=None,
                       profile="p").sglang == "0.5.24rc0"
    assert choose_lock([base, local], runtime, versions=None, pinned=None,
                       profile="p").sglang == "0.5.23+lab"
    assert driver_ok(base, "580.126.20") and not driver_ok(base, "570.195.03")

