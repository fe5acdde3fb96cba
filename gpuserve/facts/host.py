"""pyinfra facts about the host's kernel, firmware and PCIe setup.

Usage: ``host.get_fact(KernelCmdline)``; on the CLI
``pyinfra inventory/gpu.py fact gpuserve.facts.host.IommuGroups``.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpuserve.facts.base import ParsedFact
from gpuserve.host import container
from gpuserve.parsers import (
    bootloader,
    cpuinfo,
    iommu,
    lspci,
    mokutil,
    proc_cmdline,
    proc_modules,
    systemd_detect_virt,
)
from gpuserve.paths import SCRIPTS_DIR

IOMMU_MARKER = "##gpuserve-iommu-groups##"
IOMMU_COMMAND = (
    f"echo '{IOMMU_MARKER}'; "
    "find /sys/kernel/iommu_groups -type l 2>/dev/null; true"
)
# Evidence lines for gpuserve.parsers.bootloader.parse_boot_evidence.
BOOT_EVIDENCE_COMMAND = (
    "if command -v proxmox-boot-tool >/dev/null 2>&1; then "
    "proxmox-boot-tool status 2>/dev/null | sed 's/^/pbt: /'; fi; "
    # a glob, not ls: one process fewer in every first batch
    "for f in /sys/firmware/efi/efivars/LoaderInfo-*; do "
    "[ -e \"$f\" ] && echo 'loaderinfo: yes'; break; done; "
    "if [ -e /boot/grub/grub.cfg ]; then echo 'grub_cfg: yes'; fi; "
    "if [ -d /sys/firmware/efi ]; then echo 'efi: yes'; fi; true"
)


class KernelCmdline(ParsedFact[proc_cmdline.Cmdline | None]):
    """The running kernel's command line: ``{"raw": str, "args": {key: value | None}}``."""

    def command(self) -> str:
        return "cat /proc/cmdline 2>/dev/null || true"

    def parse(self, output: list[str]) -> proc_cmdline.Cmdline | None:
        return proc_cmdline.parse_cmdline(output)


class Virtualization(ParsedFact[str | None]):
    """``systemd-detect-virt``: "kvm", "microsoft", ..., "none" on bare metal; None if
    the tool is missing. It exits 1 for "none", hence the ``|| true``."""

    def requires_command(self) -> str:
        return "systemd-detect-virt"

    def command(self) -> str:
        return "systemd-detect-virt 2>/dev/null || true"

    def parse(self, output: list[str]) -> str | None:
        return systemd_detect_virt.parse_detect_virt(output)


class Container(ParsedFact[str | None]):
    """``systemd-detect-virt --container``: "lxc", "systemd-nspawn", ...; None outside a
    container (it prints "none" and exits 1) or without the tool."""

    def command(self) -> str:
        return "systemd-detect-virt --container 2>/dev/null || true"

    def parse(self, output: list[str]) -> str | None:
        return container.parse_container(output)


class NvidiaModuleVersion(ParsedFact[str | None]):
    """The loaded NVIDIA kernel module's version, as a container sees its host's:
    /proc/driver/nvidia/version, else nvidia-smi's driver_version; None when neither."""

    def command(self) -> str:
        return ("cat /proc/driver/nvidia/version 2>/dev/null || "
                "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null "
                "| head -n 1 || true")

    def parse(self, output: list[str]) -> str | None:
        return container.parse_module_version(output)


class CpuVendor(ParsedFact[str | None]):
    """"intel", "amd" (or the raw vendor_id); None where /proc/cpuinfo has none (arm64)."""

    def command(self) -> str:
        return "grep -m1 '^vendor_id' /proc/cpuinfo 2>/dev/null || true"

    def parse(self, output: list[str]) -> str | None:
        return cpuinfo.parse_cpu_vendor(output)


class IommuGroups(ParsedFact[list[iommu.IommuGroup] | None]):
    """``[{"group": n, "devices": ["0000:01:00.0", ...]}]``; empty when no IOMMU is active."""

    def command(self) -> str:
        return IOMMU_COMMAND

    def parse(self, output: list[str]) -> list[iommu.IommuGroup] | None:
        if not output or output[0].strip() != IOMMU_MARKER:
            raise ValueError(f"missing {IOMMU_MARKER} line")
        return iommu.parse_iommu_groups(output[1:])


class AcsBridges(ParsedFact[list[lspci.AcsBridge] | None]):
    """PCI bridges from ``lspci -vvv`` with ACS capability and ACSCtl flags.

    lspci needs root to read extended capabilities: call with ``_sudo=True``; without
    it each bridge's ``acs`` is None (unknown). None when lspci is missing.
    """

    def requires_command(self) -> str:
        return "lspci"

    def command(self) -> str:
        return "lspci -vvv 2>/dev/null || true"

    def parse(self, output: list[str]) -> list[lspci.AcsBridge] | None:
        return lspci.parse_lspci_acs(output)


class BootLoader(ParsedFact[bootloader.BootLoaderName | None]):
    """"grub" or "systemd-boot" (proxmox-boot-tool, LoaderInfo EFI variable, grub.cfg);
    None without evidence (e.g. direct kernel boot)."""

    def command(self) -> str:
        return BOOT_EVIDENCE_COMMAND

    def parse(self, output: list[str]) -> bootloader.BootLoaderName | None:
        return bootloader.parse_boot_evidence(output)


class SecureBoot(ParsedFact[bool | None]):
    """True/False from ``mokutil --sb-state`` (False on a legacy-BIOS boot); None
    without mokutil."""

    def requires_command(self) -> str:
        return "mokutil"

    def command(self) -> str:
        return "mokutil --sb-state 2>&1 || true"

    def parse(self, output: list[str]) -> bool | None:
        return mokutil.parse_sb_state(output)


class NouveauLoaded(FactBase[bool | None]):
    """Whether the nouveau module is loaded (/proc/modules); it blocks the NVIDIA driver."""

    def command(self) -> str:
        return "cat /proc/modules 2>/dev/null || true"

    def process(self, output: list[str]) -> bool | None:
        try:
            return "nouveau" in proc_modules.parse_proc_modules(output)
        except ValueError:
            return None


def install_target_command(path: str) -> str:
    """python3's version, glibc's, and the free bytes of the filesystem that holds
    ``path`` (its nearest existing parent: the directory may not exist yet)."""
    # shell builtins where a tool would only cut a field: every process costs tens of ms
    # on a slow host, and this read is in every deploy's first batch
    return (
        # -V, not -c: no site import, a tenth of the start-up on a slow host
        "v=$(python3 -V 2>&1); v=${v#Python }; case \"$v\" in "
        "[0-9]*.[0-9]*.[0-9]*) v=${v%%[!0-9.]*} ;; *) v= ;; esac; echo \"python=$v\"; "
        "set -- $(getconf GNU_LIBC_VERSION 2>/dev/null); echo \"glibc=$2\"; "
        # parameter expansion, not dirname: the loop must end whatever the PATH holds
        f"d={shlex.quote(path)}; while [ -n \"$d\" ] && [ ! -d \"$d\" ]; do d=${{d%/*}}; "
        "done; [ -n \"$d\" ] || d=/; "
        "df -P -B1 \"$d\" 2>/dev/null | { read -r _; read -r _ _ _ f _; echo \"free=$f\"; }"
    )


class InstallTarget(FactBase[dict[str, Any]]):
    """``{"python": "3.11.2", "glibc": "2.36", "free_bytes": N}`` (None where unknown):
    what the serve deploy's preflight checks a lock against before anything changes."""

    @staticmethod
    def default() -> dict[str, Any]:
        return {"python": None, "glibc": None, "free_bytes": None}

    def command(self, path: str) -> str:
        return install_target_command(path)

    def process(self, output: list[str]) -> dict[str, Any]:
        values = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
        free = values.get("free", "")
        return {"python": values.get("python") or None, "glibc": values.get("glibc") or None,
                "free_bytes": int(free) if free.isdigit() else None}


#: Root-only (0700) directory on the host where checkpoint_scan.py keeps clean scans.
CHECKPOINT_SCAN_CACHE = "/var/cache/gpuserve/checkpoint-scan"


#: The files checkpoint_scan.py reads besides the ``*.safetensors`` (its ``_READ_JSON``).
CHECKPOINT_JSON_FILES = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")


class ModelCheckpoint(FactBase[str]):
    """``checkpoint_scan.py --dir PATH`` on the host: the checkpoint's config and
    safetensors headers (never the weights) as JSON text, for the memory preflight
    (gpuserve.memory.checkpoint.parse_scan). The script travels in the command (a
    heredoc), so it runs at prepare time, before anything is uploaded. A clean scan is
    kept in :data:`CHECKPOINT_SCAN_CACHE` keyed by the files' stat and the script's hash,
    so a rerun reads no header again unless a file or the script changed.

    A rerun does not even start Python (most of this read's time on a slow host): the
    shell takes one ``stat`` of every file the scan reads (name, size, mtime, ctime,
    inode, device) with the script's hash, and when that equals the stamp kept beside
    the last clean scan's output, prints that output. Otherwise the script runs and,
    after a clean scan, keeps its output with the stamp taken *before* it ran (a file
    that changes meanwhile only makes the next rerun scan again)."""

    def command(self, path: str) -> str:
        script = (SCRIPTS_DIR / "checkpoint_scan.py").read_text(encoding="utf-8")
        marker = "GPUSERVE_CHECKPOINT_SCAN_EOF"
        assert marker not in script
        salt = hashlib.sha256(script.encode()).hexdigest()[:16]
        q = shlex.quote
        base = f"{CHECKPOINT_SCAN_CACHE}/{hashlib.sha256(path.encode()).hexdigest()[:32]}"
        # -L: the scan follows links (os.stat), so must the stamp; .*: the scan lists
        # hidden shards too
        files = (" ".join(q(n) for n in CHECKPOINT_JSON_FILES)
                 + " *.safetensors .*.safetensors")
        return (f"_st=$(echo {salt}; cd -- {q(path)} 2>/dev/null && pwd -P && "
                f"stat -L -c '%n %s %.9Y %.9Z %i %d' -- {files} 2>/dev/null); "
                f"if [ -f {base}.out ] && [ \"$_st\" = \"$(cat {base}.stamp 2>/dev/null)\" ]; "
                f"then cat {base}.out; else "
                f"(umask 077 && mkdir -p {CHECKPOINT_SCAN_CACHE} && printf '%s\\n' \"$_st\" "
                f"> {base}.stamp.$$) 2>/dev/null; "
                f"python3 - --dir {q(path)} --cache {CHECKPOINT_SCAN_CACHE} --salt {salt} "
                f"--stamp {base} --stamp-taken {base}.stamp.$$ <<'{marker}'\n{script}\n"
                f"{marker}\nfi")

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


class WeightsState(FactBase[str]):
    """``weights_fetch.py state``: whether a Hub revision's directory is complete (its
    marker, every listed file at its size), the free bytes at the models directory, the
    bytes already staged and the commit a floating revision was recorded as (JSON text
    for gpuserve.serve.weights). Stdlib only, run with the host's python3 from a heredoc,
    so it reads before anything is uploaded: a rerun with the revision present makes no
    Hub call at all."""

    def command(self, target: str, ref: str = "", models_dir: str = "") -> str:
        script = (SCRIPTS_DIR / "weights_fetch.py").read_text(encoding="utf-8")
        marker = "GPUSERVE_WEIGHTS_STATE_EOF"
        assert marker not in script
        q = shlex.quote
        extra = (f" --ref {q(ref)}" if ref else "") + (
            f" --models-dir {q(models_dir)}" if models_dir else "")
        return f"python3 - state --target {q(target)}{extra} <<'{marker}'\n{script}\n{marker}"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


class WeightsFetchStatus(FactBase[str]):
    """``weights_fetch.py status``: the background download's last status line."""

    def command(self, script: str, run_dir: str) -> str:
        return f"python3 {shlex.quote(script)} status --run-dir {shlex.quote(run_dir)}"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def interpreter_command(pythons: str, explicit: str) -> str:
    """Sections the interpreter choice reads (gpuserve.launch.interpreter): os-release,
    the machine, python3's version, ``apt-cache policy python3.X`` of the lock
    Pythons ``pythons`` ("3.11 3.12") only when python3 is none of them (a rerun on a
    matching host starts no apt), and the version of the ``explicit`` interpreter."""
    q = shlex.quote
    wanted = " ".join(p for p in pythons.split() if p.replace(".", "").isdigit())
    packages = " ".join(f"python{p}" for p in wanted.split())
    text = ("echo '--os-release'; cat /etc/os-release 2>/dev/null; "
            "echo '--arch'; uname -m; "
            "v=$(python3 -V 2>&1); v=${v#Python }; echo '--python3'; echo \"$v\"; "
            f"m=${{v%.*}}; case \" {wanted} \" in *\" $m \"*) ;; *) echo '--apt'; "
            f"apt-cache policy {packages} 2>/dev/null ;; esac; ")
    if explicit:
        text += f"echo '--explicit'; {q(explicit)} -V 2>&1 || true; "
    return text + "true"


class SglangInterpreter(FactBase[dict[str, list[str]]]):
    """The host's answers the SGLang interpreter choice reads, by section
    (:func:`interpreter_command`); gpuserve.launch.interpreter.facts_from reads them."""

    @staticmethod
    def default() -> dict[str, list[str]]:
        return {}

    def command(self, pythons: str, explicit: str = "") -> str:
        return interpreter_command(pythons, explicit)

    def process(self, output: list[str]) -> dict[str, list[str]]:
        sections: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in output:
            if line.startswith("--") and line[2:] in ("os-release", "arch", "python3", "apt",
                                                       "explicit"):
                current = sections.setdefault(line[2:], [])
            elif current is not None:
                current.append(line)
        return sections
