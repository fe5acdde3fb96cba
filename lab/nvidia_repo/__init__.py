"""Lab stand-in for NVIDIA's CUDA apt repository (flat repo, signed with a lab key).

``publish(mirror_root)`` builds ``mirror_root/cuda/repos/<distro>/x86_64/`` for each
distribution of packages.yaml (debian12, debian13) with the layout of
https://developer.download.nvidia.com/compute/cuda/repos/<distro>/x86_64/:
``Packages``(.gz), ``Release``, ``InRelease`` and ``Release.gpg`` signed with that
repository's lab key, ``cuda-keyring_1.1-1_all.deb`` carrying the key as
/usr/share/keyrings/cuda-archive-keyring.gpg, and stand-in packages with NVIDIA's names
(packages.yaml), with only the driver branches the real repository of that distribution
carries (debian13: no R580). As NVIDIA's, each repository has a key of its own; the lab's
are ed25519 keys whose bindings use SHA-512, which Debian 13's apt (sqv) accepts. The
driver's ``nvidia-smi`` prints recorded outputs of the boxes in ``boxes/`` (switch with
/etc/gpuserve-lab/box). There is no kernel module.

Nothing is rebuilt when the inputs (this directory and the lab key) are unchanged.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
import time
from email.utils import formatdate
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
DEFAULT_DISTRO = "debian12"
REPO_SUBDIR = f"cuda/repos/{DEFAULT_DISTRO}/x86_64"


def repo_subdir(distro: str = DEFAULT_DISTRO) -> str:
    """Where the repository of ``distro`` lies under the mirror (NVIDIA's path)."""
    return f"cuda/repos/{distro}/x86_64"


def nvidia_url(distro: str) -> str:
    return f"https://developer.download.nvidia.com/compute/{repo_subdir(distro)}/"


def distributions() -> dict[str, dict]:
    """packages.yaml's distributions: name -> {drivers: [branch ...]}."""
    return yaml.safe_load((HERE / "packages.yaml").read_text())["distributions"]

KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
KEY_UID = "gpuserve lab NVIDIA-layout repository <lab@gpuserve.invalid>"
STAMP = ".gpuserve-inputs"
EPOCH = 1767225600  # 2026-01-01: fixed mtimes inside the .debs
MAINTAINER = "gpuserve lab <lab@gpuserve.invalid>"


def _gnupg_home(distro: str = DEFAULT_DISTRO) -> Path:
    """The signing key's home: one key per repository, as NVIDIA's (debian12 keeps the
    home it always had)."""
    from lab.state import lab_home

    name = "gnupg" if distro == DEFAULT_DISTRO else f"gnupg-{distro}"
    home = lab_home() / "nvidia-repo" / name
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    return home


def _gpg(home: Path, *args: str, data: bytes | None = None) -> bytes:
    result = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback",
         "--passphrase", "", *args],
        input=data, capture_output=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(args)} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout


def lab_key(home: Path) -> tuple[str, bytes]:
    """(fingerprint, binary public key) of the lab signing key, created once."""
    listing = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    if "fpr:" not in listing:
        _gpg(home, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        listing = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    return fpr, _gpg(home, "--export", fpr)


def _inputs_digest(fingerprint: str) -> str:
    digest = hashlib.sha256(fingerprint.encode())
    for path in sorted(HERE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(HERE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


class _Deb:
    """One package: control fields, files (path -> (bytes, mode)), maintainer scripts."""

    def __init__(self, name: str, version: str, arch: str = "amd64", **fields: str) -> None:
        self.name, self.version, self.arch = name, version, arch
        self.fields = {k.replace("_", "-").title(): v for k, v in fields.items() if v}
        self.files: dict[str, tuple[bytes, int]] = {}
        self.scripts: dict[str, str] = {}
        self.conffiles: list[str] = []

    def add(self, path: str, data: bytes | str, mode: int = 0o644, conffile: bool = False):
        self.files[path] = (data.encode() if isinstance(data, str) else data, mode)
        if conffile:
            self.conffiles.append(path)
        return self

    def build(self, out_dir: Path, work: Path) -> Path:
        stage = work / f"{self.name}_{self.version}"
        (stage / "DEBIAN").mkdir(parents=True)
        size = 0
        for path, (data, mode) in self.files.items():
            target = stage / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.chmod(target, mode)
            size += len(data)
        control = {
            "Package": self.name,
            "Version": self.version,
            "Architecture": self.arch,
            "Maintainer": MAINTAINER,
            "Installed-Size": str(max(1, size // 1024)),
            "Section": "multiverse/devel" if self.name.startswith("cuda") else "non-free/libs",
            "Priority": "optional",
            **self.fields,
        }
        control.setdefault("Description", f"{self.name} (gpuserve lab stand-in)")
        text = "".join(f"{k}: {v}\n" for k, v in control.items())
        (stage / "DEBIAN" / "control").write_text(text)
        for script, body in self.scripts.items():
            path = stage / "DEBIAN" / script
            path.write_text("#!/bin/sh\nset -e\n" + body)
            os.chmod(path, 0o755)
        if self.conffiles:
            (stage / "DEBIAN" / "conffiles").write_text("".join(f"{c}\n" for c in self.conffiles))
        for path in stage.rglob("*"):
            os.utime(path, (EPOCH, EPOCH))
        deb = out_dir / f"{self.name}_{self.version}_{self.arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(stage), str(deb)],
            check=True, capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)},
        )
        self.control_text = text
        return deb


def _box_files(deb: _Deb) -> None:
    for path in sorted((HERE / "boxes").rglob("*")):
        if path.is_file():
            deb.add(f"/usr/share/gpuserve-lab/boxes/{path.relative_to(HERE / 'boxes')}",
                    path.read_bytes())


def fabric_manager_debs(files: Path, branch: str, version: str, v: str) -> list[_Deb]:
    """Fabric Manager and NSCQ at the driver's version, named as NVIDIA's repository
    names them: unbranched from R580, ``-<branch>`` up to R575 (shared reference
    hosts.md §1.2). The daemon is a stand-in (files/nv-fabricmanager)."""
    suffix = "" if int(branch) >= 580 else f"-{branch}"
    fm = (_Deb(f"nvidia-fabricmanager{suffix}", v,
               description="NVIDIA Fabric Manager (lab stand-in: checks the driver version "
               "and the box's NVSwitches, then idles)")
          .add("/usr/bin/nv-fabricmanager",
               (files / "nv-fabricmanager").read_text().replace("@DRIVER_VERSION@", version),
               0o755)
          .add("/usr/bin/nvidia-fabricmanager-start.sh",
               (files / "nvidia-fabricmanager-start.sh").read_text(), 0o755)
          .add("/lib/systemd/system/nvidia-fabricmanager.service",
               (files / "nvidia-fabricmanager.service").read_text())
          .add("/usr/share/nvidia/nvswitch/fabricmanager.cfg",
               "# gpuserve lab stand-in\nFABRIC_MODE=0\n", conffile=True))
    nscq = (_Deb(f"libnvidia-nscq{suffix}", v,
                 description="NVSwitch Configuration and Query library (lab stand-in)")
            .add(f"/usr/lib/x86_64-linux-gnu/libnvidia-nscq.so.{version}",
                 f"gpuserve lab stand-in of libnvidia-nscq {version}\n"))
    return [fm, nscq]


def packages(spec: dict, public_key: bytes, distro: str = DEFAULT_DISTRO) -> list[_Deb]:
    """Every package of ``distro``'s repository, built from packages.yaml and files/."""
    files = HERE / "files"
    debs: list[_Deb] = []
    keyring = _Deb("cuda-keyring", "1.1-1", "all",
                   description="GPG keyring for the CUDA repository (gpuserve lab key)")
    keyring.add(KEYRING, public_key)
    keyring.add(f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list",
                f"deb [signed-by={KEYRING}] {nvidia_url(distro)} /\n", conffile=True)
    debs.append(keyring)

    hardware = _Deb("gpuserve-lab-hardware", "1.2-1", "all",
                    description="gpuserve lab: recorded GPU boxes (the stand-in's 'hardware')")
    # the box is the lab's choice (`python -m lab up --box`, `python -m lab box`), which
    # may be made before this package arrives: written only where none is chosen yet
    hardware.add("/usr/share/gpuserve-lab/default-box", f"{spec['default_box']}\n")
    hardware.scripts["postinst"] = (
        "[ -e /etc/gpuserve-lab/box ] || { mkdir -p /etc/gpuserve-lab && "
        "cp /usr/share/gpuserve-lab/default-box /etc/gpuserve-lab/box; }\n")
    hardware.add("/usr/local/bin/systemd-detect-virt",
                 (files / "systemd-detect-virt").read_text(), 0o755)
    _box_files(hardware)
    debs.append(hardware)

    offered = {str(b) for b in spec["distributions"][distro]["drivers"]}
    for branch, version in spec["drivers"].items():
        if branch not in offered:
            continue
        v = f"{version}-1"
        smi = (files / "nvidia-smi").read_text().replace("@DRIVER_VERSION@", version)
        debs.append(
            _Deb("nvidia-persistenced", v, description="NVIDIA Persistence Daemon (lab stand-in)")
            .add("/usr/bin/nvidia-persistenced", (files / "nvidia-persistenced").read_text(), 0o755)
            .add("/lib/systemd/system/nvidia-persistenced.service",
                 (files / "nvidia-persistenced.service").read_text())
        )
        debs.append(
            _Deb("nvidia-driver", v, depends=f"nvidia-persistenced (= {v}), gpuserve-lab-hardware",
                 description="NVIDIA driver metapackage (lab stand-in: nvidia-smi only)")
            .add("/usr/bin/nvidia-smi", (files / "nvidia-smi-front").read_text()
                 .replace("@DRIVER_VERSION@", version), 0o755)
            .add("/usr/lib/gpuserve-lab/nvidia-smi", smi, 0o755)
        )
        # compute-only userspace (what a container host installs: its kernel module is
        # its host's); the stand-in's userspace is nvidia-driver's nvidia-smi
        debs.append(_Deb("nvidia-driver-cuda", v, depends=f"nvidia-driver (= {v})",
                         description="NVIDIA driver, compute-only userspace (lab stand-in)"))
        debs.append(
            _Deb("nvidia-kernel-open-dkms", v, provides="nvidia-kernel-dkms-any",
                 conflicts="nvidia-kernel-dkms", description="NVIDIA open kernel modules "
                 "(lab stand-in: no module)")
            .add(f"/usr/src/nvidia-{version}/README.gpuserve-lab", "open flavour stand-in\n")
        )
        debs.append(
            _Deb("nvidia-kernel-dkms", v, provides="nvidia-kernel-dkms-any",
                 conflicts="nvidia-kernel-open-dkms", description="NVIDIA proprietary kernel "
                 "modules (lab stand-in: no module)")
            .add(f"/usr/src/nvidia-{version}/README.gpuserve-lab", "proprietary flavour stand-in\n")
        )
        debs.append(_Deb("nvidia-open", v, description="NVIDIA driver, open kernel modules",
                         depends=f"nvidia-driver (= {v}), nvidia-kernel-open-dkms (= {v})"))
        debs.append(_Deb("cuda-drivers", v, description="NVIDIA driver, proprietary modules",
                         depends=f"nvidia-driver (= {v}), nvidia-kernel-dkms (= {v})"))
        debs.extend(fabric_manager_debs(files, branch, version, v))
        if branch in spec["versioned_meta_branches"]:
            debs.append(_Deb(f"nvidia-open-{branch}", v, depends=f"nvidia-open (= {v})"))
            debs.append(_Deb(f"cuda-drivers-{branch}", v, depends=f"cuda-drivers (= {v})"))
        if branch in spec["pinning_branches"]:
            pin = (
                "Package: nvidia-open cuda-drivers nvidia-driver nvidia-kernel-open-dkms "
                "nvidia-kernel-dkms nvidia-persistenced\n"
                f"Pin: version {branch}.*\nPin-Priority: 1000\n"
            )
            debs.append(
                _Deb(f"nvidia-driver-pinning-{branch}", v, "all",
                     description=f"Lock the NVIDIA driver to the {branch} branch")
                .add(f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}", pin, conffile=True)
            )

    nvcc = (files / "nvcc").read_text()
    for lane, info in spec["toolkits"].items():
        dash = lane.replace(".", "-")
        prefix = f"/usr/local/cuda-{lane}"
        version_json = (
            '{\n   "cuda" : {\n      "name" : "CUDA SDK",\n'
            f'      "version" : "{info["full"]}"\n   }}\n}}\n'
        )
        script = (nvcc.replace("@LANE@", lane).replace("@FULL@", info["full"])
                  .replace("@YEAR@", info["year"]).replace("@BUILT@", info["built"])
                  .replace("@BUILD@", info["build"]))
        deb = (
            _Deb(f"cuda-toolkit-{dash}", f"{info['full']}-1",
                 description=f"CUDA Toolkit {lane} (lab stand-in: nvcc --version only)")
            .add(f"{prefix}/bin/nvcc", script, 0o755)
            .add(f"{prefix}/version.json", version_json)
        )
        priority = int(lane.replace(".", "")) * 10
        deb.scripts["postinst"] = (
            f'if [ "$1" = configure ]; then update-alternatives --install /usr/local/cuda cuda '
            f"{prefix} {priority}; fi\n"
        )
        deb.scripts["prerm"] = (
            f'if [ "$1" = remove ]; then update-alternatives --remove cuda {prefix}; fi\n'
        )
        debs.append(deb)

    # NCCL as NVIDIA's repository ships it (libnccl2 / libnccl-dev, version
    # <nccl>-1+cuda<X.Y>): what roles/gpu_gates builds nccl-tests against before a
    # SGLang venv exists. Stand-ins: no code, the files where the real ones go.
    nccl = spec["nccl"]
    libdir = "/usr/lib/x86_64-linux-gnu"
    major, minor, patch = nccl["version"].split(".")
    v = f"{nccl['version']}-1+cuda{nccl['cuda']}"
    debs.append(
        _Deb("libnccl2", v, description="NVIDIA Collective Communication Library "
             "(lab stand-in: no code)")
        .add(f"{libdir}/libnccl.so.2", f"gpuserve lab stand-in of libnccl.so.{nccl['version']}\n")
    )
    debs.append(
        _Deb("libnccl-dev", v, depends=f"libnccl2 (= {v})",
             description="NVIDIA NCCL development files (lab stand-in)")
        .add("/usr/include/nccl.h", f"/* gpuserve lab stand-in */\n#define NCCL_MAJOR {major}\n"
             f"#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n")
        .add(f"{libdir}/libnccl.so", "gpuserve lab stand-in (libnccl.so -> libnccl.so.2)\n")
    )
    return debs


def _index_entry(deb: _Deb, path: Path) -> str:
    data = path.read_bytes()
    return (
        deb.control_text
        + f"Filename: ./{path.name}\nSize: {len(data)}\n"
        + f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
        + f"SHA1: {hashlib.sha1(data).hexdigest()}\n"
        + f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n"
    )


def _release(index_files: dict[str, bytes]) -> str:
    lines = [
        "Origin: gpuserve-lab",
        "Label: gpuserve lab NVIDIA-layout CUDA repository",
        "Architectures: amd64 all",
        f"Date: {formatdate(time.time() - 3600, usegmt=True)}",
    ]
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA1", hashlib.sha1),
                        ("SHA256", hashlib.sha256)):
        lines.append(f"{title}:")
        for name, data in index_files.items():
            lines.append(f" {algo(data).hexdigest()} {len(data):>16} {name}")
    return "\n".join(lines) + "\n"


def keyring_sha256(mirror_root: Path | str, distro: str = DEFAULT_DISTRO) -> str | None:
    """sha256 of the cuda-keyring package this lab publishes (None before publish).

    The lab's keyring carries the lab's own key, so NVIDIA's published digest cannot
    match it: inventory/lab.py passes this one as host data ``nvidia_keyring_sha256``,
    and the deploy checks the download against it as it would NVIDIA's."""
    path = Path(mirror_root) / repo_subdir(distro) / "cuda-keyring_1.1-1_all.deb"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def publish(mirror_root: Path) -> None:
    """Build (or keep) each distribution's repository under
    ``mirror_root/cuda/repos/<distro>/x86_64``."""
    for distro in distributions():
        repo = Path(mirror_root) / repo_subdir(distro)
        home = _gnupg_home(distro)
        try:
            _publish(repo, home, distro)
        finally:
            # gpg starts a gpg-agent per home directory that outlives us; stop ours.
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                           capture_output=True, check=False)


def _publish(repo: Path, home: Path, distro: str) -> None:
    fingerprint, public_key = lab_key(home)
    digest = _inputs_digest(fingerprint + distro)
    stamp = repo / STAMP
    if stamp.exists() and stamp.read_text().strip() == digest and (repo / "InRelease").exists():
        return
    spec = yaml.safe_load((HERE / "packages.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="gpuserve-nvidia-repo-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        entries = []
        for deb in packages(spec, public_key, distro):
            entries.append(_index_entry(deb, deb.build(out, Path(tmp) / "stage")))
        index = "".join(entries).encode()
        (out / "Packages").write_bytes(index)
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=EPOCH) as gz:
            gz.write(index)
        (out / "Packages.gz").write_bytes(buf.getvalue())
        release = _release({"Packages": index, "Packages.gz": buf.getvalue()})
        (out / "Release").write_text(release)
        (out / "InRelease").write_bytes(
            _gpg(home, "--local-user", fingerprint, "--clearsign", data=release.encode()))
        (out / "Release.gpg").write_bytes(
            _gpg(home, "--local-user", fingerprint, "--armor", "--detach-sign",
                 data=release.encode()))
        (out / STAMP).write_text(digest + "\n")
        if repo.exists():
            shutil.rmtree(repo)
        repo.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(out, repo)
