"""The `lab` fixture: the lab host a test module runs on, shared by the modules of its kind.

A module marked ``vm`` (``pytestmark = [pytest.mark.lab, pytest.mark.vm]``: it needs a
kernel: GRUB, the initramfs, modules, IOMMU, a reboot that changes /proc/cmdline) gets
the QEMU VM; every other module gets a systemd-nspawn container host (native speed).
Each kind is booted once per test session, on first use: `make test` runs the two
kinds in two pytest processes side by side (`-m "lab and vm"`, `-m "lab and not vm"`).

    def test_something(lab):
        lab.run_pyinfra("deploy/host.py")  # the real CLI (tests/fork_server.py), output captured
        assert lab.ssh("systemctl is-active x").stdout.strip() == "active"
        host = lab.testinfra_host()                  # testinfra over paramiko, pinned key
        assert host.file("/etc/x").exists

On first use it runs `python -m lab up --fresh --kind K --name <name>` (name from
$GPUSERVE_LAB_NAME, default "pytest"; the VM's is "<name>-vm"); at the end `python -m lab
down`, unless
GPUSERVE_LAB_KEEP=1. GPUSERVE_LAB_REUSE=1 skips --fresh (keeps the disk of a
previous run: faster iteration, less honest). Connection details (ssh_port ...) are
read from the lab's state file on every access because a test may restart the VM:
do not cache them. Output of subprocesses is echoed to stdout (live with `pytest -s`,
otherwise shown for failing tests).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest
import testinfra.backend
import testinfra.host

from lab.sshutil import instance_ssh
from lab.state import InstanceState, instance_dir, read_state
from tests.fork_server import ForkServer

REPO_ROOT = Path(__file__).resolve().parents[2]
INVENTORY = REPO_ROOT / "inventory" / "lab.py"
VENV_BIN = REPO_ROOT / ".venv" / "bin"


def pytest_collection_modifyitems(config, items):
    """Mark everything under tests/lab as `lab`, and run the lab's own self-test
    (test_lab.py) first so a broken lab fails fast before any deploy test, and the
    faults (test_faults.py: a reboot, a full disk, a crashed server, a dropped deploy)
    last, on the host the other modules leave and where they cannot disturb them. The
    gateway (test_router.py) goes after the serve modules, in front of the server they
    leave, so it needs no serve deploy of its own. The NVSwitch box (test_nvswitch.py)
    goes after the serve modules too: it switches the box and moves the driver, and
    puts both back before the gateway. The fleet (test_fleet.py: a clone of
    the session host as a second worker, the gateway on the first) comes after all of
    them: it moves the host's server onto the fleet's private address. In the container
    tier the container host deploy (test_container_host.py) provisions the host right
    after the self-test, as deploy/host.py does on a Proxmox LXC container; in the VM
    tier the host deploy (test_host_deploy.py, whose reboot through GRUB the command
    line's self-test rides) starts from the cold boot, and the soft-RoCE deploy
    (test_rdma_vm.py) comes after it."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.lab)
    order = {"test_lab.py": 0, "test_lab_vm.py": 0, "test_container_host.py": 0.5,
             "test_monitor.py": 1.3, "test_nvswitch.py": 1.4, "test_router.py": 1.5,
             "test_faults.py": 2, "test_fleet.py": 3, "test_pd.py": 3.1,
             "test_rdma_vm.py": 3.9}
    items.sort(key=lambda it: order.get(Path(str(it.path)).name, 1))


_FORKS: ForkServer | None = None


def _pyinfra_forks() -> ForkServer:
    """This test process's pyinfra fork server (tests/fork_server.py), started on first
    use and closed when the process exits."""
    global _FORKS
    if _FORKS is None:
        _FORKS = ForkServer()
        atexit.register(_FORKS.close)
    return _FORKS


def _run_echo(argv: list[str], env: dict, timeout: float | None,
              cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """Run, echo each output line as it comes, return stdout+stderr interleaved. The
    venv's pyinfra runs forked from a pre-imported helper (tests/fork_server.py)."""
    if argv[0] == str(VENV_BIN / "pyinfra"):
        proc = _pyinfra_forks().start(argv[1:], cwd, env)
    else:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    lines = []
    watchdog = threading.Timer(timeout, proc.kill) if timeout else None
    if watchdog:
        watchdog.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        rc = proc.wait()
    finally:
        if watchdog:
            watchdog.cancel()
    if rc == -9:
        lines.append(f"\n[killed after {timeout:.0f}s]\n")
    return subprocess.CompletedProcess(argv, rc, stdout="".join(lines), stderr="")


class Lab:
    """Handle on the session's lab instance (see the module docstring)."""

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind
        self.inventory = INVENTORY
        self.env = dict(os.environ, GPUSERVE_LAB_NAME=name)

    # -- state (re-read each time: the VM may have been restarted) --
    @property
    def state(self) -> InstanceState:
        st = read_state(self.name)
        if st is None:
            raise RuntimeError(f"lab instance {self.name!r} is not running")
        return st

    @property
    def ssh_port(self) -> int:
        return self.state.ssh_port

    @property
    def ssh_key(self) -> str:
        return self.state.ssh_key

    @property
    def known_hosts(self) -> str:
        return self.state.known_hosts

    @property
    def mirror_port(self) -> int:
        return self.state.mirror_port

    @property
    def mirror_url(self) -> str:
        """The mirror as the guest sees it: http://10.0.2.2:<port>/."""
        return self.state.mirror_url

    # -- running things --
    def lab_cli(self, *args: str, check: bool = True,
                timeout: float | None = 900) -> subprocess.CompletedProcess:
        """`python -m lab <args> --name <name>` (add --name yourself for `ssh`)."""
        r = _run_echo([sys.executable, "-m", "lab", *args], self.env, timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"python -m lab {' '.join(args)} failed ({r.returncode}):\n"
                                 + r.stdout[-4000:])
        return r

    def run_pyinfra(self, deploy: str, *extra_args: str, check: bool = True,
                    timeout: float | None = 1800, inventory: str | None = None,
                    env: dict | None = None) -> subprocess.CompletedProcess:
        """`.venv/bin/pyinfra -y inventory/lab.py <deploy> <extra_args>` from the repo
        root (or another ``inventory``, with ``env``); `.stdout` holds stdout and stderr
        interleaved."""
        argv = [str(VENV_BIN / "pyinfra"), "-y",
                inventory or str(self.inventory.relative_to(REPO_ROOT)), deploy, *extra_args]
        r = _run_echo(argv, env or self.env, timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"pyinfra {deploy} failed ({r.returncode}):\n"
                                 + r.stdout[-6000:])
        return r

    def pyinfra_launcher(self) -> str:
        """An executable that runs the venv's pyinfra CLI forked from this test process's
        helper (tests/fork_server.py), for commands that start pyinfra themselves
        (`gpuserve tune --pyinfra`)."""
        return _pyinfra_forks().launcher

    def run_tool(self, name: str, *args: str, env: dict | None = None,
                 timeout: float | None = 600) -> subprocess.CompletedProcess:
        """`.venv/bin/<name> <args>` from the repo root, output echoed and captured."""
        return _run_echo([str(VENV_BIN / name), *args], env or self.env, timeout)

    def ssh(self, cmd: str, check: bool = False,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a shell command in the guest as root (pinned host key, lab key)."""
        st = self.state
        r = subprocess.run([*instance_ssh(st), cmd],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ssh {cmd!r} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        return r

    def testinfra_host(self) -> testinfra.host.Host:
        """A fresh testinfra host over paramiko with the lab key and the pinned host key.

        testinfra's paramiko backend would accept any host key (WarningPolicy, no
        known_hosts); its `client` is a cached property, so we hand it a client that
        rejects unknown keys instead. Fresh each call: a reboot kills old connections.
        """
        st = self.state
        backend = testinfra.backend.get_backend(
            f"paramiko://root@127.0.0.1:{st.ssh_port}", ssh_identity_file=st.ssh_key)
        client = paramiko.SSHClient()
        client.load_host_keys(st.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect("127.0.0.1", port=st.ssh_port, username="root",
                       key_filename=st.ssh_key, look_for_keys=False, allow_agent=False,
                       timeout=30)
        backend.client = client  # overrides the cached_property
        return testinfra.host.Host(backend)

    @property
    def results_dir(self) -> Path:
        """Where the serve deploy records this instance's runs (inventory/lab.py)."""
        return instance_dir(self.name) / "results"

    def set_host_driver_version(self, version: str) -> None:
        """Container hosts: the stand-in host kernel module's version, as
        /proc/driver/nvidia/version shows it inside (at once, no restart)."""
        from lab.container_instance import set_driver_version

        set_driver_version(self.name, version)

    def boot_id(self) -> str:
        return self.ssh("cat /proc/sys/kernel/random/boot_id", check=True).stdout.strip()

    def wait_ssh(self, timeout: float = 420) -> float:
        """Wait until SSH answers again (e.g. after a reboot); return seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                if self.ssh("true", timeout=30).returncode == 0:
                    return time.monotonic() - t0
            except subprocess.TimeoutExpired:
                pass
            time.sleep(3)
        raise AssertionError(f"lab {self.name!r}: SSH did not come back in {timeout:.0f}s")

    def reboot(self, timeout: float = 420) -> float:
        """Reboot the guest and wait until it is back (new boot id); return seconds."""
        before = self.boot_id()
        t0 = time.monotonic()
        self.ssh("systemctl reboot", timeout=30)
        while time.monotonic() - t0 < timeout:
            time.sleep(5)
            try:
                r = self.ssh("cat /proc/sys/kernel/random/boot_id", timeout=30)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0 and r.stdout.strip() != before:
                return time.monotonic() - t0
        raise AssertionError(f"lab {self.name!r}: no new boot within {timeout:.0f}s")


def _boot(name: str, kind: str) -> Lab:
    handle = Lab(name, kind)
    up = ["up", "--name", name, "--kind", kind]
    if os.environ.get("GPUSERVE_LAB_REUSE") != "1":
        up.append("--fresh")
    handle.lab_cli(*up)
    # the records this session's deploys write (inventory/lab.py: per instance)
    shutil.rmtree(handle.results_dir, ignore_errors=True)
    return handle


def _session_name() -> str:
    return os.environ.get("GPUSERVE_LAB_NAME") or "pytest"


@pytest.fixture(scope="session")
def at_session_end():
    """Register ``(what, left)``: ``left()`` is polled at the end of the session, up to
    10 minutes, until it returns nothing; what is still left then fails the session's
    last test. For what the kernel lets go of in its own time (an orphaned container's
    loop device: a clean-clone make test saw one 240 s after its host was down, gone
    minutes later), so that no test waits for it while the others could run."""
    checks: list[tuple[str, Callable[[], list]]] = []
    yield lambda what, left: checks.append((what, left))
    deadline = time.monotonic() + 600
    for _, left in checks:
        while left() and time.monotonic() < deadline:
            time.sleep(2)
    still = [f"{what}: {left()}" for what, left in checks if left()]
    assert not still, "still left at the session's end: " + "; ".join(still)


@pytest.fixture(scope="session")
def container_lab(at_session_end) -> Lab:
    # at_session_end first: its checks run once this host is down too
    handle = _boot(_session_name(), "container")
    yield handle
    if os.environ.get("GPUSERVE_LAB_KEEP") != "1":
        handle.lab_cli("down", "--name", handle.name, check=False)


@pytest.fixture(scope="session")
def vm_lab() -> Lab:
    handle = _boot(f"{_session_name()}-vm", "vm")
    yield handle
    if os.environ.get("GPUSERVE_LAB_KEEP") != "1":
        handle.lab_cli("down", "--name", handle.name, check=False)


@pytest.fixture(scope="module")
def debian13_lab() -> Lab:
    """A Debian 13 container host of its own (``python -m lab up --os debian13``), for the
    module that asks for it, taken down at the module's end (GPUSERVE_LAB_KEEP=1 keeps
    it): the session's hosts stay Debian 12."""
    handle = Lab(f"{_session_name()}-debian13", "container")
    handle.lab_cli("up", "--name", handle.name, "--kind", "container", "--os", "debian13",
                   "--fresh")
    shutil.rmtree(handle.results_dir, ignore_errors=True)
    yield handle
    if os.environ.get("GPUSERVE_LAB_KEEP") != "1":
        handle.lab_cli("down", "--name", handle.name, check=False)


@pytest.fixture(scope="module")
def lab(request) -> Lab:
    """The VM for a module marked ``vm``, else the container host."""
    kind = "vm_lab" if request.node.get_closest_marker("vm") else "container_lab"
    return request.getfixturevalue(kind)
