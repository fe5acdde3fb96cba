"""The five deploys (and the read-only ``tune_snapshot``, ``serve_launch`` and
``service_journal``) as ``@deploy``
functions, for ``deploy/*.py`` and for a pyinfra project's own deploy file (``pip install
gpuserve``; docs/deploys.md). Each reads the current host's ``host.data``, validates it
before any operation (an error names the inventory file and key) and adds its operations
under the roles' own names.

    from gpuserve.roles.deploys import serve_sglang
    serve_sglang()
"""

from gpuserve.roles.deploys.host import provision_gpu_host
from gpuserve.roles.deploys.hypervisor import proxmox_hypervisor
from gpuserve.roles.deploys.monitor import monitor_fleet
from gpuserve.roles.deploys.operate import serve_launch, service_journal
from gpuserve.roles.deploys.remove import remove_gpuserve
from gpuserve.roles.deploys.router import sglang_gateway
from gpuserve.roles.deploys.serve import serve_sglang
from gpuserve.roles.deploys.tune import tune_snapshot

__all__ = ["monitor_fleet", "provision_gpu_host", "proxmox_hypervisor", "remove_gpuserve",
           "serve_launch", "serve_sglang", "service_journal", "sglang_gateway",
           "tune_snapshot"]
