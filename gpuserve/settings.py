"""The one merge of host data over the roles' documented defaults.

Every plan reads its host data the same way: the defaults of the roles it runs (layers,
later ones winning), each key then taken from the host's data when the host sets it.
Keys no layer documents are ignored (a host's data holds other deploys' keys too), and a
value is validated by the plan that reads it, never here. docs/architecture.md ("Host
data keys").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def settings(data: Mapping[str, Any], *layers: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``layers`` (merged in order), each overridden by ``data``'s value."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    merged.update({k: v for k, v in data.items() if k in merged})
    return merged
