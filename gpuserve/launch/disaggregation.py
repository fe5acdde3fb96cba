"""A profile's ``disaggregation:`` block: SGLang's prefill-decode (PD) disaggregation.

Why: a PD fleet runs one model as two kinds of SGLang server, prefill hosts that compute
the prompt's KV cache and hand it over, and decode hosts that receive it and generate
(SGLang ``--disaggregation-mode prefill|decode``). The block says what both roles share
(the KV transfer backend, the prefill's bootstrap port) and what each role changes in
the profile (``prefill:``/``decode:``: any profile fields, merged over the profile as a
child file would be). Which role a host plays comes from the inventory
(gpuserve/fleet/disaggregation.py), never from the profile.

How: docs/disaggregation.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuserve import paths, safeload
from gpuserve.errors import InputError

#: The two roles, in the order a fleet is listed.
ROLES = ("prefill", "decode")
#: SGLang's own --disaggregation-bootstrap-port default (flag catalogs 0.5.19, 0.5.23).
DEFAULT_BOOTSTRAP_PORT = 8998
#: Profile keys a role may not change: both roles serve one model for one release,
#: and a role's block does not nest.
ROLE_FIXED = ("model", "extends", "sglang_versions", "disaggregation", "description")
BACKENDS_FILE = paths.DATA_DIR / "disaggregation" / "backends.yaml"


@dataclass(frozen=True)
class Backend:
    """One KV transfer backend: its import, the packages that provide it, and the
    backend rendered instead where the host has no RDMA device (None: it falls back
    by itself)."""

    name: str
    module: str
    packages: tuple[str, ...]
    tcp_fallback: str | None


@dataclass(frozen=True)
class DisaggregationSpec:
    """The block as written; ``mode`` is set on a role's own profile only."""

    transfer_backend: str = "mooncake"
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    overrides: dict[str, dict] = field(default_factory=dict)  # role -> profile fields
    mode: str | None = None  # prefill or decode on a role's profile (fleet/disaggregation.py)


@functools.cache
def backends() -> dict[str, Backend]:
    """The known backends (gpuserve/data/disaggregation/backends.yaml, with sources)."""
    doc = safeload.load_yaml_file(BACKENDS_FILE)
    table = doc.get("backends") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise InputError(BACKENDS_FILE, "backends", "must be a mapping of backend names")
    return {name: Backend(name, str(entry["module"]), tuple(entry["packages"]),
                          entry.get("tcp_fallback")) for name, entry in table.items()}


def parse_disaggregation(value: Any, error: Callable[[str, str], InputError]
                         ) -> DisaggregationSpec:
    """The block checked (``error(dotted, message)`` names the file and line); a role's
    fields are checked when its profile is built (fleet/disaggregation.role_profile)."""
    if not isinstance(value, dict):
        raise error("disaggregation", "must be a mapping (transfer_backend, "
                    "bootstrap_port, prefill, decode)")
    known = ("transfer_backend", "bootstrap_port", *ROLES)
    for key in value:
        if key not in known:
            raise error(f"disaggregation.{key}", f"unknown key (valid: {', '.join(known)})")
    backend = value.get("transfer_backend", "mooncake")
    if backend not in backends():
        raise error("disaggregation.transfer_backend", f"{backend!r:.40} is not one of "
                    f"{', '.join(backends())} (the KV transfer engines gpuserve installs "
                    "from a lock)")
    port = value.get("bootstrap_port", DEFAULT_BOOTSTRAP_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise error("disaggregation.bootstrap_port", f"must be a port in 1..65535, got "
                    f"{port!r:.40}")
    overrides: dict[str, dict] = {}
    for role in ROLES:
        block = value.get(role)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise error(f"disaggregation.{role}", "must be a mapping of profile fields "
                        "(memory:, extra_args:, ...) for this role's hosts")
        for key in block:
            if key in ROLE_FIXED:
                raise error(f"disaggregation.{role}.{key}", "is the same for both roles: "
                            "set it in the profile itself")
        overrides[role] = block
    return DisaggregationSpec(backend, port, overrides)
