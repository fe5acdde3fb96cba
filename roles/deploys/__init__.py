"""The five deploys (and the read-only ``tune_snapshot``, ``serve_launch`` and
``service_journal``) as ``@deploy``
functions, for ``deploy/*.py`` and for a pyinfra project's own deploy file (``pip install
gpuserve``; docs/deploys.md). Each reads the current host's ``host.data``, validates it
before any operation (an error names the inventory file and key) and adds its operations
under the roles' own names.

    from gpuserve.roles.deploys import serve_sglang
    serve_sglang()
"""

import importlib

#: Each deploy by the module that defines it, imported when the deploy is first asked
#: for: a pyinfra run of one deploy file imports that deploy's roles, not all nine.
_MODULES = {"monitor_fleet": "monitor", "provision_gpu_host": "host",
            "proxmox_hypervisor": "hypervisor", "remove_gpuserve": "remove",
            "serve_launch": "operate", "serve_sglang": "serve", "service_journal": "operate",
            "sglang_gateway": "router", "tune_snapshot": "tune"}

__all__ = sorted(_MODULES)


def __getattr__(name: str):
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
