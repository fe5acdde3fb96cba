"""Lab state: instance names, the atomic state file, liveness of recorded pids."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.state import (
    InstanceState,
    clear_state,
    instance_dir,
    instance_name,
    lab_home,
    list_instances,
    pid_alive,
    read_state,
    state_path,
    write_state,
)


def _state(name: str = "t1") -> InstanceState:
    return InstanceState(
        name=name, ssh_port=40022, mirror_port=40080, pid=123, mirror_pid=124,
        ssh_key="/k/id_ed25519", known_hosts="/i/known_hosts", image="/img.raw",
        overlay="/i/disk.qcow2", serial_log="/i/serial.log", qmp_socket="/i/qmp.sock",
        mirror_root="/i/mirror")


def test_lab_home_default_and_env(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUSERVE_LAB_HOME", raising=False)
    assert str(lab_home()) == os.path.expanduser("~/.cache/gpuserve/lab")
    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path))
    assert lab_home() == tmp_path
    assert instance_dir("x") == tmp_path / "instances" / "x"


def test_instance_name_precedence(monkeypatch):
    monkeypatch.delenv("GPUSERVE_LAB_NAME", raising=False)
    assert instance_name() == "default"
    monkeypatch.setenv("GPUSERVE_LAB_NAME", "serve")
    assert instance_name() == "serve"
    assert instance_name("cli") == "cli"


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", " x", "-x", "x" * 80])
def test_instance_name_rejects_path_tricks(monkeypatch, bad):
    monkeypatch.delenv("GPUSERVE_LAB_NAME", raising=False)
    if bad == "":
        assert instance_name(bad) == "default"  # empty means "not given"
        return
    with pytest.raises(ValueError, match="invalid lab instance name"):
        instance_name(bad)


def test_state_roundtrip_and_clear(tmp_path):
    st = _state()
    path = write_state(st, tmp_path)
    assert path == state_path("t1", tmp_path)
    assert not path.with_suffix(".json.tmp").exists()
    back = read_state("t1", tmp_path)
    assert back == st
    assert back.mirror_url == "http://10.0.2.2:40080/"
    assert list_instances(tmp_path) == ["t1"]
    clear_state("t1", tmp_path)
    assert read_state("t1", tmp_path) is None
    assert list_instances(tmp_path) == []


def test_pid_alive_tells_live_dead_and_zombie():
    assert pid_alive(os.getpid())
    assert not pid_alive(0) and not pid_alive(None)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    # Not yet reaped: a zombie, which must count as dead.
    for _ in range(100):
        if not pid_alive(proc.pid):
            break
        time.sleep(0.05)
    assert not pid_alive(proc.pid)
    proc.wait()
    assert not pid_alive(proc.pid)


def test_run_in_an_instance_that_is_not_running_names_it(monkeypatch, tmp_path):
    from lab.sshutil import run_in

    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"lab instance 'nowhere' is not running: "
                                           r"`python -m lab up --name nowhere`"):
        run_in("nowhere", "true")



def test_commands_share_the_instances_login_through_its_control_socket(monkeypatch):
    """Commands share one login per instance (a login costs the VM guest about a second
    under TCG); the socket lives in the instance's directory, so a new instance of
    another name never reaches an old one's connection."""
    from lab.sshutil import instance_ssh, mux_path, ssh_argv

    home = "/lab-home"  # short: pytest's own temporary paths can exceed a socket's
    monkeypatch.setenv("GPUSERVE_LAB_HOME", home)
    argv = instance_ssh(_state("a"))
    assert f"ControlPath={home}/instances/a/ssh.mux" in argv
    assert "ControlMaster=auto" in argv and argv[-1] == "root@127.0.0.1"
    assert mux_path(_state("b")) == Path(home) / "instances/b/ssh.mux"
    # the host key stays pinned on the login that opens the socket
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/i/known_hosts" in argv
    # a plain login (what says that sshd answers) shares nothing
    assert not any("Control" in a for a in ssh_argv(2222, "/k", "/kh"))


def test_a_control_socket_path_too_long_for_unix_sockets_is_not_used(monkeypatch,
                                                                      tmp_path):
    from lab.sshutil import instance_ssh, mux_path

    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path / ("d" * 90)))
    assert mux_path(_state("a")) is None
    assert not any("Control" in a for a in instance_ssh(_state("a")))
