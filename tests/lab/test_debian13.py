"""A Debian 13 host end to end (container tier): `python -m lab up --os debian13`, then
the host deploy, the serve deploy and reruns with no changes, on trixie's own python3
(3.13), deb822 apt sources, apt verifying with sqv only, and systemd 257.

The host's kernel module stands in for its Proxmox host's: first an R580 module, which
the debian13 repository of the lab's NVIDIA stand-in (as NVIDIA's) has no userspace for,
refused before any change and saying why; then the 590 module, whose userspace comes
from that repository. SGLang runs from the mirror's managed-CPython stand-in, chosen
because python3 3.13 has no lock. A profile whose model comes from the Hub stand-in
then has its weights fetched on this host. And apt refuses a repository whose key's
binding uses SHA1, as it refuses NVIDIA's debian12 key. What it does not prove: a real
python-build-standalone build, the real debian13 repository's key (docs/hosts.md). Last,
the host is its own gateway: smg's venv on the same interpreter choice, and a rerun.
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from labhelpers import clean, healthy, lab_hub, no_changes, unit_venv

from lab.sshutil import instance_ssh

pytestmark = pytest.mark.lab

MODULE = "590.48.01"
R580 = "580.126.20"
REPO = "cuda/repos/debian13/x86_64/"
MANAGED = "/opt/gpuserve/python/cpython-3.11.2+lab"
TINY = "gpuserve-lab/Tiny-Llama-3L"


def deploy(lab, script: str, *data: str) -> tuple[int, str]:
    r = lab.run_pyinfra(script, *[a for kv in data for a in ("--data", kv)], check=False)
    return r.returncode, clean(r.stdout)


def fingerprint(lab) -> str:
    return lab.ssh("ls -la --time-style=full-iso /etc/apt/sources.list.d "
                   "/etc/apt/preferences.d 2>&1; dpkg -l | md5sum", check=True).stdout


@pytest.fixture(scope="module")
def runs(debian13_lab, tmp_path_factory) -> dict[str, tuple[int, str]]:
    """Every deploy of the module, in order, on one fresh Debian 13 host."""
    lab = debian13_lab
    out: dict[str, tuple[int, str]] = {}
    lab.set_host_driver_version(R580)
    try:
        before = fingerprint(lab)
        out["refused"] = deploy(lab, "deploy/host.py")
        out["unchanged"] = (int(before == fingerprint(lab)), "")
    finally:
        lab.set_host_driver_version(MODULE)
    out["host"] = deploy(lab, "deploy/host.py")
    out["serve"] = deploy(lab, "deploy/serve.py", "bench=off")
    out["host again"] = deploy(lab, "deploy/host.py")
    out["serve again"] = deploy(lab, "deploy/serve.py", "bench=off")
    hub = lab_hub(lab)
    profile = tmp_path_factory.mktemp("debian13-profiles") / "tiny-hf.yaml"
    profile.write_text("description: the lab Hub's small checkpoint, fetched by the deploy\n"
                       f"model:\n  hf: {TINY}@{hub.main_commit(TINY)}\nparallel:\n  tp: 1\n")
    weights = ("bench=off", f"profile={profile}", f"hf_endpoint={hub.url}",
               f"hf_plan_endpoint={hub.local_url}")
    out["weights"] = deploy(lab, "deploy/serve.py", *weights)
    out["weights again"] = deploy(lab, "deploy/serve.py", *weights)
    # the host is its own gateway (inventory/lab.py): smg's venv on the same choice
    out["gateway"] = deploy(lab, "deploy/router.py")
    out["gateway again"] = deploy(lab, "deploy/router.py")
    return out


def test_the_host_is_debian_13_as_installed(debian13_lab) -> None:
    lab = debian13_lab
    release = lab.ssh("cat /etc/os-release", check=True).stdout
    assert 'VERSION_ID="13"' in release and "trixie" in release
    assert lab.ssh("python3 -V", check=True).stdout.startswith("Python 3.13.")
    systemd = lab.ssh("systemctl --version", check=True).stdout.split()[1]
    assert int(systemd) >= 257
    # deb822 sources only, and apt has sqv (Sequoia) and no gpgv to verify with
    assert lab.ssh("test -e /etc/apt/sources.list").returncode != 0
    assert lab.ssh("test -f /etc/apt/sources.list.d/debian.sources").returncode == 0
    assert lab.ssh("command -v sqv && ! command -v gpgv").returncode == 0


def test_an_r580_module_is_refused_before_any_change_saying_why(runs) -> None:
    rc, out = runs["refused"]
    assert rc != 0, out[-4000:]
    assert (f"its kernel module {R580} is its host's, and no userspace driver of branch 580 "
            "can be installed on debian13: NVIDIA's debian13 repository carries no R580 "
            "driver") in out, out[-4000:]
    assert "load a driver of branch 590 or later on the container's host" in out
    assert "Beginning operation run" not in out and runs["unchanged"][0] == 1


def test_host_deploy_installs_590_from_the_debian13_repository(debian13_lab, runs) -> None:
    lab = debian13_lab
    rc, out = runs["host"]
    assert rc == 0, out[-6000:]
    assert f"NVIDIA userspace driver nvidia-driver-cuda={MODULE}-1" in out
    smi = lab.ssh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u",
                  check=True).stdout.split()
    assert smi == [MODULE]
    # contrib added to the deb822 stanzas; NVIDIA's source is the debian13 repository
    sources = lab.ssh("cat /etc/apt/sources.list.d/debian.sources", check=True).stdout
    assert sources.count("Components: main non-free-firmware contrib") == 2, sources
    cuda = lab.ssh("cat /etc/apt/sources.list.d/cuda-debian13-x86_64.sources",
                   check=True).stdout
    assert re.search(rf"URIs: http://\S+/{re.escape(REPO)}", cuda), cuda
    # apt (sqv) accepts the repository's signature: a clean update, no warning about it
    update = lab.ssh("apt-get update 2>&1", check=True).stdout
    assert "debian13/x86_64" in update and not re.search(r"^(W|E): .*debian13", update,
                                                         re.M), update


def test_serve_deploy_runs_on_the_managed_interpreter(debian13_lab, runs) -> None:
    lab = debian13_lab
    rc, out = runs["serve"]
    assert rc == 0, out[-6000:]
    assert ("SGLang interpreter: managed Python 3.11.2" in out
            and "python3 is 3.13" in out and "(no lock for 3.13)" in out), out[-6000:]
    venv = unit_venv(lab)
    base = lab.ssh(f"{venv}/bin/python -c 'import sys; print(sys.base_prefix)'",
                   check=True).stdout.strip()
    assert base == MANAGED
    assert lab.ssh("readlink -f /usr/bin/python3", check=True).stdout.strip() == (
        "/usr/bin/python3.13")


def test_reruns_change_nothing(runs) -> None:
    for name in ("host again", "serve again"):
        rc, out = runs[name]
        assert rc == 0 and no_changes(out), (name, out[-4000:])


def test_weights_fetched_verified_and_served_then_kept(debian13_lab, runs) -> None:
    rc, out = runs["weights"]
    assert rc == 0, out[-6000:]
    assert re.search(rf"weights: {TINY}@[0-9a-f]{{12}} verified \(\d+ files", out), out[-4000:]
    assert healthy(debian13_lab)
    rc, out = runs["weights again"]
    assert rc == 0 and no_changes(out), out[-4000:]


def test_gateway_runs_smg_on_a_managed_interpreter_beside_python3(debian13_lab, runs) -> None:
    """deploy/router.py chooses as the serve deploy does: python3 3.13 has no smg lock,
    so the mirror's managed stand-in under router_home, with smg's py311 lock."""
    lab = debian13_lab
    rc, out = runs["gateway"]
    assert rc == 0, out[-6000:]
    assert ("gateway interpreter: managed Python 3.11.2" in out and "python3 is 3.13" in out
            and "for the gateway's (smg) venv only" in out), out[-6000:]
    assert "router venv: verified smg 1.13.0" in out and "1/1 workers ready" in out, out[-4000:]
    unit = lab.ssh("systemctl cat gpuserve-router.service", check=True).stdout
    venv = re.search(r"(/opt/gpuserve-router/venvs/smg-1\.13\.0-\S+?)/bin/python", unit).group(1)
    base = lab.ssh(f"{venv}/bin/python -c 'import sys; print(sys.base_prefix)'",
                   check=True).stdout.strip()
    assert base == MANAGED.replace("/opt/gpuserve/", "/opt/gpuserve-router/")
    rc, out = runs["gateway again"]
    assert rc == 0 and no_changes(out), out[-4000:]


def sha1_bound_repository(tmp_path: Path) -> bytes:
    """A flat repository signed by a key whose self-signature uses SHA1 (as NVIDIA's
    debian12 key 3BF863CC's binding does), as a tar: key.gpg and repo/."""
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback",
           "--passphrase", ""]
    subprocess.run([*gpg, "--cert-digest-algo", "SHA1", "--quick-gen-key",
                    "sha1-bound <lab@gpuserve.invalid>", "rsa3072", "sign", "never"],
                   check=True, capture_output=True)
    key = subprocess.run([*gpg, "--export"], check=True, capture_output=True).stdout
    release = "Origin: lab\nLabel: SHA1-bound key\nSHA256:\n"
    signed = subprocess.run([*gpg, "--digest-algo", "SHA256", "--clearsign"],
                            input=release.encode(), check=True, capture_output=True).stdout
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("key.gpg", key), ("repo/InRelease", signed)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)
    return buf.getvalue()


def test_apt_rejects_a_key_bound_with_sha1(debian13_lab, tmp_path) -> None:
    """Debian 13's apt (sqv) refuses a repository whose key's binding uses SHA1, with the
    message of NVIDIA/cuda-repo-management#30; the lab's own debian13 key passes above."""
    st = debian13_lab.state
    cmd = ("rm -rf /tmp/sha1 && mkdir /tmp/sha1 && tar xf - -C /tmp/sha1 && "
           "echo 'deb [signed-by=/tmp/sha1/key.gpg] file:/tmp/sha1/repo /' > /tmp/sha1/one.list"
           " && apt-get update -o Dir::Etc::SourceList=/tmp/sha1/one.list "
           "-o Dir::Etc::SourceParts=- 2>&1")
    r = subprocess.run([*instance_ssh(st), cmd],
                       input=sha1_bound_repository(tmp_path), capture_output=True, timeout=120)
    out = r.stdout.decode(errors="replace")
    assert r.returncode != 0, out
    assert "/usr/bin/sqv" in out and "is not bound" in out, out
    assert "SHA1 is not considered secure since 2026-02-01" in out, out
    assert "E: The repository 'file:/tmp/sha1/repo  InRelease' is not signed." in out, out
