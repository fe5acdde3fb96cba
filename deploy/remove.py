"""Remove what the serve and gateway deploys installed, on every host of the inventory.

    pyinfra -y inventory/gpu.py deploy/remove.py --dry
    pyinfra -y inventory/gpu.py deploy/remove.py
    pyinfra -y inventory/gpu.py deploy/remove.py --data remove_weights=true
    pyinfra -y inventory/gpu.py deploy/remove.py --data remove_caches=true

Stops and disables the SGLang and gateway units, then deletes their unit files, env
files, configs and secrets, venvs, locks, host scripts and the last good copies. Keeps
the records, the weights (unless ``remove_weights=true``) and the JIT caches (unless
``remove_caches=true``). A rerun changes nothing;
the serve deploy brings the host back. docs/operate.md (the deploy is
``gpuserve.roles.deploys.remove_gpuserve``).
"""

from gpuserve.roles.deploys import remove_gpuserve

remove_gpuserve()
