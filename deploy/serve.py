"""Serve a launch profile with SGLang on every host of the inventory, and prove it.

    pyinfra -y inventory/gpu.py deploy/serve.py --dry
    pyinfra -y inventory/gpu.py deploy/serve.py --data profile=glm5-nvfp4-tp8

Bad input stops the run before any operation; a failing health gate rolls back to the
last good configuration and still fails the host. Host data: ``profile`` (required) and
the keys of ``gpuserve.roles.sglang.DEFAULTS``, ``gpuserve.roles.service.DEFAULTS`` and
``gpuserve.roles.checks.DEFAULTS``. What runs, in order, and how rollback, reruns and
secrets work: docs/deploys.md, "What the serve deploy does" (the deploy is
``gpuserve.roles.deploys.serve_sglang``).
"""

from gpuserve.roles.deploys import serve_sglang

serve_sglang()
