"""Serve a launch profile with SGLang on every host of the inventory, and prove it.

    pyinfra -y inventory/gpu.py deploy/serve.py --dry
    pyinfra -y inventory/gpu.py deploy/serve.py --data profile=glm5-nvfp4-tp8

Order: (1) validate host data and load + render the profile for the pinned SGLang
version (``roles/service/serve_plan.py``; any bad input raises ``InputError`` naming
file and field here, at prepare time, before any operation exists), (2) service user,
venv and ``pip install`` (``roles/sglang``), (3) unit, EnvironmentFile, secrets
``--config`` and activation (``roles/service``), (4) health gate and one smoke
completion (``roles/checks``), which prints ``<host>: smoke: N tokens in T s = X tok/s``,
(5) keep the configuration that just passed as the host's last good one
(``roles/service/rollback.py``).

Switching profiles, and rollback: ``--data profile=NAME`` (a name in ``profiles/`` or
a path) switches a host to another profile. After a passing health gate and smoke, the
unit, EnvironmentFile and ``--config`` file are copied to ``/etc/gpuserve/last-good/``
(0700 root, each copy with its original owner and mode) with a record of the profile
name. When the health gate then fails (the unit dies, SGLang prints a fatal line, or
``health_timeout`` passes) and the last good set differs from the failing one, the
deploy restores it, runs ``daemon-reload``, ``reset-failed`` and ``restart``, waits for
``/health`` again, and still fails the host (exit code non-zero) with the reason, the
last journal lines, ``profile NEW failed`` and ``the host was rolled back to profile
OLD, which is healthy again`` (or that it is not). With nothing to roll back to (the
first deploy on a host, or the failing set is the last good one) it fails as before
and says ``not rolled back: nothing to roll back to``. Only the service configuration
is rolled back, not the installed SGLang package; a failing smoke completion is
reported but not rolled back.

What a rerun reports: pyinfra counts an operation as a change when it ran at least one
command. The checks run their probes as facts and yield no command when they pass, so
a rerun against a healthy, unchanged host says "No changes" for every operation while
still verifying ``/health`` and a real completion, the way a deployment tool reports a
passing check as "ok" rather than "changed". A failing check fails the host (exit code
non-zero) with the reason and the last journal lines. See roles/checks for details.

Secrets (``hf_token``, ``sglang_api_key``) go only into the root-only EnvironmentFile
and the service user's ``--config`` YAML (both 0600, written from stdin, never shown by
``--diff``); because SGLang itself logs its resolved arguments with the API key
(sglang issue #37457), the unit then runs the server under a small redacting wrapper
(``gpuserve/data/scripts/sglang_redact.py``) so the key never reaches the journal.

Host data keys and defaults: ``roles/sglang.DEFAULTS``, ``roles/service.DEFAULTS``,
``roles/checks.DEFAULTS``, plus ``profile`` (required).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.facts.files import FileContents

from gpuserve.facts.gpu import CudaToolkit
from gpuserve.host.nccl_env import HOST_JSON_PATH
from roles.checks import check_service
from roles.inventory import inventory_source, run_deploy
from roles.service import UNIT_NAME, configure_service
from roles.service.rollback import RollbackSpec, keep_last_good
from roles.service.serve_plan import plan_serve
from roles.sglang import install_sglang


def main() -> None:
    plan = plan_serve(
        host.data.dict(),
        inventory_source(),
        cuda_toolkit=lambda: host.get_fact(CudaToolkit),
        host_record=lambda: host.get_fact(FileContents, path=HOST_JSON_PATH),
    )
    install_sglang(user=plan.user, home=plan.home, package=plan.package,
                   index_url=plan.index_url, find_links=plan.find_links)
    configure_service(plan=plan.service)
    rollback = RollbackSpec(profile_name=plan.service.profile_name, unit=UNIT_NAME)
    check_service(unit=UNIT_NAME, port=plan.service.port, served_name=plan.service.served_name,
                  profile_name=plan.service.profile_name, bin_dir=plan.bin_dir,
                  health_timeout=plan.health_timeout, config_path=plan.config_path,
                  record=plan.record, rollback=rollback)
    keep_last_good(name="keep this configuration as the last good one (root-only copies)",
                   spec=rollback)


run_deploy(main)
