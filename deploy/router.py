"""Put the SGLang hosts of an inventory group behind SGLang's gateway (smg).

    pyinfra -y inventory/gpu.py deploy/router.py --dry
    pyinfra -y inventory/gpu.py deploy/router.py

Acts on the hosts whose data sets ``router_workers_group`` (the router hosts); every
other host of the inventory is left alone. Host data keys and defaults:
``gpuserve/fleet/router_plan.DEFAULTS``. Workers are served by deploy/serve.py; this
deploy does not touch them. Its order of steps: docs/deploys.md (the deploy is
``gpuserve.roles.deploys.sglang_gateway``).
"""

from gpuserve.roles.deploys import sglang_gateway

sglang_gateway()
