"""The venv install's progress line, from pip's own lines and the lock's sizes, and the
detached job's status fact (roles/base/progress.py)."""

from __future__ import annotations

import re
from pathlib import Path

from gpuserve.launch.install_progress import APT_LINES, PIP_LINES, apt_progress, pip_progress
from gpuserve.launch.locks import available_locks
from gpuserve.roles.base.progress import LOST, JobStatus

LOCK = next(lk for lk in available_locks() if lk.name == "sglang-0.5.23-cu13-py311")
GIB = 1 << 30

# pip 24's lines for a hash-checked -r install (src/pip/_internal/operations/prepare.py
# "Collecting %s", req/__init__.py "Installing collected packages: %s",
# commands/install.py "Successfully installed %s"), with the lock's first packages
NAMES = [p.name for p in LOCK.packages]


def collecting(name: str) -> str:
    return f"Collecting {name}==1 (from -r /opt/gpuserve/locks/r.txt (line 1))"


def test_packages_and_bytes_fetched_so_far() -> None:
    lines = [collecting(n) for n in NAMES[:3]]
    done = sum(int(p.size or 0) for p in LOCK.packages[:2])
    total = sum(int(p.size or 0) for p in LOCK.packages)
    line = pip_progress(lines, LOCK, 42.4)
    assert line == (f"2 of {len(NAMES)} packages fetched ({done / GIB:.2f} of {total / GIB:.2f}"
                    f" GiB by the lock); fetching {NAMES[2]}, 42 s")
    assert pip_progress([], LOCK, 3).startswith(f"0 of {len(NAMES)} packages fetched (0.00 of")
    assert pip_progress([], LOCK, 3).endswith("creating the venv, 3 s")


def test_install_phase_and_done() -> None:
    lines = [collecting(n) for n in NAMES] + ["Installing collected packages: a, b"]
    assert pip_progress(lines, LOCK, 90).startswith(f"all {len(NAMES)} packages fetched (")
    assert "installing, 90 s" in pip_progress(lines, LOCK, 90)
    done = pip_progress([*lines, "Successfully installed a-1 b-2"], LOCK, 95)
    assert done.startswith(f"installed {len(NAMES)} packages (")


def test_the_host_greps_the_same_lines() -> None:
    pattern = re.compile(PIP_LINES)
    assert pattern.search(collecting("torch")) and pattern.search("Successfully installed x")
    assert not pattern.search("  Downloading torch-2.9.1.whl (899.7 MB)")


def test_job_status() -> None:
    fact = JobStatus()
    running = fact.process(["running", "##", collecting("torch"), "##", "tail line"])
    assert running.rc is None and running.selected == [collecting("torch")]
    assert running.tail == ["tail line"]
    failed = fact.process(["2", "##", "##", "ERROR: x"])
    assert failed.rc == 2 and failed.selected == [] and failed.tail == ["ERROR: x"]
    assert "grep -E" in fact.command(run_dir="/opt/v/.x.install", select=PIP_LINES)
    lost = fact.process(["lost", "##", "##"])
    assert lost.rc == LOST and "without an exit status" in lost.outcome(60)
    assert running.outcome(60) == "not done within 60 s"
    assert failed.outcome(60) == "exit status 2"


def test_a_job_reports_its_status_and_a_lost_one_is_told_apart(tmp_path) -> None:
    """The start and status commands, run by a real shell (the host's)."""
    import subprocess
    import time

    from gpuserve.roles.base.progress import start_command

    def status(run_dir: str):
        out = subprocess.run(["sh", "-c", JobStatus().command(run_dir, "^step")],
                             capture_output=True, text=True, timeout=30).stdout
        return JobStatus().process(out.splitlines())

    ok = str(tmp_path / "ok")
    release = tmp_path / "release"  # the job runs on until the test lets it go: a
    # status taken before that is a running job's, however slow the machine
    start = start_command(ok, f"echo step one; while [ ! -e {release} ]; do sleep 0.05; "
                              "done; echo step two; exit 3")
    subprocess.run(str(start), shell=True, check=True, timeout=30)
    assert status(ok).rc is None
    release.touch()
    deadline = time.monotonic() + 120
    while (done := status(ok)).rc is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.rc == 3 and done.selected == ["step one", "step two"]
    lost = tmp_path / "lost"
    lost.mkdir()
    (lost / "pid").write_text("999999999\n")
    assert status(str(lost)).rc == LOST


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "apt"


def apt_lines(name: str, upto: str | None = None) -> list[str]:
    """The fixture's lines the host's grep selects (APT_LINES), up to ``upto``."""
    text = (FIXTURES / name).read_text()
    if upto:
        text = text[:text.index(upto)]
    return [line for line in text.splitlines() if re.search(APT_LINES, line)]


def test_apt_progress_from_real_apt_output() -> None:
    assert apt_progress([], 4) == "updating the package lists, 4 s"
    mid = apt_lines("install-libnccl-fetched.txt", upto="Get:2 ")
    assert apt_progress(mid, 7) == ("1 of 2 packages fetched (736 B of 1.6 kB to fetch), "
                                    "0 unpacked, 0 set up, 7 s")
    done = apt_lines("install-libnccl-fetched.txt")
    assert apt_progress(done, 9) == ("2 of 2 packages fetched (1.6 kB of 1.6 kB to fetch), "
                                     "2 unpacked, 2 set up, 9 s")
    cached = apt_lines("install-libnccl-dev-cached.txt")  # "Need to get 0 B/834 B"
    assert apt_progress(cached, 2) == ("0 of 1 packages fetched (0 B of 0 B to fetch), "
                                       "1 unpacked, 1 set up, 2 s")


def test_apt_sizes_with_thousands_separators() -> None:
    lines = ["3 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.",
             "Need to get 1,234 MB of archives.",
             "Get:1 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64 "
             " cuda-nvcc-13-0 13.0.88-1 [41.5 MB]"]
    assert apt_progress(lines, 10).startswith("1 of 5 packages fetched (41.5 MB of 1.2 GB")
