"""The upstream dashboards on the Grafana host: each fetched from its pinned source (or
the operator's mirror) into a temporary file beside its place (at most 4 MiB), checked
against the catalog's sha256, and only then renamed into Grafana's dashboards directory.

Why this way: Grafana loads every ``*.json`` there, so a file that is not the catalog's
must never appear under its name, not even half-written; a file that already has the
catalog's sha256 is left alone (a rerun fetches nothing).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.operation import OperationMeta

from gpuserve.monitor.upstream_dashboards import DashboardFetch
from gpuserve.roles.base.prefetch import Read, fact


class FileSha256(FactBase):
    """The sha256 of a regular file (None: no such file)."""

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"[ -f {q} ] && [ ! -L {q} ] && sha256sum -- {q} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        digest = output[0].split(" ", 1)[0] if output else ""
        return digest if len(digest) == 64 else None


def reads(fetches: tuple[DashboardFetch, ...]) -> list[Read]:
    return [Read.of(FileSha256, path=f.dest) for f in fetches]


def fetch_command(f: DashboardFetch) -> str:
    """The shell text: download (at most ``max_bytes``) to ``.<file>.XXXXXX`` beside
    ``dest`` (not ``*.json``, so Grafana never reads it), refuse another sha256 naming
    the dashboard and both digests, else make it 0644 and rename it over ``dest``."""
    q = shlex.quote
    parent, name = f.dest.rsplit("/", 1)
    return (
        f"set -e; t=$(mktemp {q(f'{parent}/.{name}.XXXXXX')}); trap 'rm -f \"$t\"' EXIT; "
        f"curl -fsSL --proto =https,http,file --max-time 300 --max-filesize {f.max_bytes} "
        f"-o \"$t\" {q(f.url)} || {{ echo {q(f'gpuserve: dashboard {f.name}: ')}"
        f"{q(f'{f.url} could not be fetched; nothing was written')} >&2; exit 1; }}; "
        f"size=$(wc -c < \"$t\"); got=$(sha256sum < \"$t\" | cut -d' ' -f1); "
        f"if [ \"$got\" != {q(f.sha256)} ]; then echo "
        f"{q(f'gpuserve: dashboard {f.name}: {f.url}: sha256 expected {f.sha256} ')}"
        f"\"({f.size} bytes), got $got ($size bytes): refused, nothing was written\" >&2; "
        f"exit 1; fi; "
        f"chmod 644 \"$t\"; mv -f \"$t\" {q(f.dest)}; trap - EXIT")


@operation()
def upstream_dashboard(fetch_: DashboardFetch):
    """Fetch and check one upstream dashboard unless the file there already has the
    catalog's sha256."""
    if fact(FileSha256, path=fetch_.dest) == fetch_.sha256:
        host.noop(f"{fetch_.dest} is dashboard {fetch_.name} (sha256 {fetch_.sha256[:12]})")
        return
    yield StringCommand("sh", "-c", QuoteString(fetch_command(fetch_)))


def fetch(fetch_: DashboardFetch) -> OperationMeta | None:
    """The fetch operation of one dashboard, or None when its file is already there."""
    if fact(FileSha256, path=fetch_.dest) == fetch_.sha256:
        return None
    return upstream_dashboard(name=f"Fetch dashboard {fetch_.name} (sha256-checked)",
                              fetch_=fetch_)
