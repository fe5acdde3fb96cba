"""bench/fleet_noop.py's pure parts: the temporary inventory, its known_hosts, the guest
scripts and the table. Nothing here starts a VM or times anything."""

from __future__ import annotations

import argparse
import importlib.util
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("fleet_noop_bench",
                                               ROOT / "bench" / "fleet_noop.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look it up
_spec.loader.exec_module(bench)

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKey root@lab-gpu"
DATA = {
    "profile": "glm5-nvfp4-tp8",
    "sglang_extra_env": {"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "8"},
    "trusted_mirrors": ["http://10.0.2.2:4000/"],
    "allow_reboot": True,
    "gates_timeout": 30,
    "ssh_hostname": "127.0.0.1",
    "ssh_port": 40022,
    "ssh_user": "root",
    "ssh_key": "/keys/id_ed25519",
    "ssh_known_hosts_file": "/instances/x/known_hosts",
    "ssh_strict_host_key_checking": "yes",
}


def test_names_and_ports():
    assert bench.host_names(3) == ["bench-01", "bench-02", "bench-03"]
    assert bench.host_names(32)[-1] == "bench-32"
    assert bench.host_names(100)[0] == "bench-001"
    assert bench.guest_ports(3) == [2201, 2202, 2203]


def test_known_hosts_pins_every_port_in_openssh_format():
    text = bench.known_hosts_text([41001, 41002], PUB)
    assert text.splitlines() == [
        "[127.0.0.1]:41001 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKey",
        "[127.0.0.1]:41002 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKey",
    ]


def test_inventory_is_python_with_one_host_per_port(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text(bench.inventory_text(DATA, [41001, 41002, 41003], "/tmp/kh"))
    module = runpy.run_path(str(path))
    hosts = module["gpu"]
    assert [name for name, _ in hosts] == ["bench-01", "bench-02", "bench-03"]
    for (_, data), port in zip(hosts, [41001, 41002, 41003], strict=True):
        assert data["ssh_port"] == port
        assert data["ssh_known_hosts_file"] == "/tmp/kh"
        # strict host-key checking and the lab host's data stay as they were
        assert data["ssh_strict_host_key_checking"] == "yes"
        assert data["ssh_hostname"] == "127.0.0.1"
        assert data["ssh_paramiko_connect_kwargs"] == {
            "timeout": 120.0, "banner_timeout": 120.0, "auth_timeout": 120.0}
        assert {k: v for k, v in data.items() if not k.startswith("ssh_")} == \
            {k: v for k, v in DATA.items() if not k.startswith("ssh_")}
    # the shared data is not a group of its own (pyinfra skips _names)
    assert all(k.startswith("_") for k, v in module.items() if isinstance(v, dict))


def test_guest_scripts_name_each_port_and_pid_file():
    start = bench.start_sshd_script([2201, 2202])
    assert "/usr/sbin/sshd -p 2201 -o PidFile=$pf" in start
    assert "pf=/run/sshd-2202.pid" in start
    assert "-p 2203" not in start
    stop = bench.stop_sshd_script([2201, 2202])
    assert "pf=/run/sshd-2201.pid; [ -s $pf ] && kill $(cat $pf)" in stop
    assert stop.endswith("true")  # a port without a pid file is not an error


def test_table_ratios_to_one_host():
    samples = {
        1: bench.Sample(wall=[2.0, 2.2, 1.8], cpu=[1.0, 1.1, 0.9]),
        8: bench.Sample(wall=[8.0, 7.0, 9.0], cpu=[3.0, 3.2, 2.8]),
    }
    text = bench.table("deploy/host.py (no-op rerun)", 3, samples)
    lines = text.splitlines()
    assert lines[0] == "deploy/host.py (no-op rerun): 3 runs per N (medians; wall min-max)"
    assert "x N=1" in lines[1]
    one, eight = lines[2].split(), lines[3].split()
    assert one == ["1", "2.00", "(1.80-2.20)", "1.0x", "1.00", "1.0x", "1.000", "-"]
    assert eight == ["8", "8.00", "(7.00-9.00)", "4.0x", "3.00", "3.0x", "0.375", "0.286"]


def test_parse_hosts():
    assert bench.parse_hosts("32,1,8") == [1, 8, 32]
    assert bench.parse_hosts("4") == [4]
    for bad in ("0,2", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_hosts(bad)


def test_table_shows_the_container_hosts_own_cpu_beside_the_controllers():
    samples = {1: bench.Sample(wall=[0.7], cpu=[0.5], hosts_cpu=[0.2]),
               32: bench.Sample(wall=[4.0], cpu=[1.6], hosts_cpu=[5.1])}
    lines = bench.table("deploy/host.py (no-op rerun)", 1, samples).splitlines()
    assert lines[1].rstrip().endswith("hosts CPU s")
    assert lines[2].split()[-1] == "0.20" and lines[3].split()[-1] == "5.10"
    # a VM's table (one guest: no per-host CPU) keeps its columns
    vm = {1: bench.Sample(wall=[0.7], cpu=[0.5])}
    assert "hosts CPU" not in bench.table("x", 1, vm)


def test_hosts_cpu_of_instances_that_are_not_running_is_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path))
    assert bench.hosts_cpu_seconds(["no-such-instance"]) == 0.0
