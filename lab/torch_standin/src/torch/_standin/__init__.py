"""What the torch STAND-IN knows about the host: the lab box's GPUs, through nvidia-smi.

A real CUDA build of torch asks the driver (libcuda) for its devices and refuses CUDA
when the driver is older than the CUDA it was built for. The lab guest has no driver,
only the stand-in ``nvidia-smi`` printing the recorded box (/etc/gpuserve-lab/box), so
this module asks it instead:

- ``nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader``
  gives the devices and the driver version;
- no ``nvidia-smi``, a failing one or no GPU: no CUDA (like a host without a driver);
- a driver older than ``DRIVER_MIN`` (the build's CUDA minimum, torch/_standin/build.py):
  no CUDA, with the real torch's "driver too old" warning;
- a GPU whose NVLink fabric registration is not done (``fabric.state`` "In Progress" or
  "Not Started": an NVSwitch box without Fabric Manager at the driver's version): no
  CUDA, with error 802 as the real torch words it (cudaErrorSystemNotReady);
- the fault switch ``NO_CUDA_FILE`` exists: no CUDA, with the real torch's "CUDA unknown
  error" warning. It is a file, not an environment variable, so it reaches processes
  started under runuser/systemd as another user.

``CUDA_VISIBLE_DEVICES`` (comma-separated indexes) filters the devices as CUDA does.
The probe runs once per process, like torch's lazy CUDA initialisation.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from torch._standin.build import DRIVER_MIN

NVIDIA_SMI = "nvidia-smi"
NO_CUDA_FILE = "/etc/gpuserve-lab/torch-no-cuda"
QUERY = ["--query-gpu=name,compute_cap,driver_version,fabric.state", "--format=csv,noheader"]
FABRIC_PENDING = ("In Progress", "Not Started")

# Real torch wording (torch/cuda/__init__.py, c10/cuda/CUDAFunctions.cpp).
TOO_OLD = ("CUDA initialization: The NVIDIA driver on your system is too old (found version "
           "{found}). Please update your GPU driver by downloading and installing a new "
           "version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, "
           "go to: https://pytorch.org to install a PyTorch version that has been compiled "
           "with your version of the CUDA driver.")
UNKNOWN_ERROR = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly "
                 "set up environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after "
                 "program start. Setting the available devices to be zero.")
# torch's wording for cudaGetDeviceCount() failing with 802 (c10/cuda/CUDAFunctions.cpp;
# pytorch/pytorch#35710, microsoft/lisa#2823)
NOT_READY = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run "
             "some cuda functions before calling NumCudaDevices() that might have already set "
             "an error? Error 802: system not yet initialized")
NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
             "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx")


@dataclass(frozen=True)
class Device:
    name: str
    capability: tuple[int, int]


@dataclass(frozen=True)
class Probe:
    devices: tuple[Device, ...]
    error: str | None  # why there is no CUDA (None: CUDA works)
    warning: str | None  # what torch warns when is_available() finds no CUDA


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.strip().split("."))


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def _visible(devices: list[Device]) -> list[Device]:
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return devices
    picked = []
    for item in spec.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= len(devices):
            break  # CUDA stops at the first invalid entry
        picked.append(devices[int(item)])
    return picked


def probe() -> Probe:
    if os.path.exists(NO_CUDA_FILE):
        return Probe((), "CUDA unknown error (lab fault switch " + NO_CUDA_FILE + ")",
                     UNKNOWN_ERROR)
    try:
        out = subprocess.run([NVIDIA_SMI, *QUERY], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return Probe((), NO_DRIVER, None)
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]
    if out.returncode != 0 or not rows or any(len(r) not in (3, 4) for r in rows):
        return Probe((), NO_DRIVER, None)
    driver = rows[0][2]
    if any(r[3:] and r[3] in FABRIC_PENDING for r in rows):
        return Probe((), NOT_READY.replace("CUDA initialization: ", ""), NOT_READY)
    try:
        too_old = _version_tuple(driver) < _version_tuple(DRIVER_MIN)
        devices = [Device(r[0], _capability(r[1])) for r in rows]
    except ValueError:
        return Probe((), NO_DRIVER, None)
    if too_old:
        found = f"{driver}; this build needs >= {DRIVER_MIN}"
        return Probe((), TOO_OLD.format(found=found).replace("CUDA initialization: ", ""),
                     TOO_OLD.format(found=found))
    return Probe(tuple(_visible(devices)), None, None)
