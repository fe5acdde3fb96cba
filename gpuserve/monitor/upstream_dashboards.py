"""The upstream Grafana dashboards (NVIDIA's DCGM dashboard, SGLang's official one): a
catalog of pinned sources (gpuserve/data/monitor/dashboards.yaml), and where each file
is fetched from for one grafana host.

Why fetched and not shipped: they are other projects' files under their own licences;
the grafana role downloads each onto the Grafana host from its commit (or an operator's
mirror, for air-gapped hosts) and refuses any file whose sha256 is not the catalog's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import quote

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

CATALOG = DATA_DIR / "monitor" / "dashboards.yaml"
RAW_BASE = "https://raw.githubusercontent.com"
FIELDS = ("name", "file", "repository", "commit", "path", "url", "sha256", "size",
          "licence", "digest")
#: a dashboard larger than this is refused before it is written (the catalog's are ~20 KB)
MAX_SIZE = 4 * 1024 * 1024

_PATTERNS = {
    "name": r"[a-z0-9][a-z0-9-]{0,62}",
    "file": r"[a-z0-9][a-z0-9._-]{0,62}\.json",
    "repository": r"[A-Za-z0-9][A-Za-z0-9_.-]{0,38}/[A-Za-z0-9][A-Za-z0-9_.-]{0,99}",
    "commit": r"[0-9a-f]{40}",
    "path": r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*",
    "sha256": r"[0-9a-f]{64}",
}


@dataclass(frozen=True)
class UpstreamDashboard:
    """One catalog entry: a dashboard file pinned by commit and sha256."""

    name: str
    file: str
    repository: str
    commit: str
    path: str
    url: str
    sha256: str
    size: int
    spdx: str
    licence_url: str
    digest: str

    def url_from(self, mirror: str | None) -> str:
        """The file's URL below ``mirror`` (``<mirror>/<repository>/<commit>/<path>``,
        the raw URL's layout; an absolute path is a file:// mirror), else the pinned raw
        URL."""
        if not mirror:
            return self.url
        base = f"file://{mirror}" if mirror.startswith("/") else mirror
        return f"{base.rstrip('/')}/{raw_path(self.repository, self.commit, self.path)}"


def raw_path(repository: str, commit: str, path: str) -> str:
    """``<owner>/<name>/<commit>/<path>``, each part URL-quoted: the raw URL's path."""
    return "/".join(quote(part) for part in (*repository.split("/"), commit,
                                             *path.split("/")))


def raw_url(repository: str, commit: str, path: str) -> str:
    """GitHub's raw file URL of ``path`` in ``repository`` at ``commit``."""
    return f"{RAW_BASE}/{raw_path(repository, commit, path)}"


def _entry(raw: object, where: str, source: Path) -> UpstreamDashboard:
    if not isinstance(raw, dict):
        raise InputError(source, where, "must be a mapping")
    missing = [k for k in FIELDS if k not in raw]
    unknown = sorted(set(raw) - set(FIELDS))
    if missing or unknown:
        raise InputError(source, where, f"missing {', '.join(missing) or 'nothing'}; "
                         f"unknown {', '.join(unknown) or 'nothing'}")
    for key, pattern in _PATTERNS.items():
        value = raw[key]
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise InputError(source, f"{where}.{key}", f"{str(value)[:80]!r} does not "
                             f"match {pattern}")
    if ".." in raw["path"].split("/"):
        raise InputError(source, f"{where}.path", "must stay inside the repository")
    expected = raw_url(raw["repository"], raw["commit"], raw["path"])
    if raw["url"] != expected:
        raise InputError(source, f"{where}.url", f"must be {expected} (the repository, "
                         "commit and path of this entry)")
    size = raw["size"]
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_SIZE:
        raise InputError(source, f"{where}.size", f"must be 1..{MAX_SIZE} bytes")
    licence = raw["licence"]
    if not isinstance(licence, dict) or set(licence) != {"spdx", "url"} or not (
            isinstance(licence["spdx"], str) and re.fullmatch(r"[A-Za-z0-9.+-]+",
                                                              licence["spdx"])
            and isinstance(licence["url"], str) and licence["url"].startswith("https://")):
        raise InputError(source, f"{where}.licence", "must be {spdx: <SPDX id>, url: "
                         "https://... (the upstream licence)}")
    if not isinstance(raw["digest"], str) or not raw["digest"].strip():
        raise InputError(source, f"{where}.digest", "must say how the sha256 was obtained")
    return UpstreamDashboard(
        name=raw["name"], file=raw["file"], repository=raw["repository"],
        commit=raw["commit"], path=raw["path"], url=raw["url"], sha256=raw["sha256"],
        size=size, spdx=licence["spdx"], licence_url=licence["url"],
        digest=" ".join(raw["digest"].split()))


@cache
def upstream_dashboards(path: Path = CATALOG) -> tuple[UpstreamDashboard, ...]:
    """The catalog's dashboards, each checked (fields, URL, digest, licence); names and
    file names unique."""
    doc = safeload.load_yaml_file(path)
    if not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(
            doc.get("dashboards"), list):
        raise InputError(path, None, "must be a mapping with format: 1 and a dashboards list")
    entries = tuple(_entry(raw, f"dashboards[{i}]", path)
                    for i, raw in enumerate(doc["dashboards"]))
    for key in ("name", "file"):
        values = [getattr(e, key) for e in entries]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise InputError(path, f"dashboards.{key}", f"repeated: {', '.join(dupes)}")
    return entries


@dataclass(frozen=True)
class DashboardFetch:
    """What the grafana role does for one upstream dashboard on one host."""

    name: str
    dest: str      # path on the grafana host
    url: str       # upstream's raw URL or the mirror's
    sha256: str
    size: int      # the catalog's, for the messages
    max_bytes: int = MAX_SIZE  # a larger answer is cut off and refused


def plan_fetches(directory: str, mirror: str | None,
                 entries: tuple[UpstreamDashboard, ...] | None = None
                 ) -> tuple[DashboardFetch, ...]:
    """One fetch per catalog dashboard into ``directory``, from ``mirror`` when set."""
    chosen = upstream_dashboards() if entries is None else entries
    return tuple(DashboardFetch(e.name, f"{directory}/{e.file}", e.url_from(mirror),
                                e.sha256, e.size) for e in chosen)
