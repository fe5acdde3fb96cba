"""Verify a freshly installed SGLang venv from the inside: what really imports.

Uploaded by roles/sglang and run as the service user with the venv's own python, after
``uv pip install --require-hashes`` and ``uv pip check`` and before the venv is put behind
the unit. Neither checks anything about the GPU (sglang-install.md §4.8), so this imports torch
and sglang the way the server will and reports what they say. Stdlib apart from the two
imports under test; prints exactly one JSON line and always exits 0: the controller
judges it against the lock (gpuserve/launch/verify.py).
"""

import importlib.metadata
import json
import sys
import warnings


def main() -> None:
    out = {"python": ".".join(str(n) for n in sys.version_info[:3]), "error": None}
    try:
        out["sglang"] = importlib.metadata.version("sglang")
        out["torch_dist"] = importlib.metadata.version("torch")
        import torch  # noqa: PLC0415 - the import under test

        out["torch"] = str(torch.__version__)
        out["torch_cuda"] = torch.version.cuda
        with warnings.catch_warnings(record=True) as caught:  # why CUDA is unavailable
            warnings.simplefilter("always")
            available = bool(torch.cuda.is_available())
        out["cuda_available"] = available
        out["cuda_warning"] = " ".join(str(w.message) for w in caught)[:600] or None
        devices = []
        if available:
            for i in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(i)
                devices.append({"name": torch.cuda.get_device_name(i),
                                "capability": f"{major}.{minor}"})
        out["devices"] = devices
        import sglang  # noqa: F401, PLC0415 - the server's own package must import
    except Exception as exc:  # report, never crash: the controller decides
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
