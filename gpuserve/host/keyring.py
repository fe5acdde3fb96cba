"""The cuda-keyring download, pinned by sha256 and checked before dpkg sees it.

Why: the package installs the key apt trusts for every later NVIDIA package, so a
replaced download would make every signature check after it worthless. The expected
digest comes from data (gpuserve/data/host/nvidia.yaml ``cuda_keyring_sha256``, keyed by
the repository's ``<distro>/<arch>``) or from host data ``nvidia_keyring_sha256`` (a
distribution the table lacks, or a mirror that serves its own keyring); with neither,
the deploy refuses rather than download the keyring unchecked.
"""

from __future__ import annotations

import re
import shlex

from gpuserve.errors import InputError
from gpuserve.host import driver

FIELD = "nvidia_keyring_sha256"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def validate_sha256(value: object, source: str) -> str | None:
    """Host data ``nvidia_keyring_sha256``: None or 64 hex digits (lowercased)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _SHA256.fullmatch(value.strip().lower()):
        raise InputError(source, FIELD, "must be the keyring package's sha256 (64 hex "
                         f"digits, as printed by sha256sum), got {str(value)[:80]!r}")
    return value.strip().lower()


def pinned(repo_dir: str) -> str | None:
    """The published sha256 for ``<distro>/<arch>`` (e.g. ``debian12/x86_64``), or None."""
    table = driver.nvidia_data().get("cuda_keyring_sha256") or {}
    return table.get(repo_dir)


def repo_dir(default_repo_url: str) -> str:
    """``debian12/x86_64`` from NVIDIA's ``.../cuda/repos/debian12/x86_64/``."""
    return "/".join(default_repo_url.rstrip("/").split("/")[-2:])


def expected_sha256(host_value: object, default_repo_url: str, source: str) -> str:
    """The digest the download must have: host data first, then the pinned table."""
    given = validate_sha256(host_value, source)
    if given:
        return given
    where = repo_dir(default_repo_url)
    found = pinned(where)
    if found:
        return found
    raise InputError(source, FIELD, f"no published sha256 of the cuda-keyring package for "
                     f"{where} in gpuserve/data/host/nvidia.yaml: set host data "
                     f"{FIELD} to the sha256sum of {default_repo_url}cuda-keyring_1.1-1_all.deb "
                     "(fetched over https and checked by you); gpuserve does not install "
                     "an unchecked keyring")


def install_command(url: str, sha256: str) -> str:
    """Download to a private temp dir, ``sha256sum -c``, then ``dpkg -i``; the temp dir
    goes whatever the outcome. Over https curl refuses a redirect to plain http."""
    q = shlex.quote
    proto = "--proto =https --proto-redir =https " if url.startswith("https://") else ""
    deb = '"$d/cuda-keyring.deb"'
    return (f'd=$(mktemp -d) && (curl -fsSL {proto}-o {deb} {q(url)} && '
            f'echo {q(sha256)}"  $d/cuda-keyring.deb" | sha256sum -c --strict - && '
            f'dpkg -i {deb}); rc=$?; rm -rf "$d"; exit $rc')
