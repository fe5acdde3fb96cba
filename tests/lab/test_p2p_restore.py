"""Restoring P2P on the lab's reference box changes the server's NCCL transport at the
next serve, with no profile change (docs/gpu-gates.md, "The host decides the transport").

One module-scoped sequence on the container lab host: the reference box (a KVM guest,
P2P ``CNS``) is measured (P2P off) and serves glm5-nvfp4-tp8 with ``NCCL_P2P_DISABLE=1``
from nccl.env and ``--disable-custom-all-reduce`` from host.json -> the box becomes the
same guest with its GPUs in a P2P clique (``python -m lab box rtxpro6000-kvm-p2p``, a
composed box: lab/nvidia_repo/boxes/SOURCES.md) -> deploy/host.py measures again (the
driver's verdict changed), P2P on is faster, so nccl.env keeps NCCL's defaults -> the
serve deploy's ``--dry --diff`` shows the argument change and the restart and changes
nothing -> the real serve restarts the server without the flag and without
``NCCL_P2P_DISABLE`` in its environment. The box goes back to the reference box at the
end (a later host deploy measures again: the verdict changed). Throughput checks off:
they are test_serve's subject.
"""

from __future__ import annotations

import json
import re

import pytest
from labhelpers import ENV_PATH, UNIT, UNIT_PATH, clean, served_profile

from gpuserve.host import nccl_env

pytestmark = pytest.mark.lab

NO_HEADERS = ("--data", "nvidia_install_headers=False")  # as in test_host_deploy.py
BENCH_OFF = ("--data", "bench=off")
FLAG = "--disable-custom-all-reduce"


def deploy(lab, script: str, *extra: str) -> tuple[int, str]:
    r = lab.run_pyinfra(script, *extra, check=False)
    return r.returncode, clean(r.stdout)


def host_file(lab, path: str) -> str:
    return lab.ssh(f"cat {path}", check=True).stdout


def server(lab) -> tuple[str, dict[str, str]]:
    """The live server's PID and environment (/proc/PID/environ: what NCCL reads)."""
    pid = lab.ssh(f"systemctl show -p MainPID --value {UNIT}", check=True).stdout.strip()
    text = lab.ssh(f"tr '\\0' '\\n' < /proc/{pid}/environ", check=True).stdout
    return pid, dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def args_line(lab) -> str:
    return lab.ssh(f"grep '^GPUSERVE_SGLANG_ARGS=' {ENV_PATH}", check=True).stdout


def live(lab) -> str:
    return lab.ssh(f"sha256sum {UNIT_PATH} {ENV_PATH}; systemctl show -p MainPID --value "
                   f"{UNIT}", check=True).stdout


@pytest.fixture(scope="module", autouse=True)
def reference_box(lab):
    # (a fresh guest has no /etc/gpuserve-lab until the driver role installs the boxes)
    reset = ("if [ -d /etc/gpuserve-lab ]; then rm -f /etc/gpuserve-lab/gates-hang "
             "/etc/gpuserve-lab/gates-slow; echo rtxpro6000-kvm > /etc/gpuserve-lab/box; fi")
    lab.ssh(reset, check=True)
    yield
    lab.lab_cli("box", "--name", lab.name, "rtxpro6000-kvm", check=False)


def test_the_reference_box_serves_with_the_transport_its_host_measured(lab):
    rc, out = deploy(lab, "deploy/host.py", *NO_HEADERS, "--data", "gates_remeasure=True")
    assert rc == 0, out[-4000:]
    assert "gates: NCCL env chosen from measurement: driver P2P verdict is none" in out
    assert nccl_env.parse_env_file(host_file(lab, nccl_env.NCCL_ENV_PATH)) == {
        "NCCL_P2P_DISABLE": "1"}
    rc, out = deploy(lab, "deploy/serve.py", *BENCH_OFF)
    assert rc == 0, out[-6000:]
    assert "lab-gpu: NCCL transport: measured (driver P2P verdict is none" in out, out[-4000:]
    assert served_profile(lab) == "glm5-nvfp4-tp8"
    assert FLAG in args_line(lab)  # from host.json, not the profile
    assert "NCCL_P2P_DISABLE" not in host_file(lab, ENV_PATH)
    _, env = server(lab)
    assert env.get("NCCL_P2P_DISABLE") == "1"  # nccl.env, read before the profile's


def test_restoring_p2p_changes_the_launch_at_the_next_serve(lab):
    lab.lab_cli("box", "--name", lab.name, "rtxpro6000-kvm-p2p")
    # the driver's verdict changed (CNS -> OK): the last measurement is stale
    rc, out = deploy(lab, "deploy/host.py", *NO_HEADERS)
    assert rc == 0, out[-4000:]
    assert "P2P on is faster (38.37 vs 25.81 GB/s at 2147483648 B" in out, out[-4000:]
    assert "NCCL_P2P_DISABLE" not in nccl_env.parse_env_file(
        host_file(lab, nccl_env.NCCL_ENV_PATH))
    host_json = json.loads(host_file(lab, nccl_env.HOST_JSON_PATH))
    assert host_json["p2p"] == "ok" and host_json["disable_custom_all_reduce"] is False

    before, (pid, _) = live(lab), server(lab)
    rc, out = deploy(lab, "deploy/serve.py", *BENCH_OFF, "--dry", "--diff")
    assert rc == 0, out[-6000:]
    assert "lab-gpu: preview: changes (nothing on the host was changed)" in out, out[-6000:]
    removed = [line for line in out.splitlines() if line.strip().startswith("-GPUSERVE_SGLANG")]
    added = [line for line in out.splitlines() if line.strip().startswith("+GPUSERVE_SGLANG")]
    assert removed and FLAG in removed[0], out[-6000:]
    assert added and FLAG not in added[0]
    assert re.search(r"lab-gpu: preview: server: restart: .*sglang\.env would change", out)
    assert "NCCL transport: measured (P2P on is faster" in out
    assert "Beginning operation run" not in out
    assert live(lab) == before  # unit, env file and server PID unchanged

    rc, out = deploy(lab, "deploy/serve.py", *BENCH_OFF)
    assert rc == 0, out[-6000:]
    assert FLAG not in args_line(lab)
    new_pid, env = server(lab)
    assert new_pid != pid and "NCCL_P2P_DISABLE" not in env
