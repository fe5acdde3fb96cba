"""NVSwitch hosts (HGX/DGX): whether a host needs NVIDIA Fabric Manager, which packages at
which version, and whether its GPUs' fabric registration is done.

On an NVSwitch board CUDA refuses to start (error 802, "system not yet initialized")
until Fabric Manager, at exactly the loaded driver's version, has registered every GPU
with the fabric; ``nvidia-smi`` looks healthy meanwhile. PCIe cards and NVLink-bridge
pairs have no NVSwitch, and Fabric Manager fails there (``NV_WARN_NOTHING_TO_DO``), so
the decision is made from hardware evidence, never from a model name. Data:
``gpuserve/data/host/fabricmanager.yaml``; the why: docs/nvswitch.md.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

MODES = ("auto", "on", "off")
_NVLINK = re.compile(r"^NV\d+$")
#: host data keys (roles/fabric_manager DEFAULTS)
MODE_KEY, TIMEOUT_KEY = "fabric_manager", "fabric_wait_timeout"


@cache
def fm_data() -> dict[str, Any]:
    return safeload.load_yaml_file(DATA_DIR / "host" / "fabricmanager.yaml")


@dataclass(frozen=True)
class FabricSettings:
    """Host data: ``fabric_manager`` (auto: from the evidence; on; off) and the bound of
    the wait for fabric registration, in seconds."""

    mode: str = "auto"
    wait_timeout: int = 180


def fabric_settings(data: Mapping[str, Any], source: str) -> FabricSettings:
    mode = data.get(MODE_KEY, "auto")
    if mode is True or mode is False:
        mode = "on" if mode else "off"
    if mode not in MODES:
        raise InputError(source, MODE_KEY, f"must be one of {', '.join(MODES)}, got {mode!r}")
    timeout = data.get(TIMEOUT_KEY, 180)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 10 <= timeout <= 3600:
        raise InputError(source, TIMEOUT_KEY, f"must be seconds from 10 to 3600, got {timeout!r}")
    return FabricSettings(mode, timeout)


@dataclass(frozen=True)
class Evidence:
    """Whether the host has NVSwitches, and every fact that said so (or said nothing)."""

    nvswitch: bool
    reasons: tuple[str, ...]


def _topology_reason(links: Sequence[Sequence[str]] | None) -> tuple[bool, str | None]:
    if not links:
        return False, None
    n = len(links)
    cells = [str(c).strip() for i, row in enumerate(links) for j, c in enumerate(row)
             if i != j and j < n]
    nv = [c for c in cells if _NVLINK.match(c)]
    if not nv:
        return False, None
    if len(nv) == len(cells) and n > int(fm_data()["direct_nvlink_max_gpus"]):
        return True, f"nvidia-smi topo -m: all {n} GPUs joined pairwise by {nv[0]}"
    which = "all" if len(nv) == len(cells) else "some"
    return False, (f"nvidia-smi topo -m: NVLink ({nv[0]}) between {which} of {n} GPUs "
                   "without a switch (bridge pairs or a direct board)")


def detect(links: Sequence[Sequence[str]] | None = None,
           fabric: Iterable[Mapping[str, Any]] | None = None,
           pci: Iterable[Any] | None = None,
           proc_devices: Sequence[str] | None = None) -> Evidence:
    """NVSwitch evidence from: the ``topo -m`` GPU matrix (``links``), each GPU's fabric
    state (``nvidia-smi -q`` Fabric blocks or ``--query-gpu=fabric.state``), the host's
    NVIDIA PCI functions (``pci``: objects with ``pci_class`` and ``address``,
    gpuserve.host.passthrough) and the entries of
    /proc/driver/nvidia-nvswitch/devices. Any one suffices; none: no Fabric Manager."""
    reasons: list[str] = []
    found = False
    switches = [f for f in pci or () if str(getattr(f, "pci_class", ""))[:4]
                == fm_data()["nvswitch_pci_class"]]
    if switches:
        found = True
        reasons.append(f"{len(switches)} NVSwitch PCI device(s) "
                       f"({', '.join(getattr(s, 'address', '?') for s in switches[:4])})")
    if proc_devices:
        found = True
        reasons.append(f"/proc/driver/nvidia-nvswitch/devices lists {len(proc_devices)}")
    states = [str(b.get("state") or "N/A") for b in fabric or ()]
    managed = [s for s in states
               if s in (*fm_data()["pending_states"], fm_data()["done_state"])]
    if managed:
        found = True
        reasons.append(f"nvidia-smi: fabric state {managed[0]} on {len(managed)} GPU(s)")
    by_topology, why = _topology_reason(links)
    found = found or by_topology
    if why:
        reasons.append(why)
    return Evidence(found, tuple(reasons))


def needed(settings: FabricSettings, evidence: Evidence) -> bool:
    return settings.mode == "on" or (settings.mode == "auto" and evidence.nvswitch)


def nvlink5(compute_caps: Iterable[str | None]) -> bool:
    """NVLink 5 (B200/B300): NVLSM and NVSDM join Fabric Manager (hosts.md §1.7)."""
    low = int(fm_data()["nvlink5_min_compute_major"])
    majors = [int(c.split(".")[0]) for c in compute_caps if c and re.fullmatch(r"\d+\.\d+", c)]
    return bool(majors) and min(majors) >= low


@dataclass(frozen=True)
class FabricPlan:
    """The packages installed and held with the driver on an NVSwitch host."""

    branch: int
    versioned: tuple[str, ...]  # at exactly the driver's version
    unversioned: tuple[str, ...]  # NVLSM and its tools: versioned on their own

    @property
    def service(self) -> str:
        return str(fm_data()["service"])

    def specs(self, deb_version: str) -> list[str]:
        """``name=<version>`` for every driver-versioned package: the same upstream
        version as the driver; the Debian revision left to a glob (NVIDIA's ``-1``,
        Ubuntu's ``-0ubuntu0...``: hosts.md §1.2) unless ``deb_version`` has one."""
        upstream, _, revision = deb_version.partition("-")
        version = f"{upstream}-{revision}" if revision else f"{upstream}-*"
        return [f"{p}={version}" for p in self.versioned] + list(self.unversioned)

    @property
    def held(self) -> tuple[str, ...]:
        return self.versioned


def fabric_plan(branch: int, nvl5: bool = False) -> FabricPlan:
    """Names by branch: from R580 ``nvidia-fabricmanager`` and ``libnvidia-nscq``;
    up to R575 ``nvidia-fabricmanager-<branch>``, ``libnvidia-nscq-<branch>``."""
    data = fm_data()
    names = list(data["packages"]) + (list(data["nvlink5_versioned"]) if nvl5 else [])
    if branch < int(data["unbranched_since"]):
        names = [f"{n}-{branch}" for n in names]
    return FabricPlan(branch, tuple(names),
                      tuple(data["nvlink5_unversioned"]) if nvl5 else ())


class FabricState(StrEnum):
    """The fabric's registration on a host (a StrEnum: prints as its word)."""

    READY = "ready"  # every GPU registered, or without a fabric state
    PENDING = "pending"  # keep waiting
    FAILED = "failed"  # registration done with an error: waiting will not help


@dataclass(frozen=True)
class FabricVerdict:
    """The fabric's :class:`FabricState` and what it rests on."""

    state: FabricState
    detail: str


def judge(blocks: Iterable[Mapping[str, Any]]) -> FabricVerdict:
    """The fabric verdict of a host's ``nvidia-smi -q`` Fabric blocks."""
    data = fm_data()
    pending, failed, done = [], [], 0
    for i, block in enumerate(blocks):
        where = block.get("bus_id") or f"GPU #{i}"
        state, status = block.get("state") or "N/A", block.get("status") or "N/A"
        if state in data["pending_states"]:
            pending.append(f"{where}: State {state}")
        elif state == data["done_state"]:
            if status != data["ok_status"]:
                failed.append(f"{where}: State {state}, Status {status}")
            else:
                done += 1
    if failed:
        return FabricVerdict(FabricState.FAILED, "; ".join(failed))
    if pending:
        return FabricVerdict(FabricState.PENDING, "; ".join(pending))
    return FabricVerdict(FabricState.READY, f"{done} GPU(s) registered with the fabric")


_APT = ("DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confold "
        "--no-install-recommends --allow-change-held-packages")


def transaction(specs: Sequence[str], held: Sequence[str]) -> str:
    """One apt transaction for the driver and Fabric Manager together (``specs``:
    ``name`` or ``name=version``), then both held, so that no later ``apt upgrade``
    moves one without the other (hosts.md §1.3: the usual way hosts reach a mismatch).
    Held packages may change here: this transaction is the one that moves them."""
    quoted = " ".join(shlex.quote(s) for s in specs)
    return f"{_APT} {quoted} && apt-mark hold {' '.join(shlex.quote(h) for h in held)}"


def meta_transaction(metas: Sequence[str], extra: Sequence[str], plan: FabricPlan | None,
                     *, branch: int | None = None, remove: Sequence[str] = ()) -> str:
    """The driver's meta-packages (which resolve the driver's version through the
    branch pin) with Fabric Manager (``plan``) at the version apt's candidate of the
    last meta has, in the same transaction, both held: the version is read on the host,
    after the pin package and ``apt-get update``, so it is what apt is about to install.

    A branch change (``branch``, the packages of the old branch to ``remove`` first:
    its pin and versioned meta, which move no driver) checks that the candidate is of
    ``branch`` before anything is installed, so a pin apt did not take stops the move
    instead of installing another driver."""
    meta = shlex.quote(metas[-1])
    fm_versioned = plan.versioned if plan else ()
    specs = " ".join([*(shlex.quote(s) for s in (*metas, *extra)),
                      *(f"{shlex.quote(p)}=\"$v\"" for p in fm_versioned),
                      *(shlex.quote(p) for p in (plan.unversioned if plan else ()))])
    held = " ".join(shlex.quote(h) for h in (*metas, *(plan.held if plan else ())))
    first = ("DEBIAN_FRONTEND=noninteractive apt-get remove -y --allow-change-held-packages "
             f"{' '.join(shlex.quote(p) for p in remove)} || exit 1; " if remove else "")
    other = (f"{branch}.*) ;; *) echo \"apt's candidate of {metas[-1]} is $v, not branch "
             f"{branch}\" >&2; exit 1;; " if branch else "")
    hold = f" && apt-mark hold {held}" if plan else ""
    return (f"{first}v=$(apt-cache policy {meta} | sed -n 's/^ *Candidate: *//p'); "
            f"case \"$v\" in ''|'(none)') echo \"no candidate version of {metas[-1]}\" >&2; "
            f"exit 1;; {other}esac; {_APT} {specs}{hold}")
