"""testinfra hosts from any pyinfra inventory file: ``pytest tests/host --inventory F``.

The inventory is read the way pyinfra reads it (pyinfra_cli/inventory.py): every
module-level list or tuple whose name does not start with ``_`` is a group of ``"host"``
or ``("host", {data})`` items (or a ``([hosts], {group data})`` pair), with
``group_data/all.py`` and ``group_data/<group>.py`` next to the inventory (and in the
working directory) underneath. Each SSH host becomes a testinfra host over paramiko with
the inventory's key, user, port and known_hosts file; host keys are checked as
``ssh_strict_host_key_checking`` says (pyinfra's default, accept-new, accepts an unknown
key without saving it; "yes" rejects it). pyinfra_cli itself is not imported: it
monkey-patches the process with gevent.

Without --inventory every test here is skipped with a message.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest
import testinfra.backend
import testinfra.host

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_addoption(parser):
    parser.addoption("--inventory", default=None,
                     help="pyinfra inventory file whose hosts tests/host checks")
    parser.addoption("--measure", action="store_true", default=False,
                     help="measure the GPU gates again (deploy/host.py) before checking them")


@dataclass
class InventoryHost:
    name: str
    data: dict
    source: str


def _public_names(namespace: dict) -> dict:
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType)
            and not callable(v)}


def _group_data(inventory: Path, group: str) -> dict:
    data: dict = {}
    for base in (Path.cwd(), inventory.parent):
        path = base / "group_data" / f"{group}.py"
        if path.is_file():
            data.update(_public_names(runpy.run_path(str(path))))
    return data


def load_inventory(path: str) -> list[InventoryHost]:
    """Hosts of a pyinfra inventory file with their merged data (host > group > all)."""
    inventory = Path(path).resolve()
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    namespace = runpy.run_path(str(inventory))
    hosts: dict[str, dict] = {}
    groups: dict[str, list[str]] = {}
    for group, value in _public_names(namespace).items():
        if not isinstance(value, (list, tuple)):
            continue
        group_extra: dict = {}
        items = value
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
            items, group_extra = value
        for item in items:
            name, data = (item, {}) if isinstance(item, str) else (item[0], dict(item[1]))
            hosts.setdefault(name, {}).update(data)
            groups.setdefault(name, []).append(group)
            hosts[name].setdefault("__group_extra__", {}).update(group_extra)
    result = []
    for name, host_data in hosts.items():
        merged = _group_data(inventory, "all")
        for group in [*groups[name], inventory.stem]:
            merged.update(_group_data(inventory, group))
        merged.update(host_data.pop("__group_extra__", {}))
        merged.update(host_data)
        result.append(InventoryHost(name, merged, str(path)))
    return result


def testinfra_host(spec: InventoryHost) -> testinfra.host.Host:
    """A testinfra host over paramiko with the inventory's SSH settings."""
    data = spec.data
    if spec.name.startswith("@"):
        pytest.skip(f"{spec.name}: only SSH hosts can be checked (connector {spec.name})")
    hostname = data.get("ssh_hostname") or spec.name
    port = int(data.get("ssh_port") or 22)
    user = data.get("ssh_user") or os.environ.get("USER") or "root"
    key = data.get("ssh_key")
    sudo = bool(data.get("_sudo")) and user != "root"
    backend = testinfra.backend.get_backend(
        f"paramiko://{user}@{hostname}:{port}", ssh_identity_file=key, sudo=sudo)
    client = paramiko.SSHClient()
    known = os.path.expanduser(data.get("ssh_known_hosts_file") or "~/.ssh/known_hosts")
    if os.path.exists(known):
        client.get_host_keys().load(known)  # not load_host_keys: never written back
    policy = str(data.get("ssh_strict_host_key_checking") or "accept-new").lower()
    if policy == "yes":
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    elif policy in ("no", "off"):
        client.set_missing_host_key_policy(paramiko.WarningPolicy())
    else:  # accept-new: an unknown key is accepted (not saved); a changed key is rejected
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(hostname, port=port, username=user,
                   key_filename=os.path.expanduser(key) if key else None,
                   passphrase=data.get("ssh_key_password"),
                   allow_agent=bool(data.get("ssh_allow_agent", True)),
                   look_for_keys=bool(data.get("ssh_look_for_keys", True)), timeout=30)
    backend.client = client  # testinfra's cached_property; ours checks the host key
    return testinfra.host.Host(backend)


def pytest_generate_tests(metafunc):
    if "inventory_host" not in metafunc.fixturenames:
        return
    path = metafunc.config.getoption("--inventory")
    if not path:
        metafunc.parametrize("inventory_host", [pytest.param(
            None, marks=pytest.mark.skip(
                reason="tests/host needs --inventory <pyinfra inventory file>"))],
            ids=["no-inventory"])
        return
    specs = load_inventory(path)
    metafunc.parametrize("inventory_host", specs, ids=[s.name for s in specs], scope="module")


@pytest.fixture(scope="module")
def gpu_host(inventory_host):
    """The testinfra host for one inventory host (one SSH connection per module)."""
    host = testinfra_host(inventory_host)
    yield host
    host.backend.client.close()
