"""docs/fleet.md as written: its gateway inventory and its deploy commands, checked with
``gpuserve check`` (no host connected to) and pyinfra's own ``--limit`` semantics, so the
documented commands never give the gateway the workers' serve deploy."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.commands.check import deploys_for, limit_hosts, load_hosts

DOC = Path(__file__).resolve().parents[3] / "docs" / "fleet.md"
KEY = "k" * 32


def documented_inventory() -> str:
    """The python block of the gateway section that starts with ``# inventory/gpu.py``."""
    text = DOC.read_text()
    section = text[text.index("## Putting hosts behind SGLang's gateway"):]
    block = re.search(r"```python\n(# inventory/gpu\.py\n.*?)```", section, re.S)
    assert block, "docs/fleet.md lost its gateway inventory"
    return block.group(1)


def documented_commands() -> list[list[str]]:
    """Every indented ``pyinfra ... deploy/...`` command line of docs/fleet.md."""
    out = []
    for line in DOC.read_text().splitlines():
        if line.startswith("    pyinfra ") and "inventory/gpu.py" in line:
            out.append(shlex.split(line.split("#", 1)[0]))
    return out


@pytest.fixture
def inventory(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ROUTER_KEY", KEY)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "inventory" / "gpu.py"
    path.parent.mkdir()
    path.write_text(documented_inventory())
    return path


def test_documented_inventory_passes_check(inventory, capsys) -> None:
    rc = main(["check", str(inventory)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {tuple(ln.split()[:2]) for ln in out.splitlines() if not ln.startswith("#")}
    assert {("gpu-a", "serve"), ("gpu-b", "host"), ("gw", "router")} <= rows
    assert not {("gw", "serve"), ("gw", "host")} & rows  # the gateway is no GPU host


def test_documented_commands_keep_the_gateway_out_of_the_serve_deploy(inventory,
                                                                      capsys) -> None:
    commands = documented_commands()
    assert any("--serial" in c for c in commands), "the rolling command is documented"
    hosts, groups = load_hosts(str(inventory), {})
    for argv in commands:
        deploy = Path(next(a for a in argv if a.startswith("deploy/"))).stem
        limits = [argv[i + 1] for i, a in enumerate(argv) if a == "--limit"]
        reached = limit_hosts(hosts, groups, limits, str(inventory))
        wrong = [name for name, data in reached if deploy not in deploys_for(data)]
        assert not wrong, f"{shlex.join(argv)} reaches {wrong}, not {deploy} hosts"
        data = [f"--data={a}" for a in argv if "=" in a and not a.startswith("-")]
        data = [d.replace("NAME", "glm5-nvfp4-tp8") for d in data]
        check = ["check", str(inventory), "--deploy", deploy, *data,
                 *(f"--limit={x}" for x in limits)]
        assert main(check) == 0, capsys.readouterr().out


def test_the_limit_is_what_keeps_the_gateway_out(inventory) -> None:
    """The rolling command without its ``--limit`` (as it was) reaches the gateway."""
    hosts, groups = load_hosts(str(inventory), {})
    reached = dict(limit_hosts(hosts, groups, [], str(inventory)))
    assert "gw" in reached and "serve" not in deploys_for(reached["gw"])
    assert "gw" not in dict(limit_hosts(hosts, groups, ["gpu"], str(inventory)))


def test_shipped_proxmox_inventory_is_checked_as_a_hypervisor(capsys, monkeypatch,
                                                              tmp_path) -> None:
    # the example names ~/.ssh/id_ed25519: check wants it there, private to its owner
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("key\n")
    (tmp_path / ".ssh" / "id_ed25519").chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    rc = main(["check", str(DOC.parents[1] / "inventory" / "proxmox.py")])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [ln.split()[:3] for ln in out.splitlines() if not ln.startswith("#")]
    assert rows == [["pve1", "hypervisor", "ok"]]
    assert "VM 101: every NVIDIA GPU in sysfs (vfio-pci passthrough)" in out


def test_hypervisor_data_errors_name_the_key(tmp_path, capsys) -> None:
    inv = tmp_path / "pve.py"
    inv.write_text('pve = [("pve1", {"proxmox_vmid": 101, "proxmox_gpus": ["01:00"]})]\n')
    assert main(["check", str(inv)]) == 1
    assert "proxmox_gpus: must be a list of full PCI function addresses" in (
        capsys.readouterr().out)


def test_limit_unknown_group_is_an_error(inventory, capsys) -> None:
    assert main(["check", str(inventory), "--limit", "gpus"]) == 2
    assert "--limit: gpus: no group or host" in capsys.readouterr().err
