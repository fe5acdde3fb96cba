"""The lab's NVIDIA-layout repository: signed, complete, and its stand-ins print the
formats gpuserve's own parsers read (so the lab exercises the real parsing paths)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.parsers import cuda, nvidia_smi

pytestmark = pytest.mark.skipif(
    not (shutil.which("dpkg-deb") and shutil.which("gpg") and shutil.which("gpgv")),
    reason="needs dpkg-deb, gpg and gpgv",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    import os

    home = tmp_path_factory.mktemp("labhome")
    old = os.environ.get("GPUSERVE_LAB_HOME")
    os.environ["GPUSERVE_LAB_HOME"] = str(home)
    try:
        from lab import nvidia_repo

        mirror = tmp_path_factory.mktemp("mirror")
        nvidia_repo.publish(mirror)
        path = mirror / nvidia_repo.REPO_SUBDIR
        before = (path / "InRelease").stat().st_mtime_ns
        nvidia_repo.publish(mirror)  # unchanged inputs: nothing rebuilt
        assert (path / "InRelease").stat().st_mtime_ns == before
        yield path
    finally:
        if old is None:
            os.environ.pop("GPUSERVE_LAB_HOME", None)
        else:
            os.environ["GPUSERVE_LAB_HOME"] = old


def _extract(repo: Path, pattern: str, dest: Path) -> Path:
    deb = next(repo.glob(pattern))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def test_repository_layout_and_signature(repo, tmp_path):
    packages = (repo / "Packages").read_text()
    names = {line.split(": ", 1)[1] for line in packages.splitlines()
             if line.startswith("Package: ")}
    for name in ("cuda-keyring", "nvidia-open", "nvidia-open-580", "cuda-drivers",
                 "nvidia-driver-pinning-590", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms",
                 "nvidia-persistenced", "cuda-toolkit-12-8", "cuda-toolkit-12-9",
                 "cuda-toolkit-13-0"):
        assert name in names, name
    assert "Filename: ./cuda-keyring_1.1-1_all.deb" in packages
    root = _extract(repo, "cuda-keyring_1.1-1_all.deb", tmp_path / "kr")
    keyring = root / "usr/share/keyrings/cuda-archive-keyring.gpg"
    ok = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo / "InRelease")],
                        capture_output=True)
    assert ok.returncode == 0, ok.stderr
    # a tampered Release must not verify against the detached signature
    bad = tmp_path / "Release"
    bad.write_text((repo / "Release").read_text().replace("amd64", "arm64"))
    fail = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo / "Release.gpg"),
                           str(bad)], capture_output=True)
    assert fail.returncode != 0
    sources = (root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
    assert "/compute/cuda/repos/debian12/x86_64/ /" in sources


def _smi(tmp_path: Path, repo: Path, box: str, *args: str, front: bool = True) -> str:
    """The packaged nvidia-smi as installed: the sh front (/usr/bin/nvidia-smi), which
    answers topo itself and hands the rest to the Python stand-in; ``front=False`` runs
    that stand-in directly. Guest paths are moved under ``tmp_path``."""
    drv = _extract(repo, "nvidia-driver_580.126.20-1_amd64.deb", tmp_path / "drv")
    hw = _extract(repo, "gpuserve-lab-hardware_*_all.deb", tmp_path / "hw")
    boxes = hw / "usr/share/gpuserve-lab/boxes"

    def place(member: str, name: str, interpreter: str) -> Path:
        script = (drv / member).read_text()
        script = script.replace("/usr/share/gpuserve-lab/boxes", str(boxes))
        script = script.replace("/etc/gpuserve-lab/box", str(tmp_path / "box"))
        script = script.replace("/usr/lib/gpuserve-lab/nvidia-smi", str(tmp_path / "smi.py"))
        script = script.replace("/run/", f"{tmp_path}/run/")
        script = script.split("\n", 1)[1]
        path = tmp_path / name
        path.write_text(f"#!{interpreter}\n{script}")
        path.chmod(0o755)
        return path

    (tmp_path / "box").write_text(box + "\n")
    (tmp_path / "run").mkdir(exist_ok=True)
    python = place("usr/lib/gpuserve-lab/nvidia-smi", "smi.py", sys.executable)
    entry = place("usr/bin/nvidia-smi", "smi", "/bin/sh") if front else python
    out = subprocess.run([str(entry), *args], capture_output=True, text=True)
    assert out.returncode == 0, out
    return out.stdout


@pytest.mark.parametrize("box", ["rtxpro6000-kvm", "rtxpro6000-baremetal", "h200-nvlink",
                                 "hgx-h100", "rtxpro6000-kvm-driver575",
                                 "rtxpro6000-kvm-p2p"])
@pytest.mark.parametrize("args", [("topo", "-m"), ("topo", "-p2p", "r"), ("topo", "-p2p", "w"),
                                  ("topo", "-p2p", "n"), ("-L",)])
def test_nvidia_smi_front_prints_what_the_python_stand_in_prints(repo, tmp_path, box, args):
    """The sh front's fast path is only a faster way to the same recorded files."""
    assert _smi(tmp_path, repo, box, *args) == _smi(tmp_path, repo, box, *args, front=False)


@pytest.mark.parametrize("box", ["rtxpro6000-kvm", "rtxpro6000-kvm-driver575"])
def test_nvidia_smi_front_keeps_query_answers_per_persistence_state(repo, tmp_path, box):
    """The front answers a repeated --query-gpu from /run without the Python stand-in,
    and the answer follows persistence mode, the one part of it that changes."""
    query = nvidia_smi.QUERY_COMMAND.split()[1:]
    first = _smi(tmp_path, repo, box, *query)
    assert first == _smi(tmp_path, repo, box, *query, front=False)
    assert "Disabled" in first
    (tmp_path / "smi.py").write_text("#!/bin/sh\nexit 3\n")  # the stand-in is gone now

    def front() -> subprocess.CompletedProcess:  # the front placed by _smi, as it is now
        return subprocess.run([str(tmp_path / "smi"), *query], capture_output=True, text=True)

    assert front().stdout == first  # from the kept answer
    persist = tmp_path / "run" / "nvidia-persistenced"
    persist.mkdir()
    (persist / "nvidia-persistenced.pid").write_text(f"{os.getpid()}\n")
    (persist / "gpuserve-lab-persistence-mode").write_text("")
    assert front().returncode == 3  # persistence on: a new key, the stand-in is asked
    enabled = _smi(tmp_path, repo, box, *query)  # placed again, the stand-in is back
    assert enabled == first.replace("Disabled", "Enabled")
    kept = sorted(p.name.split(".")[:2]
                  for p in (tmp_path / "run" / "gpuserve-lab").glob("nvidia-smi-*/*"))
    assert kept == [[box, "Disabled"], [box, "Enabled"]]


def test_nvidia_smi_reference_box(repo, tmp_path):
    gpus = nvidia_smi.parse_query_gpu(_smi(tmp_path, repo, "rtxpro6000-kvm",
                                           *nvidia_smi.QUERY_COMMAND.split()[1:]))
    assert len(gpus) == 8
    assert {g["name"] for g in gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {g["memory_total_mib"] for g in gpus} == {97887}
    assert {g["driver_version"] for g in gpus} == {"580.126.20"}
    assert gpus[0]["compute_cap"] == "12.0"
    topo = nvidia_smi.parse_topo_matrix(_smi(tmp_path, repo, "rtxpro6000-kvm", "topo", "-m"))
    links = topo.to_json()["links"]
    assert all(links[i][j] == "PHB" for i in range(8) for j in range(8) if i != j)
    p2p = nvidia_smi.parse_p2p_matrix(_smi(tmp_path, repo, "rtxpro6000-kvm", "topo", "-p2p", "r"))
    assert nvidia_smi.p2p_verdict(p2p) == "none"
    units = _smi(tmp_path, repo, "rtxpro6000-kvm", "--query-gpu=name,memory.total",
                 "--format=csv")
    assert units.splitlines()[:2] == [
        "name, memory.total [MiB]", "NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB"]


@pytest.mark.parametrize(("box", "link"), [("rtxpro6000-baremetal", "NODE"),
                                           ("h200-nvlink", "NV18"),
                                           # the reference guest with a P2P clique
                                           ("rtxpro6000-kvm-p2p", "PHB")])
def test_nvidia_smi_other_boxes(repo, tmp_path, box, link):
    p2p = nvidia_smi.parse_p2p_matrix(_smi(tmp_path, repo, box, "topo", "-p2p", "w"))
    assert nvidia_smi.p2p_verdict(p2p) == "ok"
    topo = nvidia_smi.parse_topo_matrix(_smi(tmp_path, repo, box, "topo", "-m"))
    assert topo.to_json()["links"][0][1] == link


@pytest.mark.parametrize("lane", ["12.8", "12.9", "13.0"])
def test_toolkit_packages_report_their_lane(repo, tmp_path, lane):
    dash = lane.replace(".", "-")
    root = _extract(repo, f"cuda-toolkit-{dash}_*.deb", tmp_path / "tk")
    nvcc = subprocess.run([str(root / f"usr/local/cuda-{lane}/bin/nvcc"), "--version"],
                          capture_output=True, text=True, check=True).stdout
    assert cuda.parse_nvcc_version(nvcc) == lane
    assert cuda.parse_version_json((root / f"usr/local/cuda-{lane}/version.json").read_text()) \
        == lane


def _offered(repo: Path, package: str) -> set[str]:
    stanzas = (repo / "Packages").read_text().split("\n\n")
    return {line.split(": ", 1)[1] for s in stanzas if f"Package: {package}\n" in s + "\n"
            for line in s.splitlines() if line.startswith("Version: ")}


def test_debian13_repository_offers_what_nvidias_does_under_a_key_of_its_own(repo, tmp_path):
    """NVIDIA's debian13 repository has no R580 driver (NVIDIA/cuda-repo-management#38)
    and is signed with a key of its own; the stand-in's binding signatures are SHA-256 or
    stronger (Debian 13's sqv rejects SHA1 bindings since 2026-02-01)."""
    d13 = repo.parent.parent / "debian13" / "x86_64"
    assert _offered(repo, "nvidia-driver-cuda") == {"580.126.20-1", "590.48.01-1",
                                                    "595.71.05-1"}
    assert _offered(d13, "nvidia-driver-cuda") == {"590.48.01-1", "595.71.05-1"}
    assert not _offered(d13, "nvidia-open-580") and _offered(d13, "cuda-toolkit-13-0")
    key13 = _extract(d13, "cuda-keyring_1.1-1_all.deb", tmp_path / "k13") / (
        "usr/share/keyrings/cuda-archive-keyring.gpg")
    key12 = _extract(repo, "cuda-keyring_1.1-1_all.deb", tmp_path / "k12") / (
        "usr/share/keyrings/cuda-archive-keyring.gpg")
    assert key13.read_bytes() != key12.read_bytes()
    ok = subprocess.run(["gpgv", "--keyring", str(key13), str(d13 / "InRelease")],
                        capture_output=True)
    assert ok.returncode == 0, ok.stderr
    other = subprocess.run(["gpgv", "--keyring", str(key12), str(d13 / "InRelease")],
                           capture_output=True)
    assert other.returncode != 0
    packets = subprocess.run(["gpg", "--list-packets", str(key13)], capture_output=True,
                             text=True, env={**os.environ, "GNUPGHOME": str(tmp_path)})
    algos = [int(line.split("digest algo ")[1].split(",")[0])
             for line in packets.stdout.splitlines() if "digest algo " in line]
    assert algos and all(a >= 8 for a in algos), packets.stdout  # 2 is SHA1, 8 SHA-256
    sources = (key13.parents[3] / "etc/apt/sources.list.d/cuda-debian13-x86_64.list")
    assert "/compute/cuda/repos/debian13/x86_64/ /" in sources.read_text()
