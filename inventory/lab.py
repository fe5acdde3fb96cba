"""pyinfra inventory for the lab: the running QEMU instance as one GPU host, `lab-gpu`.

    python -m lab up
    pyinfra -y inventory/lab.py deploy/serve.py

Reads the state `python -m lab up` wrote for instance $GPUSERVE_LAB_NAME (default
"default"). Host-key checking stays strict: the lab pins the guest's host key in its
own known_hosts file (real inventories must never disable host-key checking).
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from lab.gate_tools import archive_sha256  # noqa: E402
from lab.locks import locks_dir  # noqa: E402
from lab.nvidia_repo import keyring_sha256  # noqa: E402
from lab.state import (  # noqa: E402
    DEFAULT_NAME,
    instance_dir,
    instance_name,
    pid_alive,
    read_state,
)

# Host data of the lab host, in one place. `{mirror}` is the instance's loopback mirror
# as the guest sees it (http://10.0.2.2:<port>/); `{locks}` is the directory on this
# controller where `python -m lab up` wrote the locks of the mirror's stand-in wheels
# (lab/locks.py: tools/gen_lock.py over <mirror>/wheels). The GPUSERVE_LAB_STANDIN_*
# knobs steer the SGLang stand-in and are set only here, never by product code.
# The loopback mirror is plain http, so it is marked trusted (product code refuses http
# URLs otherwise), and its keyring, built with the lab's own key, is pinned by the
# sha256 read from the published mirror (`{keyring_sha256}`).
LAB_HOST_DATA = {
    "profile": "glm5-nvfp4-tp8",
    "sglang_version": "0.5.23+lab",
    "sglang_locks_dir": "{locks}",
    "pip_find_links": "{mirror}wheels/",
    # the stand-in's simulated weight load: long enough for the health gate to see the
    # start-up phases, short because the tier starts the server some thirty times; its
    # single-stream decode at 100 tok/s, about the field notes' box (89.5), so the shipped
    # profiles' floors (>= 80.5 tok/s single stream, from the notes) are judged in the
    # lab as they are, never lowered (docs/lab.md)
    "sglang_extra_env": {"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "3",
                         "GPUSERVE_LAB_STANDIN_DECODE_TPS": "100"},
    "nvidia_repo_url": "{mirror}cuda/repos/debian12/x86_64/",
    "nvidia_keyring_sha256": "{keyring_sha256}",
    "trusted_mirrors": ["{mirror}"],
    "allow_reboot": True,
    # the measuring tools' stand-in sources (lab/gate_tools), pinned by the digests the
    # publisher computed; the stand-ins finish within a second or two, so a hang shows
    # within 15 s
    "gates_sources": {
        "nccl-tests": {"url": "{mirror}gates/nccl-tests-lab.tar.gz",
                       "sha256": "{nccl_tests_sha256}"},
        "cuda-samples": {"url": "{mirror}gates/cuda-samples-lab.tar.gz",
                         "sha256": "{cuda_samples_sha256}"},
    },
    "gates_timeout": 15,
    # SGLang's gateway (deploy/router.py): the lab host is its own only worker. smg and
    # its dependencies are the real PyPI wheels of the committed lock, published on the
    # mirror (lab/locks.py: downloaded here, sha256-checked against the lock). The key is
    # the lab's own, not a secret; it still takes the secret's path (0600, credential).
    "router_workers_group": "gpu",
    "router_api_key": "lab-router-key-not-a-secret-0001",
    "router_pip_find_links": "{mirror}pypi/",
    # the worker is up before the gateway here: retry a missing one every 5 s, not 30 s;
    # reread the manifest every 2 s (the fleet tests take workers out a dozen times)
    "router_worker_startup_check_interval": 5,
    "router_discovery_interval": 2,
}

# What a Debian 13 lab host (`python -m lab up --os debian13`) has on top: the debian13
# repository of the lab's NVIDIA stand-in (no R580 there, as at NVIDIA: branch 590, the
# branch of its container's host module), and the SGLang venvs on the mirror's
# managed-CPython stand-in, since its python3 (3.13) has no lock (the interpreter choice
# finds it through sglang_python_builds; docs/hosts.md says what that proves).
LAB_OS_HOST_DATA = {
    "debian13": {
        "nvidia_repo_url": "{mirror}cuda/repos/debian13/x86_64/",
        "nvidia_driver_branch": 590,
        "sglang_python_builds": "{python_builds_catalog}",
        "sglang_python_mirror": "{mirror}python-builds/",
    },
}


class LabNotRunning(RuntimeError):
    pass


def host_data_for(name: str) -> dict:
    """Host data of lab instance ``name`` (inventory/lab_fleet.py builds on it)."""
    st = read_state(name)
    if st is None or not pid_alive(st.pid):
        raise LabNotRunning(
            f"lab instance {name!r} is not running: run `python -m lab up` "
            f"(or `GPUSERVE_LAB_NAME={name} python -m lab up`) first")
    locks = locks_dir(st.mirror_root)
    if not any(locks.glob("sglang-*.json")):
        print(f"inventory/lab.py: warning: no lab locks in {locks}; run `python -m lab up` "
              "again (it republishes the mirror, locks included)", file=sys.stderr)
    lab_os = st.extra.get("os", "debian12")
    keyring = keyring_sha256(st.mirror_root, lab_os)
    if keyring is None:
        print(f"inventory/lab.py: warning: no lab cuda-keyring under {st.mirror_root}; run "
              "`python -m lab up` again (it republishes the mirror)", file=sys.stderr)
    # {hub}: the Hub stand-in (lab/hub) as the guest sees it, a host's HF_ENDPOINT;
    # {hub_local}: the same from this controller
    fields = {"mirror": st.mirror_url, "hub": st.hub_url, "hub_local": st.hub_local_url,
              "locks": str(locks), "keyring_sha256": keyring or "",
              "python_builds_catalog": str(Path(st.mirror_root) / "python-builds"
                                           / "catalog.json"),
              "nccl_tests_sha256": archive_sha256(st.mirror_root, "nccl-tests-lab.tar.gz") or "",
              "cuda_samples_sha256":
                  archive_sha256(st.mirror_root, "cuda-samples-lab.tar.gz") or ""}

    def fill(value):
        if isinstance(value, str):
            return value.format(**fields)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value

    data = {k: fill(v) for k, v in {**LAB_HOST_DATA,
                                    **LAB_OS_HOST_DATA.get(lab_os, {})}.items()}
    if name != DEFAULT_NAME:
        # results of test instances stay with the instance, apart from the demo's
        data.setdefault("results_dir", str(instance_dir(name) / "results"))
    data.update(
        ssh_hostname="127.0.0.1",
        ssh_port=st.ssh_port,
        ssh_user="root",
        ssh_key=st.ssh_key,
        ssh_known_hosts_file=st.known_hosts,
        ssh_strict_host_key_checking="yes",
        ssh_allow_agent=False,
        ssh_look_for_keys=False,
    )
    return data


gpu = [("lab-gpu", host_data_for(instance_name()))]
