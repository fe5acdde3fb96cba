"""gpuserve/data/scripts/host_job.py: the host scripts' one job runner (detached, in its
own session, its pid recorded), run for real on this machine."""

from __future__ import annotations

import importlib.util
import os
import pwd
import sys
import time
from pathlib import Path

import pytest

from gpuserve.paths import SCRIPTS_DIR


def _runner():
    spec = importlib.util.spec_from_file_location("host_job", SCRIPTS_DIR / "host_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_job_runs_detached_in_its_own_session_with_its_pid_recorded(tmp_path: Path):
    out = tmp_path / "log"
    script = "import os, sys; print(os.getsid(0), os.getpid(), sys.stdin.read() == '')"
    pid = _runner().detach([sys.executable, "-c", script], str(tmp_path), pid_name="job.pid",
                           out=str(out), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    assert (tmp_path / "job.pid").read_text() == str(pid)
    for _ in range(100):  # 10 s at most: the job ends within milliseconds
        if out.exists() and out.read_text().strip():
            break
        time.sleep(0.1)
    session, own, empty_stdin = out.read_text().split()
    assert session == own == str(pid) != str(os.getsid(0)) and empty_stdin == "True"
    assert not list(tmp_path.glob("*.tmp"))


def test_the_scripts_that_start_jobs_use_the_runner() -> None:
    """No second copy of the detach and privilege drop in a host script."""
    for path in sorted(SCRIPTS_DIR.glob("*.py")):
        text = path.read_text()
        if path.name != "host_job.py":
            assert "start_new_session" not in text and "os.setuid" not in text, path.name


def test_a_job_given_a_user_runs_as_that_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dropping to another user needs root")
    out = tmp_path / "log"
    _runner().detach(["/bin/sh", "-c", "id -u; id -g; id -G"], str(tmp_path), user="nobody",
                     out=str(out))
    for _ in range(100):  # 10 s at most: three lines, three id runs
        if out.exists() and len(out.read_text().split()) >= 3:
            break
        time.sleep(0.1)
    nobody = pwd.getpwnam("nobody")
    # uid, gid, then its groups: its own group alone (root's groups are gone)
    assert out.read_text().split() == [str(nobody.pw_uid), str(nobody.pw_gid),
                                     str(nobody.pw_gid)]
