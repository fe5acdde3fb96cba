"""The upstream dashboards' catalog (gpuserve/data/monitor/dashboards.yaml) and their
fetch on a grafana host (roles/grafana/upstream.py).

The catalog: every field there and well-formed, the URL built from repository, commit
and path, the digest and licence present; a bad entry names its field. The fetch: the
operation on a @fake host, its command then run here for real against a made-up
dashboard served from a file:// mirror or an HTTP server on 127.0.0.1 (never the real
sources): the file lands only when its sha256 is the catalog's, a mismatch is refused
naming the dashboard and both digests with nothing written, and a file already there
is no change."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import json
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from gpuserve.errors import InputError
from gpuserve.monitor.upstream_dashboards import (
    CATALOG,
    UpstreamDashboard,
    plan_fetches,
    raw_url,
    upstream_dashboards,
)
from gpuserve.roles.grafana.upstream import upstream_dashboard
from tests.unit.serve.test_service_rollback import run  # the operation on a @fake host

MADE_UP = json.dumps({"title": "made-up dashboard", "panels": []}, indent=2).encode() + b"\n"


def test_the_catalog_pins_dcgm_and_sglang_by_commit_digest_and_licence() -> None:
    entries = {e.name: e for e in upstream_dashboards()}
    assert set(entries) == {"dcgm-exporter", "sglang"}
    assert entries["dcgm-exporter"].repository == "NVIDIA/dcgm-exporter"
    assert entries["sglang"].path == ("examples/monitoring/grafana/dashboards/json/"
                                      "sglang-dashboard.json")
    for e in entries.values():
        assert e.url == (f"https://raw.githubusercontent.com/{e.repository}/{e.commit}/"
                         f"{e.path}")
        assert set(e.commit) <= set("0123456789abcdef") and len(e.commit) == 40
        assert set(e.sha256) <= set("0123456789abcdef") and len(e.sha256) == 64
        assert e.spdx == "Apache-2.0"
        assert e.licence_url == (f"https://github.com/{e.repository}/blob/{e.commit}/"
                                 "LICENSE")
        assert e.digest and e.file.endswith(".json") and e.size > 0
    assert entries["sglang"].sha256 == (
        "24cc22dd4687292ef43c76408698ceeff402ee1a146783e991a478069e6b033e")


def test_no_upstream_file_is_shipped() -> None:
    data = CATALOG.parent
    for e in upstream_dashboards():
        assert not list(data.rglob(e.file)), e.file
    assert not (data / "dashboards").exists()


def _catalog(tmp_path: Path, **change) -> Path:
    doc = yaml.safe_load(CATALOG.read_text())
    entry = doc["dashboards"][0]
    for key, value in change.items():
        if value is None:
            entry.pop(key)
        else:
            entry[key] = value
    path = tmp_path / "dashboards.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("change, field", [
    ({"url": "https://example.invalid/x.json"}, "dashboards[0].url"),
    ({"commit": "main"}, "dashboards[0].commit"),
    ({"sha256": "ABC"}, "dashboards[0].sha256"),
    ({"path": "../../etc/passwd"}, "dashboards[0].path"),
    ({"file": "../x.json"}, "dashboards[0].file"),
    ({"licence": {"spdx": "Apache-2.0"}}, "dashboards[0].licence"),
    ({"licence": None}, "dashboards[0]"),
    ({"digest": " "}, "dashboards[0].digest"),
    ({"size": 0}, "dashboards[0].size"),
])
def test_a_bad_entry_names_its_field(tmp_path, change, field) -> None:
    with pytest.raises(InputError) as info:
        upstream_dashboards.__wrapped__(_catalog(tmp_path, **change))
    assert info.value.field == field
    assert info.value.file == str(tmp_path / "dashboards.yaml")


def test_the_url_follows_repository_commit_and_path(tmp_path) -> None:
    commit = "0" * 40
    path = _catalog(tmp_path, commit=commit,
                    url=raw_url("NVIDIA/dcgm-exporter", commit,
                                "grafana/dcgm-exporter-dashboard.json"))
    (entry, *_) = upstream_dashboards.__wrapped__(path)
    assert entry.commit == commit and commit in entry.url
    with pytest.raises(InputError) as info:
        upstream_dashboards.__wrapped__(_catalog(tmp_path, commit=commit))
    assert info.value.field == "dashboards[0].url"  # the old commit's URL


def made_up(tmp_path: Path, sha256: str | None = None) -> UpstreamDashboard:
    """A catalog entry for MADE_UP, published on a file:// mirror under tmp_path."""
    real = upstream_dashboards()[0]
    entry = dataclasses.replace(real, name="made-up", file="made-up.json",
                                sha256=sha256 or hashlib.sha256(MADE_UP).hexdigest(),
                                size=len(MADE_UP))
    where = tmp_path / "mirror" / entry.repository / entry.commit / entry.path
    where.parent.mkdir(parents=True)
    where.write_bytes(MADE_UP)
    (tmp_path / "grafana").mkdir()
    return entry


def _run(fetch_) -> subprocess.CompletedProcess:
    meta, cmds = run(upstream_dashboard, {"sha256sum --": ""}, fetch_=fetch_)
    assert meta.did_change()
    return subprocess.run(["sh", "-c", cmds[-1]], capture_output=True, text=True,
                          timeout=60)


def test_fetched_from_a_file_mirror_checked_and_renamed(tmp_path) -> None:
    entry = made_up(tmp_path)
    (f,) = plan_fetches(str(tmp_path / "grafana"), str(tmp_path / "mirror"), (entry,))
    assert f.url.startswith("file://") and f.url.endswith(entry.path)
    done = _run(f)
    assert done.returncode == 0, done.stderr
    dest = tmp_path / "grafana" / "made-up.json"
    assert dest.read_bytes() == MADE_UP and dest.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in dest.parent.iterdir()] == ["made-up.json"]  # no leftovers


def test_a_mismatching_digest_is_refused_and_nothing_is_written(tmp_path) -> None:
    entry = made_up(tmp_path, sha256="f" * 64)
    (f,) = plan_fetches(str(tmp_path / "grafana"), f"file://{tmp_path}/mirror", (entry,))
    done = _run(f)
    actual = hashlib.sha256(MADE_UP).hexdigest()
    assert done.returncode != 0
    assert "dashboard made-up" in done.stderr and "f" * 64 in done.stderr, done.stderr
    assert f"got {actual} ({len(MADE_UP)} bytes)" in done.stderr and "refused" in done.stderr
    assert list((tmp_path / "grafana").iterdir()) == []
    # a good file already there stays as it was
    (tmp_path / "grafana" / "made-up.json").write_bytes(b"{}\n")
    assert _run(f).returncode != 0
    assert [(p.name, p.read_bytes()) for p in (tmp_path / "grafana").iterdir()] == [
        ("made-up.json", b"{}\n")]


def test_a_missing_file_is_an_error_naming_the_dashboard(tmp_path) -> None:
    entry = made_up(tmp_path)
    (f,) = plan_fetches(str(tmp_path / "grafana"), str(tmp_path / "elsewhere"), (entry,))
    done = _run(f)
    assert done.returncode != 0
    assert "dashboard made-up" in done.stderr and "could not be fetched" in done.stderr
    assert list((tmp_path / "grafana").iterdir()) == []


def test_fetched_over_http_on_loopback(tmp_path) -> None:
    entry = made_up(tmp_path)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(tmp_path / "mirror"))
    handler.log_message = lambda *a: None
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            mirror = f"http://127.0.0.1:{server.server_address[1]}/"
            (f,) = plan_fetches(str(tmp_path / "grafana"), mirror, (entry,))
            done = _run(f)
        finally:
            server.shutdown()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "grafana" / "made-up.json").read_bytes() == MADE_UP


def test_a_file_with_the_catalogs_digest_is_no_change(tmp_path) -> None:
    entry = made_up(tmp_path)
    (f,) = plan_fetches("/var/lib/grafana/dashboards/gpuserve", None, (entry,))
    assert f.url == entry.url  # no mirror: the pinned raw URL
    meta, cmds = run(upstream_dashboard, {"sha256sum --": f"{entry.sha256}  {f.dest}"},
                     fetch_=f)
    assert meta.did_succeed() and not meta.did_change()
    assert not any("curl" in c for c in cmds)
    # another file there: fetched again
    meta, cmds = run(upstream_dashboard, {"sha256sum --": f"{'0' * 64}  {f.dest}"},
                     fetch_=f)
    assert meta.did_change() and any("curl" in c for c in cmds)


def test_the_role_adds_a_fetch_only_for_a_file_without_the_catalogs_digest() -> None:
    """roles/grafana's per-dashboard step on a @fake host: the DCGM file already has
    the catalog's digest (no operation), SGLang's is absent (one fetch)."""
    import re

    from pyinfra.api import deploy

    from gpuserve.roles.grafana import upstream
    from tests.unit.host.test_host_roles import plan

    fetches = plan_fetches("/var/lib/grafana/dashboards/gpuserve", None)
    dcgm, sglang = (next(f for f in fetches if f.name == n) for n in ("dcgm-exporter",
                                                                       "sglang"))

    @deploy("dashboards")
    def dashboards() -> None:
        for f in fetches:
            upstream.fetch(f)

    ops = plan(dashboards, {re.compile(f"sha256sum -- {re.escape(dcgm.dest)}"):
                            [f"{dcgm.sha256}  {dcgm.dest}"]})
    assert [name for name, _ in ops] == ["dashboards | Fetch dashboard sglang (sha256-checked)"]
    (command,) = [c[1] for _, cmds in ops for c in cmds]
    assert sglang.url in command and sglang.sha256 in command
