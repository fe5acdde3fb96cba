"""Serve a launch profile with SGLang on every host of the inventory, and prove it.

    pyinfra -y inventory/gpu.py deploy/serve.py --dry
    pyinfra -y inventory/gpu.py deploy/serve.py --data profile=glm5-nvfp4-tp8

Bad input (profile, host data) stops the run naming file and field, and an unfit host
naming host, lock and fix, before any operation. A passing run prints
``<host>: smoke: N tokens in T s = X tok/s``; a rerun against a healthy, unchanged host
says "No changes" while still checking ``/health`` and a real completion. ``--data
profile=NAME`` (a name in ``profiles/`` or a path) switches profiles; a failing health
gate rolls back to the last good configuration and still fails the host.

Host data keys and defaults: ``gpuserve.roles.sglang.DEFAULTS``,
``gpuserve.roles.service.DEFAULTS``, ``gpuserve.roles.checks.DEFAULTS``, plus ``profile``
(required). What runs, in order, and how rollback, reruns and secrets work:
docs/deploys.md (the deploy is ``gpuserve.roles.deploys.serve_sglang``).
"""

from gpuserve.roles.deploys import serve_sglang

serve_sglang()
