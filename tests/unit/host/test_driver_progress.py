"""The driver's apt transactions report progress like every other apt install: the
driver with Fabric Manager (one held transaction) and a container host's pinned
userspace driver run detached and polled (roles/base/managed.py apt_script / apt_install),
so a gigabyte-sized driver install prints what apt fetched and unpacked, and a failure
fails the host with apt's last lines."""

from __future__ import annotations

import logging
import shlex

from gpuserve.host import fabric
from gpuserve.roles.base import managed
from tests.unit.conftest import run_fake_op
from tests.unit.launch.test_install_progress import apt_lines

FM = fabric.fabric_plan(590)
SCRIPT = fabric.transaction(["nvidia-driver-cuda=590.48.01-1", *FM.specs("590.48.01-1")],
                            ["nvidia-driver-cuda", *FM.held])


def run_job(op, status: list[str], caplog, **kwargs):
    """Prepare and execute ``op`` on @fake, the detached job reporting ``status``
    (roles/base/progress.JobStatus: rc, ##, the selected lines, ##, the tail)."""
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        return run_fake_op(op, {"/rc 2>/dev/null": status}, name="driver", **kwargs)


def test_the_held_transaction_runs_detached_and_reports_apt_progress(caplog) -> None:
    done = ["0", "##", *apt_lines("install-libnccl-fetched.txt"), "##"]
    meta, commands = run_job(managed.apt_script, done, caplog, script=SCRIPT,
                             label="apt nvidia-driver-cuda=590.48.01-1 with Fabric Manager")
    start = commands[0]
    assert "/run/gpuserve-jobs/apt-" in start and "apt-mark hold" in start
    assert shlex.quote(SCRIPT) in start  # the whole transaction inside the detached job
    assert ("@fake: apt nvidia-driver-cuda=590.48.01-1 with Fabric Manager: 2 of 2 packages "
            "fetched (1.6 kB of 1.6 kB to fetch), 2 unpacked, 2 set up") in caplog.text
    assert meta.did_succeed()


def test_a_failed_transaction_fails_the_host_with_apts_last_lines(caplog) -> None:
    failed = ["100", "##", "##", "E: Unable to locate package nvidia-fabricmanager"]
    meta, _ = run_job(managed.apt_script, failed, caplog, script=SCRIPT, label="apt driver")
    assert not meta.did_succeed()
    assert "apt: apt driver failed (exit status 100)" in caplog.text
    assert "E: Unable to locate package nvidia-fabricmanager" in caplog.text


def test_the_pinned_userspace_driver_installs_without_recommends(caplog) -> None:
    _, commands = run_job(managed.apt_install, ["0", "##", "##"], caplog,
                          packages=["nvidia-driver-cuda=580.126.20-1"], no_recommends=True)
    assert "install --no-install-recommends nvidia-driver-cuda=580.126.20-1" in commands[0]
