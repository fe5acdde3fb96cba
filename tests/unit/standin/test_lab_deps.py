"""`python -m lab deps` decides what to install from dpkg's real database."""

from __future__ import annotations

import shutil

import pytest

from lab.deps import PACKAGES, missing_packages


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg")
def test_missing_packages_uses_dpkg_status():
    assert missing_packages(("dpkg",)) == []
    assert missing_packages(("dpkg", "gpuserve-no-such-package")) == [
        "gpuserve-no-such-package"]


def test_package_list_covers_the_tools_the_lab_runs():
    for pkg in ("qemu-system-x86", "qemu-utils", "debootstrap", "parted", "e2fsprogs",
                "openssh-client"):
        assert pkg in PACKAGES
