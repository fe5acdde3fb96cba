"""torch.cuda of the torch STAND-IN (gpuserve lab): device queries only.

Same names and return types as torch.cuda for what a deploy checks:
``is_available()``, ``device_count()``, ``get_device_capability(device)``,
``get_device_name(device)``, ``get_arch_list()``, ``current_device()``,
``is_initialized()``. The devices come from the lab box (torch/_standin/__init__.py).
"""

from __future__ import annotations

import warnings

from torch._standin import Probe, probe
from torch._standin.build import ARCH_LIST

__all__ = ["current_device", "device_count", "get_arch_list", "get_device_capability",
           "get_device_name", "is_available", "is_initialized"]

_probe: Probe | None = None
_warned = False


def _state() -> Probe:
    global _probe
    if _probe is None:
        _probe = probe()
    return _probe


def is_available() -> bool:
    """True when a driver new enough for this build's CUDA shows at least one GPU."""
    global _warned
    state = _state()
    if state.warning and not _warned:
        _warned = True
        warnings.warn(state.warning, UserWarning, stacklevel=2)
    return state.error is None and len(state.devices) > 0


def is_initialized() -> bool:
    return _probe is not None and _probe.error is None


def device_count() -> int:
    state = _state()
    return 0 if state.error else len(state.devices)


def _lazy_init():
    state = _state()
    if state.error:
        raise RuntimeError(state.error)
    if not state.devices:
        raise RuntimeError("No CUDA GPUs are available")
    return state


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        if kind != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        return int(idx or 0)
    if isinstance(device, int):
        return device
    raise ValueError(f"Expected a cuda device, but got: {device!r}")


def _device(device):
    state = _lazy_init()
    i = _index(device)
    if i < 0 or i >= len(state.devices):
        raise AssertionError("Invalid device id")
    return state.devices[i]


def current_device() -> int:
    _lazy_init()
    return 0


def get_device_capability(device=None) -> tuple[int, int]:
    """``(major, minor)``, e.g. ``(12, 0)`` for an RTX PRO 6000, ``(9, 0)`` for an H200."""
    return _device(device).capability


def get_device_name(device=None) -> str:
    return _device(device).name


def get_arch_list() -> list[str]:
    """The architectures this build carries kernels for (``[]`` without CUDA)."""
    if not is_available():
        return []
    return list(ARCH_LIST)
