"""deploy/host.py and deploy/serve.py on the lab's NVSwitch box (hgx-h100, container tier).

The box is switched on the running host (``python -m lab box``); the first host deploy
installs Fabric Manager with the userspace driver, at the host kernel module's exact
version, holds both, starts it and waits for the fabric; the serve deploy serves (the
torch stand-in sees CUDA only with the fabric registered); a driver branch change (the
container host's module moves to R590) moves both packages together and restarts Fabric
Manager at the new version. The teardown moves the host back (R580, reference box) and
takes Fabric Manager off, so the modules after this one find the host as before.
The host deploys run the measured gates with default host data: the stand-in tools answer
with the box's NVLink figures (lab/gate_tools), and a degraded link (gates-slow) fails them.
What this proves and what it does not (no NVSwitch, no kernel module): docs/nvswitch.md.
"""

from __future__ import annotations

import pytest
from labhelpers import clean, no_changes, unit_venv

from gpuserve.host import fabric
from gpuserve.parsers import nvidia_smi

pytestmark = pytest.mark.lab

PACKAGES = ("nvidia-driver-cuda", "nvidia-fabricmanager", "libnvidia-nscq")
BRANCH_CHANGE = "590.48.01"  # an R590 release the lab repository carries (packages.yaml)


def host_deploy(lab, *extra: str) -> tuple[int, str]:
    """deploy/host.py with default host data: the measured gates run (nvlink4 class)."""
    r = lab.run_pyinfra("deploy/host.py", *extra, check=False)
    return r.returncode, clean(r.stdout)


def versions(lab) -> dict[str, str]:
    out = lab.ssh("dpkg-query -W -f='${Package} ${Version}\\n' " + " ".join(PACKAGES),
                  check=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def fabric_state(lab) -> fabric.FabricVerdict:
    return fabric.judge(nvidia_smi.parse_fabric(lab.ssh("nvidia-smi -q", check=True).stdout))


@pytest.fixture(scope="module")
def hgx(lab):
    module = lab.state.extra["driver_version"]
    lab.lab_cli("box", "--name", lab.name, "hgx-h100")
    first = host_deploy(lab)
    yield module, first
    lab.set_host_driver_version(module)
    host_deploy(lab)
    lab.ssh("apt-mark unhold " + " ".join(PACKAGES) + "; systemctl disable --now "
            "nvidia-fabricmanager; DEBIAN_FRONTEND=noninteractive apt-get purge -y "
            "nvidia-fabricmanager libnvidia-nscq", check=True)
    lab.lab_cli("box", "--name", lab.name, "rtxpro6000-kvm")


def test_host_deploy_installs_and_starts_fabric_manager_at_the_drivers_version(lab, hgx):
    module, (rc, out) = hgx
    assert rc == 0, out[-6000:]
    assert "NVSwitch host (/proc/driver/nvidia-nvswitch/devices lists 4" in out
    assert "Fabric Manager nvidia-fabricmanager, libnvidia-nscq at the driver's version" in out
    assert versions(lab) == {p: f"{module}-1" for p in PACKAGES}
    held = set(lab.ssh("apt-mark showhold", check=True).stdout.split())
    assert set(PACKAGES) <= held
    assert lab.ssh("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
    assert lab.ssh("systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"
    assert fabric_state(lab).state == "ready"
    # the gates judged the box's own figures: NVLink, the 4 GiB row the class reads
    assert "gates: NCCL env chosen from measurement: P2P on is faster" in out, out[-6000:]
    assert "is not ready" not in out


def test_host_deploy_rerun_reports_no_changes(lab, hgx):
    rc, out = host_deploy(lab)
    assert rc == 0 and no_changes(out), out[-6000:]


def test_degraded_nvlink_fails_the_gates_naming_the_figure(lab, hgx):
    lab.ssh("echo 4 > /etc/gpuserve-lab/gates-slow", check=True)
    try:
        rc, out = host_deploy(lab, "--data", "gates_remeasure=True")
    finally:
        lab.ssh("rm -f /etc/gpuserve-lab/gates-slow", check=True)
    assert rc != 0, out[-6000:]
    assert "gates: lab-gpu is not ready (measured vs expected):" in out, out[-6000:]
    assert "p2p_bidir_best: 187.34 GB/s vs expectation 742 GB/s" in out, out[-6000:]
    rc, out = host_deploy(lab, "--data", "gates_remeasure=True")
    assert rc == 0, out[-6000:]


def test_serve_deploy_serves_on_the_hgx_box(lab, hgx):
    # bench=off: the throughput checks prove nothing about the fabric (CI time)
    r = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", check=False)
    out = clean(r.stdout)
    assert r.returncode == 0, out[-6000:]
    assert "lab-gpu: health: " in out and "lab-gpu: smoke: " in out
    # the served venv's torch sees the eight GPUs (error 802 without the fabric)
    count = lab.ssh(f"{unit_venv(lab)}/bin/python -c 'import torch; "
                    "print(torch.cuda.device_count())'", check=True).stdout.split()
    assert count == ["8"]


def test_driver_branch_change_moves_driver_and_fabric_manager_together(lab, hgx):
    lab.set_host_driver_version(BRANCH_CHANGE)
    rc, out = host_deploy(lab)
    assert rc == 0, out[-6000:]
    assert versions(lab) == {p: f"{BRANCH_CHANGE}-1" for p in PACKAGES}
    assert lab.ssh("cat /run/nvidia-fabricmanager/gpuserve-lab-version",
                   check=True).stdout.strip() == BRANCH_CHANGE
    assert fabric_state(lab).state == "ready"
