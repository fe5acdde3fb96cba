"""`lab up` gives up with the serial console's tail when SSH never answers."""

from __future__ import annotations

import os
import shutil

import pytest

from lab.instance import serial_tail, wait_ssh
from lab.qemu import free_port
from lab.state import InstanceState


def _state(tmp_path, pid: int) -> InstanceState:
    log = tmp_path / "serial.log"
    log.write_bytes(b"GRUB loading\r\n\x1b[0;32m  OK  \x1b[0m] Reached target\r\n"
                    b"[  3.1] Kernel panic - not syncing: VFS: Unable to mount root fs\r\n")
    return InstanceState(
        name="t", ssh_port=free_port(), mirror_port=1, pid=pid, mirror_pid=0,
        ssh_key=str(tmp_path / "k"), known_hosts=str(tmp_path / "kh"), image="",
        overlay="", serial_log=str(log), qmp_socket="", mirror_root="")


def test_serial_tail_drops_carriage_returns(tmp_path):
    st = _state(tmp_path, os.getpid())
    tail = serial_tail(st.serial_log, 2)
    assert "\r" not in tail
    assert tail.splitlines()[-1].endswith("Unable to mount root fs")
    assert serial_tail(tmp_path / "missing.log") == "(no serial log)"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs ssh")
def test_timeout_reports_the_serial_tail(tmp_path):
    st = _state(tmp_path, os.getpid())  # a live pid; nothing listens on the port
    with pytest.raises(TimeoutError) as err:
        wait_ssh(st, timeout=0)
    assert "Unable to mount root fs" in str(err.value)


def test_dead_qemu_is_reported_at_once(tmp_path):
    st = _state(tmp_path, 2**22 + 12345)  # above pid_max's default: never alive
    with pytest.raises(RuntimeError, match="died during boot") as err:
        wait_ssh(st, timeout=600)
    assert "Kernel panic" in str(err.value)
