"""The one redaction rule: every secret value in a text becomes one marker.

Every place that shows text which may hold a secret (a preview, a journal, a record, a
gateway's answer, a Hub error, the server's own output) calls :func:`redact`. The stdlib
scripts run on hosts (gpuserve/data/scripts/sglang_redact.py, hub_client.py) cannot
import gpuserve, so they carry a copy of :data:`REDACTED` and :func:`redact`, byte for byte
(tests/unit/test_redact.py compares them). Which values are secrets is decided by the
callers (gpuserve.launch.secrets and the host data keys), never here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import AnyStr

REDACTED = "<redacted>"


def redact(text: AnyStr, secrets: Iterable[AnyStr | None]) -> AnyStr:
    """``text`` with every occurrence of every secret hidden behind one REDACTED, where
    occurrences that overlap or touch become a single marker: a secret that contains or
    overlaps another leaks no part of either (the longest-first rule, also for overlaps),
    and a marker is never searched again. Any length: a short secret is still a secret;
    an empty value or None is nothing to look for. Text and secrets are both str, or both
    bytes (a server's raw output)."""
    spans = []
    for secret in {s for s in secrets if s}:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    marker = REDACTED if isinstance(text, str) else REDACTED.encode()
    parts, end = [], 0
    for start, stop in sorted(spans):
        if start > end or not parts:
            parts += [text[end:start], marker]
        end = max(end, stop)
    parts.append(text[end:])
    return text[:0].join(parts)
