"""Start SGLang's gateway (smg) with its API key, keeping the key off every command line.

Run by the gateway's systemd unit (roles/router) as
``<venv>/bin/python smg_launch.py SMG-LAUNCH-ARGS...``. smg reads its key only from
``--api-key`` (smg 1.13.0: no environment variable, no key file), and a key on argv is
visible in ``ps``, ``/proc/<pid>/cmdline`` and the unit file. So the unit hands the key
over with systemd's ``LoadCredential=api-key:FILE`` (a root-only file, exposed to this
service alone under ``$CREDENTIALS_DIRECTORY``), and this launcher adds ``--api-key KEY``
to the argument list *in-process*, calling smg's own parser and launcher (what
``smg launch`` does: ``smg.launch_router.parse_router_args`` and ``launch_router``).
No process is ever started with the key in its argv.

What remains (docs/fleet.md, "The key"): the key lives in the router's memory, in
``$CREDENTIALS_DIRECTORY`` (readable by the service user while it runs), and smg sends
it as ``Authorization: Bearer`` to the workers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CREDENTIAL = "api-key"


def key_flags(argv: list[str]) -> list[str]:
    """Arguments that already carry a key (argparse accepts prefixes: --api-k)."""
    return [a for a in argv if a.split("=", 1)[0] in ("--api-key", "--api-ke", "--api-k")]


def main(argv: list[str]) -> int:
    if key_flags(argv):
        print("smg_launch: --api-key must not be given on the command line (the key "
              "comes from the service's credential)", file=sys.stderr)
        return 2
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        print("smg_launch: no $CREDENTIALS_DIRECTORY: run by the systemd unit with "
              f"LoadCredential={CREDENTIAL}:FILE", file=sys.stderr)
        return 2
    try:
        key = (Path(directory) / CREDENTIAL).read_text().strip()
    except OSError as exc:
        print(f"smg_launch: cannot read credential {CREDENTIAL}: {exc.strerror}",
              file=sys.stderr)
        return 2
    if not key:
        print(f"smg_launch: credential {CREDENTIAL} is empty", file=sys.stderr)
        return 2
    from smg.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args([*argv, "--api-key", key]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
