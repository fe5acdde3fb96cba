"""The managed CPython operation (roles/base/interpreter.py) on a @fake host, its command
then run here for real against an archive with python-build-standalone's install_only
layout (``python/bin/python3.12``, ``python/include/python3.12/Python.h``): fetched from
a file:// URL, checked against the sha256, unpacked and stamped; a wrong hash unpacks
nothing. The archive is made by the test (a stand-in: no real CPython is fetched)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

from gpuserve.launch.interpreter import ManagedBuild, choose_interpreter, managed_builds
from gpuserve.launch.locks import available_locks
from gpuserve.roles.base.interpreter import STAMP, managed_python
from tests.unit.serve.test_service_rollback import run  # the operation on a @fake host

BUILD = dict(venv="/opt/gpuserve/venvs/0.5.23-abc", lock=next(
    lk for lk in available_locks() if lk.name == "sglang-0.5.23-cu13-py312"),
    requirements="/opt/gpuserve/locks/r.txt", pip_options=["--no-index"])


def archive(tmp: Path, headers: bool = True) -> Path:
    path = tmp / "cpython-3.12.14+20260814-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        members = {"python/bin/python3.12": b"#!/bin/sh\necho Python 3.12.14\n"}
        if headers:
            members["python/include/python3.12/Python.h"] = b"/* stand-in */\n"
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(body), 0o755
            tar.addfile(info, io.BytesIO(body))
    return path


def choice_for(tmp: Path, path: Path, sha256: str | None = None):
    real = next(b for b in managed_builds() if b.python == "3.12" and b.arch == "x86_64")
    build = ManagedBuild(**{**dataclasses.asdict(real), "filename": path.name,
                            "sha256": sha256 or hashlib.sha256(path.read_bytes()).hexdigest()})
    from gpuserve.launch.interpreter import DistroFacts

    ubuntu = DistroFacts({"ID": "ubuntu", "VERSION_ID": "22.04"}, "3.10.12")
    choice = choose_interpreter(ubuntu, {"3.11", "3.12"}, asked=None, mirror=None,
                                home=str(tmp / "home"), host="gpu1", builds=(build,))
    return dataclasses.replace(choice, url=path.as_uri())


def test_fetch_check_unpack_and_stamp(tmp_path) -> None:
    choice = choice_for(tmp_path, archive(tmp_path))
    meta, cmds = run(managed_python, {STAMP: ""}, choice=choice)
    assert meta.did_change()
    done = subprocess.run(["sh", "-c", cmds[-1]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    root = Path(choice.path).parents[1]
    assert Path(choice.path).is_file() and (root / "include/python3.12/Python.h").is_file()
    assert (root / STAMP).read_text().strip() == choice.build.sha256
    assert [p.name for p in root.parent.iterdir()] == [root.name]  # no .fetch leftovers


def test_a_wrong_hash_or_missing_headers_unpack_nothing(tmp_path) -> None:
    bad = choice_for(tmp_path, archive(tmp_path), sha256="0" * 64)
    _, cmds = run(managed_python, {STAMP: ""}, choice=bad)
    done = subprocess.run(["sh", "-c", cmds[-1]], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "is not the catalog's " + "0" * 64 in done.stderr
    assert not Path(bad.path).exists()
    (tmp_path / "h").mkdir()
    bare = choice_for(tmp_path, archive(tmp_path / "h", headers=False))
    _, cmds = run(managed_python, {STAMP: ""}, choice=bare)
    done = subprocess.run(["sh", "-c", cmds[-1]], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "lacks bin/python3.12 or Python.h" in done.stderr


def test_stamped_build_is_no_change(tmp_path) -> None:
    choice = choice_for(tmp_path, archive(tmp_path))
    meta, cmds = run(managed_python, {STAMP: choice.build.sha256}, choice=choice)
    assert meta.did_succeed() and not meta.did_change()
    assert not any("curl" in c for c in cmds)


def test_the_venv_is_built_with_the_chosen_interpreter(tmp_path) -> None:
    from gpuserve.roles.sglang import locked_venv

    choice = choice_for(tmp_path, archive(tmp_path))
    from tests.unit.serve.test_serve_checks import JOB_DONE  # the detached install, done

    _, cmds = run(locked_venv, {".gpuserve-verified": "", **JOB_DONE}, **BUILD,
                  python=choice.path)
    # uv builds the venv with it, and the pinned uv's tools venv is built with it too
    assert any(f"uv venv {BUILD['venv']} --no-config --python {choice.path} " in c
               for c in cmds)
    assert any(f"{choice.path} -m venv /opt/gpuserve/tools/uv-" in c for c in cmds)
    assert not any("python3 -m venv" in c or "--python python3" in c for c in cmds)
