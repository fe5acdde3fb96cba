"""Fixtures for the lab's stand-in wheels: a published mirror, its locks, a fake guest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import sglang_standin, torch_standin

REPO = Path(__file__).resolve().parents[3]
NVIDIA_REPO = REPO / "lab" / "nvidia_repo"
# Any attempt to reach the network goes to a closed local port and fails at once.
OFFLINE_ENV = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
               "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
               "no_proxy": "", "NO_PROXY": ""}


@pytest.fixture(scope="session")
def sglang_wheels(tmp_path_factory) -> Path:
    """A ``wheels/`` directory holding every SGLang stand-in wheel (one publish per run)."""
    mirror = tmp_path_factory.mktemp("sglang-mirror")
    sglang_standin.publish(mirror)
    return mirror / "wheels"


def standin_site(wheels: Path, version: str, tmp_path_factory) -> Path:
    """The stand-in wheel of ``version`` unpacked: a directory to put on PYTHONPATH."""
    site = tmp_path_factory.mktemp("site-" + version.replace("+", "-"))
    with zipfile.ZipFile(wheels / sglang_standin.wheel_name(version)) as zf:
        zf.extractall(site)
    return site


@pytest.fixture(scope="session")
def site23(sglang_wheels, tmp_path_factory) -> Path:
    return standin_site(sglang_wheels, "0.5.23+lab", tmp_path_factory)


@pytest.fixture(scope="session")
def site19(sglang_wheels, tmp_path_factory) -> Path:
    return standin_site(sglang_wheels, "0.5.19+lab", tmp_path_factory)


@pytest.fixture(scope="session")
def offline_env() -> dict[str, str]:
    """Environment that sends any HTTP(S) attempt to a closed local port."""
    return dict(OFFLINE_ENV)


@pytest.fixture(scope="session")
def standin_mirror(tmp_path_factory) -> Path:
    """A mirror root whose ``wheels/`` holds every stand-in wheel (torch stack, sglang)
    and the real huggingface-hub closure the sglang stand-in requires (from the lab's
    download cache; fetched from PyPI once, as `python -m lab up` does)."""
    import urllib.error

    from lab import locks

    root = tmp_path_factory.mktemp("standin-mirror")
    torch_standin.publish(root)
    sglang_standin.publish(root)
    try:
        locks.publish_hub_client(root)
    except (urllib.error.URLError, OSError) as exc:
        pytest.skip(f"the real huggingface-hub wheels are neither cached under "
                    f"{locks.pypi_cache()} nor downloadable here: {exc}")
    return root


@pytest.fixture(scope="session")
def lab_locks(standin_mirror, tmp_path_factory) -> Path:
    """``lab.locks.publish`` over the stand-in mirror: tools/gen_lock.py, offline."""
    from lab import locks

    env = {**OFFLINE_ENV, "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache"))}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        locks.publish(standin_mirror)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return locks.locks_dir(standin_mirror)


@dataclass
class Guest:
    """torch 2.14.1+lab and sglang 0.5.23+lab unpacked into ``site``, the guest's files
    (/etc/gpuserve-lab/box, /etc/gpuserve-lab/torch-no-cuda) at temporary paths, and a
    ``bin`` directory first on PATH for nvidia-smi."""

    site: Path
    fault: Path
    bin: Path
    box: Path

    def lab_smi(self, box: str, driver: str = "580.126.20") -> None:
        """The lab's stand-in nvidia-smi (committed boxes) as ``nvidia-smi``, on ``box``."""
        script = (NVIDIA_REPO / "files" / "nvidia-smi").read_text()
        script = script.replace("@DRIVER_VERSION@", driver)
        script = script.replace("/usr/share/gpuserve-lab/boxes", str(NVIDIA_REPO / "boxes"))
        script = script.replace("/etc/gpuserve-lab/box", str(self.box))
        script = script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1)
        self.box.write_text(box + "\n")
        smi = self.bin / "nvidia-smi"
        smi.write_text(script)
        smi.chmod(0o755)

    def fake_smi(self, stdout: str, rc: int = 0) -> None:
        """An nvidia-smi that prints ``stdout`` (printf escapes) and exits ``rc``."""
        smi = self.bin / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '{stdout}'\nexit {rc}\n")
        smi.chmod(0o755)

    def run(self, code: str, env: dict | None = None, path: str | None = None) -> dict:
        """Run ``code`` with the guest's site and PATH; its last stdout line as JSON."""
        full = {"PYTHONPATH": str(self.site),
                "PATH": path if path is not None else f"{self.bin}:/usr/bin:/bin"}
        full.update(env or {})
        out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def guest(standin_mirror, tmp_path) -> Guest:
    site = tmp_path / "site"
    for name in (torch_standin.wheel_name("2.14.1+lab"),
                 sglang_standin.wheel_name("0.5.23+lab")):
        with zipfile.ZipFile(standin_mirror / "wheels" / name) as zf:
            zf.extractall(site)
    standin = site / "torch" / "_standin" / "__init__.py"
    fault = tmp_path / "torch-no-cuda"
    text = standin.read_text()
    assert "/etc/gpuserve-lab/torch-no-cuda" in text
    standin.write_text(text.replace("/etc/gpuserve-lab/torch-no-cuda", str(fault)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return Guest(site=site, fault=fault, bin=bin_dir, box=tmp_path / "box")
