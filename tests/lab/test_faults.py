"""Faults on the lab host: what a served host does when things go wrong, end to end.

One module-scoped deployed state (glm5-nvfp4-tp8 with
the secrets of test_serve.py, the lab's default lock) is shared by every test, and the
tests run in file order, each leaving the host healthy for the next:

1. the server crashes after becoming healthy: systemd restarts it (Restart=on-failure)
   and /health answers again by itself; the deploy's rerun passes and says so;
2. the server hangs during start (the stand-in's weight load never ends): the health
   gate times out and the host is rolled back to the last good configuration;
3. the host reboots: the service comes back healthy by itself, a rerun changes nothing;
4. the controller's results disk is full (that same rerun writes its record onto a full
   tmpfs): the warning names the record, no partial file stays;
5. the disk is full when the venv is written: refused by the preflight when it is full
   already, and when it fills during the install the deploy fails saying so and leaves
   no half-written venv, the live service untouched;
6. the SSH connection drops in the middle of a deploy (while the new venv is built): a
   rerun converges with nothing lost or duplicated. Last, because it leaves the host on
   another SGLang version (the module's fixture deploys the default again when needed).

Runs after every other lab module (conftest.py orders it last): it needs the host the
host deploy prepared, and its reboot and full disk must not disturb the others. Run on
its own (``pytest tests/lab/test_lab.py tests/lab/test_faults.py``) it prepares the host
itself. The deploys here pass ``bench=off`` (throughput is test_serve's subject, and each
benchmark costs half a minute under TCG) and write their records to a directory of the
module's own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from labhelpers import (
    UNIT,
    UNIT_PATH,
    clean,
    healthy,
    no_changes,
    served_profile,
    unit_venv,
    venvs,
)

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
TWO = REPO / "tests/fixtures/profiles/lab-two-versions.yaml"  # renders for 0.5.19 and 0.5.23
HF_TOKEN = "hf_labTokenNeverOnArgv0123"
API_KEY = "sk-lab-key-never-on-argv-4567"
# the inventory's own knob and value (inventory/lab.py), kept when a test overrides the
# extra env
LOAD, LOAD_VALUE = "GPUSERVE_LAB_STANDIN_LOAD_SECONDS", "3"
FILLER = "/var/tmp/gpuserve-faults-filler"
FILLED = "/var/tmp/gpuserve-faults-filled"  # the watcher's note that it filled the disk
WATCH = "/var/tmp/gpuserve-faults-watch.sh"
WATCH_PID = "/var/tmp/gpuserve-faults-watch.pid"


def unit_props(lab, *names: str) -> dict[str, str]:
    out = lab.ssh(f"systemctl show -p {','.join(names)} {UNIT}", check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_healthy(lab, timeout: float) -> float:
    """Seconds until the unit is active and /health answers 200 (bounded)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if unit_props(lab, "ActiveState")["ActiveState"] == "active" and healthy(lab):
                return time.monotonic() - t0
        except (subprocess.TimeoutExpired, AssertionError):
            pass  # SSH not back yet after a reboot
        time.sleep(2)
    raise AssertionError(f"{UNIT} not active with /health 200 within {timeout:.0f}s: "
                         + lab.ssh(f"systemctl status --no-pager {UNIT} | tail -20").stdout)


@dataclass
class Served:
    """The module's deploy: the lab host data plus what every deploy here passes."""

    lab: object
    group_data: Path
    results: Path

    def args(self, *extra: str) -> list[str]:
        return ["--group-data", str(self.group_data), "--data", "bench=off",
                "--data", f"results_dir={self.results}", "--data", "keep_venvs=1", *extra]

    def serve(self, *extra: str, timeout: float = 900) -> tuple[int, str]:
        r = self.lab.run_pyinfra("deploy/serve.py", *self.args(*extra), check=False,
                                 timeout=timeout)
        return r.returncode, clean(r.stdout)


@pytest.fixture(scope="module")
def served(lab, tmp_path_factory) -> Served:
    """A healthy glm5-nvfp4-tp8 deploy, the state each test starts from and leaves."""
    data = tmp_path_factory.mktemp("group_data")
    (data / "all.py").write_text(f"hf_token = {HF_TOKEN!r}\nsglang_api_key = {API_KEY!r}\n")
    s = Served(lab, data, tmp_path_factory.mktemp("results"))
    # After the other lab modules the host already serves exactly this (test_serve_venvs
    # ends on it; the first test's rerun proves it by changing nothing), so the deploy
    # is spared under TCG; otherwise (this module alone, or a kept lab a previous run
    # left on another version) deploy it, after the host deploy on a bare lab.
    if not serving_the_default(lab):
        if lab.ssh("command -v nvidia-smi").returncode != 0:
            lab.run_pyinfra("deploy/host.py", "--data", "nvidia_install_headers=False")
        rc, out = s.serve()
        assert rc == 0, out[-6000:]
    assert serving_the_default(lab)
    return s


def serving_the_default(lab) -> bool:
    """Healthy on glm5-nvfp4-tp8 from the default lab lock with this module's secrets."""
    unit = lab.ssh(f"cat {UNIT_PATH}").stdout
    env = lab.ssh("cat /etc/gpuserve/sglang.env").stdout
    return ("# SGLang 0.5.23, lock sglang-0.5.23+lab-" in unit
            and "# Profile: glm5-nvfp4-tp8\n" in env
            and f"HF_TOKEN={HF_TOKEN}" in env and healthy(lab))


def test_crash_after_healthy_is_restarted_by_systemd_and_reported(lab, served) -> None:
    """The SGLang process dies hard (SIGKILL, as the kernel's OOM killer would); the
    unit's Restart=on-failure brings it back without any deploy, and the next deploy,
    which has nothing to change, still reports the crash instead of looking clean."""
    unit = lab.ssh(f"cat {UNIT_PATH}", check=True).stdout
    assert "Restart=on-failure" in unit
    before = unit_props(lab, "MainPID", "NRestarts")
    # the unit's main process is the redacting wrapper; the server is its child
    server = lab.ssh(f"pgrep -P {before['MainPID']}", check=True).stdout.split()
    assert len(server) == 1, server
    assert "sglang.launch_server" in lab.ssh(f"cat /proc/{server[0]}/cmdline | tr '\\0' ' '",
                                             check=True).stdout
    lab.ssh(f"kill -KILL {server[0]}", check=True)

    deadline = time.monotonic() + 60
    while unit_props(lab, "NRestarts")["NRestarts"] == before["NRestarts"]:
        assert time.monotonic() < deadline, "systemd did not restart the unit within 60 s"
        time.sleep(2)
    wait_healthy(lab, timeout=240)
    after = unit_props(lab, "MainPID", "NRestarts")
    restarts = int(before["NRestarts"]) + 1
    assert int(after["NRestarts"]) == restarts and after["MainPID"] != before["MainPID"]

    rc, out = served.serve()
    assert rc == 0, out[-6000:]
    times = "time" if restarts == 1 else "times"
    # the wrapper exits with the server's status: 128 + 9 for SIGKILL
    assert re.search(rf"lab-gpu: health: {re.escape(UNIT)} was restarted {restarts} {times} "
                     rf"by systemd since it was started \(last exit: code=exited, "
                     rf"status=137/n/a\); it serves again, see journalctl -u {re.escape(UNIT)}",
                     out), out[-6000:]
    assert no_changes(out), out[-6000:]


def test_hang_at_start_times_out_and_is_rolled_back(lab, served) -> None:
    """The server never finishes loading (stand-in knob: an endless weight load): the
    gate gives up after health_timeout, names the timeout and the phase it hung in, and
    the host serves the last good configuration again."""
    hang = json.dumps({LOAD: "100000"})
    rc, out = served.serve("--data", f"sglang_extra_env={hang}", "--data", "health_timeout=30")
    assert rc != 0, out[-6000:]
    assert re.search(r"\[lab-gpu\] health: not healthy after \d+ s \(health_timeout 30 s\), "
                     r"last phase 'loading weights'; profile glm5-nvfp4-tp8 failed", out), \
        out[-6000:]
    assert ("the host was rolled back to the previous configuration of profile glm5-nvfp4-tp8, "
            "which is healthy again" in out), out[-6000:]
    env = lab.ssh("cat /etc/gpuserve/sglang.env", check=True).stdout
    assert f"{LOAD}={LOAD_VALUE}" in env and "100000" not in env
    assert unit_props(lab, "ActiveState")["ActiveState"] == "active" and healthy(lab)
    assert HF_TOKEN not in out and API_KEY not in out


@dataclass
class AfterReboot:
    waited: float  # seconds from the new boot's SSH to active with /health 200
    rc: int
    out: str
    records_dir: Path | None  # the full results disk, None when it could not be mounted
    left: list[str]  # what the deploy left in records_dir/lab-gpu


@pytest.fixture(scope="module")
def after_reboot(lab, served, tmp_path_factory) -> AfterReboot:
    """Reboot, wait for the service without deploying, then one deploy, which must find
    nothing to change. That deploy also writes its smoke record onto a full results
    disk (the controller's records are the host-independent part of a deploy, so one
    TCG deploy serves both tests): a 64 KiB tmpfs filled to the brim, when the tests run
    as root (CI does); otherwise the module's own results directory."""
    boot = lab.boot_id()
    lab.reboot()
    assert lab.boot_id() != boot
    waited = wait_healthy(lab, timeout=300)
    mnt: Path | None = None
    if os.geteuid() == 0:
        mnt = tmp_path_factory.mktemp("full")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mnt)],
                       check=True, timeout=30)
    try:
        extra: tuple[str, ...] = ()
        if mnt is not None:
            (mnt / "lab-gpu").mkdir()
            fill_up(mnt / "filler")
            extra = ("--data", f"results_dir={mnt}")
        rc, out = served.serve(*extra)
        left = sorted(p.name for p in (mnt / "lab-gpu").iterdir()) if mnt else []
    finally:
        if mnt is not None:
            subprocess.run(["umount", str(mnt)], check=False, timeout=30)
    return AfterReboot(waited, rc, out, mnt, left)


def fill_up(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem refuses (bounded by its size)."""
    with path.open("wb", buffering=0) as f:  # unbuffered: nothing left for close()
        try:
            for _ in range(1 << 16):
                f.write(b"\0" * 4096)
        except OSError:
            return
    raise AssertionError(f"{path}: the filesystem never filled")


def test_reboot_brings_the_service_back_by_itself(after_reboot: AfterReboot) -> None:
    """The unit is enabled: after a reboot it starts and turns healthy with no deploy;
    the deploy that follows finds nothing to change and no crash to report."""
    r = after_reboot
    assert r.waited < 300
    assert r.rc == 0, r.out[-6000:]
    assert no_changes(r.out), r.out[-6000:]
    assert "was restarted" not in r.out and "lab-gpu: smoke: " in r.out


def test_full_results_disk_warns_naming_the_record_and_leaves_no_partial_file(
        after_reboot: AfterReboot) -> None:
    """Records are written on the controller: on a full disk the deploy, whose checks
    passed, warns naming the record it could not write, and leaves nothing half written."""
    r = after_reboot
    if r.records_dir is None:
        pytest.skip("mounting a small tmpfs for the full results disk needs root")
    assert r.rc == 0, r.out[-6000:]
    assert re.search(rf"lab-gpu: smoke: result not recorded: \[Errno 28\] No space left on "
                     rf"device: '{re.escape(str(r.records_dir))}/lab-gpu/[^']+-smoke-"
                     rf"glm5-nvfp4-tp8[^']*\.json'", r.out), r.out[-6000:]
    assert r.left == [], r.left


@pytest.fixture
def filler(lab) -> Iterator[None]:
    """Whatever a test does to fill the guest's disk is undone, whatever happens."""
    yield
    lab.ssh(f"[ -f {WATCH_PID} ] && kill $(cat {WATCH_PID}); "
            f"rm -f {FILLER} {FILLED} {WATCH} {WATCH_PID}", timeout=60)
    free = lab.ssh("df --output=avail -B1M / | tail -1", check=True).stdout
    assert int(free) > 1024, f"only {free.strip()} MiB free after removing the filler"


def fill_command() -> str:
    """Allocate the root filesystem's free blocks but about a MiB, counting the blocks
    ext4 reserves for root (pip runs as root and may use them). ext4 also holds back
    16 MiB no allocation gets (``s_resv_clusters``, for metadata): start from there."""
    return (f"free=$(( $(stat -f -c '%f*%S' /) )); for m in 17 18 20 24 32 48 64; do "
            f"fallocate -l $(( free - m * 1048576 )) {FILLER} 2>/dev/null && break; done; "
            f"test -e {FILLER}")


def watch_script() -> str:
    """A guest-side watcher (at most 3 minutes): when a 0.5.19 venv directory appears,
    fill the disk (:func:`fill_command`), note it, and end."""
    return (f"echo $$ > {WATCH_PID}\n"
            "for i in $(seq 1 1800); do\n"
            "  for v in /opt/gpuserve/venvs/0.5.19+lab-*; do\n"
            f"    if [ -d \"$v\" ]; then {fill_command()} && touch {FILLED}; "
            "exit 0; fi\n"
            "  done\n"
            "  sleep 0.1\n"
            "done\n")


def test_full_disk_refuses_or_fails_the_venv_and_leaves_no_half_written_one(
        lab, served, filler) -> None:
    """A new lock needs a new venv. On a disk that is full already the preflight refuses
    before any change; on a disk that fills while the venv is being written (another
    process takes the space after the preflight passed) the install fails saying so,
    and the unfinished venv is gone: the live one and the service are untouched."""
    live = unit_venv(lab)
    before = venvs(lab)
    assert not any("0.5.19+lab" in v for v in before), before
    switch = ("--data", f"profile={TWO}", "--data", "sglang_version=0.5.19+lab")

    # (a) full before the deploy: the preflight reads the free space and refuses
    lab.ssh(fill_command(), check=True)
    try:
        rc, out = served.serve(*switch)
    finally:
        lab.ssh(f"rm -f {FILLER}", check=True)
    assert rc != 0, out[-6000:]
    assert re.search(r"lab-gpu: 0\.\d GiB free for the venvs, lock sglang-0\.5\.19\+lab-\S+ "
                     r".*needs [\d.]+ GiB .*free space or set sglang_home on a larger disk",
                     out), out[-6000:]
    assert "Beginning operation run" not in out
    assert venvs(lab) == before and unit_venv(lab) == live

    # (b) the disk fills once the new venv's directory appears, as if a download
    #     elsewhere took the space after the preflight had passed
    lab.ssh(f"cat > {WATCH} <<'EOF'\n{watch_script()}EOF\n"
            f"setsid nohup sh {WATCH} >/dev/null 2>&1 < /dev/null &", check=True)
    rc, out = served.serve(*switch)
    assert lab.ssh(f"test -e {FILLED}").returncode == 0, "the watcher never filled the disk"
    assert rc != 0, out[-6000:]
    # `python3 -m venv` itself only says that ensurepip "returned non-zero exit status 1"
    assert re.search(r"gpuserve: building /opt/gpuserve/venvs/0\.5\.19\+lab-[0-9a-f]{12} "
                     r"failed \(exit \d+, 0 MiB free on its filesystem\); the unfinished venv "
                     r"was removed", out), out[-6000:]
    assert venvs(lab) == before, venvs(lab)
    assert unit_venv(lab) == live and healthy(lab)


@dataclass
class Dropped:
    rc: int
    out: str
    dropped_at: str


def deploy_and_drop(lab, served: Served, trigger: re.Pattern[str], delay: float,
                    *extra: str) -> Dropped:
    """Run a deploy and, ``delay`` seconds after a line matching ``trigger``, kill every
    established SSH connection on the guest but the one doing the killing (``ss -K``:
    the kernel aborts them with a reset, as a broken network path would)."""
    argv = [str(REPO / ".venv/bin/pyinfra"), "-y", "inventory/lab.py", "deploy/serve.py",
            *served.args(*extra)]
    proc = subprocess.Popen(argv, cwd=REPO, env=lab.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    assert proc.stdout is not None
    watchdog = threading.Timer(600, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    dropped = ""
    try:
        for line in proc.stdout:
            lines.append(line)
            sys.stdout.write(line)
            if not dropped and trigger.search(clean(line)):
                dropped = clean(line).strip()
                time.sleep(delay)
                kill = lab.ssh("mine=$(echo $SSH_CLIENT | cut -d' ' -f2); "
                               "ss -K -t state established \"( sport = :22 and dport != "
                               ":$mine )\" | tail -n +2 | wc -l", check=True, timeout=60)
                sys.stdout.write(f"[test: dropped {kill.stdout.strip()} SSH connection(s)]\n")
        rc = proc.wait(timeout=120)
    finally:
        watchdog.cancel()
    return Dropped(rc, clean("".join(lines)), dropped)


def test_ssh_drop_mid_deploy_then_a_rerun_converges(lab, served) -> None:
    """The connection drops while the new lock's venv is being built. The deploy fails;
    the rerun rebuilds that venv from nothing (it has no verification stamp), moves the
    unit to it and serves the intended profile: one unit, one venv per lock, no
    temporary or half-written files on the host or among the records."""
    switch = ("--data", f"profile={TWO}", "--data", "sglang_version=0.5.19+lab")
    building = re.compile(r"Starting operation: Install SGLang \| venv /opt/gpuserve/venvs/"
                          r"0\.5\.19\+lab-")
    # into the venv build: it takes seconds under TCG, about two natively
    first = deploy_and_drop(lab, served, building, 3.0 if lab.kind == "vm" else 0.3,
                            *switch)
    assert first.dropped_at, first.out[-6000:]
    assert first.rc != 0, first.out[-6000:]
    # the drop hit the venv build: the unit still runs the old venv and serves
    assert "0.5.23+lab" in unit_venv(lab) and healthy(lab)

    rc, out = served.serve(*switch)
    assert rc == 0, out[-6000:]
    live = unit_venv(lab)
    assert "0.5.19+lab" in live and healthy(lab)
    assert served_profile(lab) == "lab-two-versions"
    env = lab.ssh("cat /etc/gpuserve/sglang.env", check=True).stdout
    assert f"HF_TOKEN={HF_TOKEN}" in env and env.count("HF_TOKEN=") == 1
    # keep_venvs=1: exactly the venv the unit names, stamped, no leftover
    assert venvs(lab) == [live], venvs(lab)
    assert lab.ssh(f"test -f {live}/.gpuserve-verified").returncode == 0
    units = lab.ssh("ls -1 /etc/systemd/system | grep -c '^gpuserve-sglang'").stdout.strip()
    assert units == "1"
    stray = lab.ssh("find /etc/gpuserve /etc/systemd/system /opt/gpuserve -maxdepth 2 "
                    "\\( -name '*.tmp' -o -name '.*.tmp' -o -name '*.pyinfra*' -o -name "
                    "'pip-credentials.conf' \\) -print").stdout.split()
    assert stray == [], stray
    records = sorted(p.name for p in served.results.rglob("*") if p.is_file())
    assert records and not [r for r in records if r.startswith(".") or r.endswith(".tmp")]
