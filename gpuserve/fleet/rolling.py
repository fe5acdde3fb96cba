"""Rolling a profile across hosts behind SGLang's gateway: what the gateway says, and
whether a host may leave it now.

Why here and not in the gateway: smg drains a worker that leaves its discovery file and
registers one that joins it (fleet.md section 7; tests/fixtures/smg/SOURCES.md), but it
knows nothing of a rollout. A switch that takes a host out while another is still
loading, or takes out the only ready one, fails requests however well the gateway
drains. So before a host leaves, the deploy reads the gateway's own view
(``GET /workers``) and the desired worker list (the inventory group) and refuses when
the host would be the last ready worker, or when ``max_unavailable`` workers are already
out (absent, draining, pending, unhealthy). The refusal happens before the host changes.

Also recorded in SOURCES.md, and the reason the deploy edits the discovery file rather
than calling ``DELETE /workers/<id>``: with file discovery, smg registers a deleted worker
again at its next reconcile while the file still lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpuserve import safeload
from gpuserve.errors import InputError


class WorkerStatus(StrEnum):
    """smg 1.13.0 worker states (``GET /workers`` ``status``; fleet.md section 4;
    smg-project/smg crates/protocols/src/worker.rs)."""

    PENDING = "pending"
    READY = "ready"
    NOT_READY = "not_ready"
    FAILED = "failed"
    DRAINING = "draining"


STATUSES = tuple(WorkerStatus)

#: Bounded: a fleet's worker list is small; a gateway answer beyond this is not one.
_LIMITS = safeload.DATA.but(max_bytes=4 * safeload.MiB)


@dataclass(frozen=True)
class GatewayWorker:
    """One worker as the gateway reports it."""

    url: str
    status: WorkerStatus
    healthy: bool

    @property
    def ready(self) -> bool:
        return self.status == WorkerStatus.READY and self.healthy


def parse_workers(text: str, source: str = "GET /workers") -> list[GatewayWorker]:
    """smg's ``GET /workers`` answer (tests/fixtures/smg/workers-*.json) as workers.

    Strict, because a rollout decides from it whether a host may leave: an answer
    without a ``workers`` list, a worker without a URL or with an unknown status is an
    :class:`InputError` naming the gateway answer, not "no workers"."""
    doc = safeload.loads_json(text, source, _LIMITS)
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise InputError(source, "workers", "not smg's GET /workers answer (no workers list)")
    out: list[GatewayWorker] = []
    for index, item in enumerate(doc["workers"]):
        field = f"workers[{index}]"
        if not isinstance(item, dict):
            raise InputError(source, field, "must be an object")
        url, status, healthy = item.get("url"), item.get("status"), item.get("is_healthy")
        if not isinstance(url, str) or not url:
            raise InputError(source, f"{field}.url", "missing")
        if status not in STATUSES:
            raise InputError(source, f"{field}.status", f"unknown status {status!r:.40} "
                             f"(smg 1.13.0 knows {', '.join(STATUSES)})")
        if not isinstance(healthy, bool):
            raise InputError(source, f"{field}.is_healthy", "must be true or false")
        out.append(GatewayWorker(url=normal_url(url), status=WorkerStatus(status),
                                 healthy=healthy))
    return out


def normal_url(url: str) -> str:
    """A worker URL as compared here: without a trailing slash (smg keeps the URL as
    given, and the inventory may be written either way)."""
    return url.rstrip("/")


@dataclass(frozen=True)
class Availability:
    """The desired workers split by what the gateway says of them."""

    ready: tuple[str, ...]
    out: tuple[str, ...]  # desired but not ready: absent, pending, draining, unhealthy


def availability(desired: Iterable[str], workers: Sequence[GatewayWorker]) -> Availability:
    by_url = {w.url: w for w in workers}
    ready, out = [], []
    for url in dict.fromkeys(normal_url(u) for u in desired):
        worker = by_url.get(url)
        (ready if worker is not None and worker.ready else out).append(url)
    return Availability(tuple(ready), tuple(out))


def take_out_refusal(url: str, desired: Iterable[str], workers: Sequence[GatewayWorker],
                     max_unavailable: int = 1) -> str | None:
    """Why ``url`` may not leave the gateway now, or None when it may.

    Counted over the desired workers (the inventory group): the host itself leaving
    must leave at least one other worker ready, and no more than ``max_unavailable``
    out in all (the host included, if it is not out already)."""
    if isinstance(max_unavailable, bool) or not isinstance(max_unavailable, int) \
            or max_unavailable < 1:
        raise ValueError(f"max_unavailable must be an integer >= 1, got {max_unavailable!r}")
    url = normal_url(url)
    state = availability(desired, workers)
    if url not in state.ready and url not in state.out:
        return f"{url} is not one of the gateway's workers (the inventory group)"
    others_ready = [u for u in state.ready if u != url]
    if not others_ready:
        return (f"{url} is the last ready worker behind the gateway; taking it out would "
                "fail every request (wait until another worker is ready)")
    others_out = [u for u in state.out if u != url]
    if len(others_out) + 1 > max_unavailable:
        return (f"{len(others_out)} other worker(s) already out of the gateway "
                f"({', '.join(others_out)}); max_unavailable is {max_unavailable}")
    return None
