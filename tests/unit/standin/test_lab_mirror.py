"""The lab mirror: publishers, layout, and the loopback HTTP server."""

from __future__ import annotations

import sys
import types
import urllib.request

import pytest

from lab import mirror
from lab.state import pid_alive


def test_publish_all_creates_layout_and_skips_missing_modules(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("lab_fake_publisher_ok")
    fake.publish = lambda root: calls.append(root) or (root / "wheels" / "x.whl").write_text("")
    monkeypatch.setitem(sys.modules, "lab_fake_publisher_ok", fake)
    monkeypatch.setattr(mirror, "PUBLISHERS",
                        ("lab_fake_publisher_ok", "lab_fake_publisher_absent"))
    warnings = []
    ran = mirror.publish_all(tmp_path, warn=warnings.append)
    assert ran == ["lab_fake_publisher_ok"]
    assert calls == [tmp_path]
    assert (tmp_path / "wheels/x.whl").exists()
    assert (tmp_path / "cuda/repos/debian12/x86_64").is_dir()
    assert len(warnings) == 1 and "lab_fake_publisher_absent" in warnings[0]


def test_failing_publisher_is_an_error_naming_it(tmp_path, monkeypatch):
    fake = types.ModuleType("lab_fake_publisher_bad")

    def publish(root):
        raise OSError("dpkg-scanpackages not found")

    fake.publish = publish
    monkeypatch.setitem(sys.modules, "lab_fake_publisher_bad", fake)
    monkeypatch.setattr(mirror, "PUBLISHERS", ("lab_fake_publisher_bad",))
    with pytest.raises(RuntimeError, match="lab_fake_publisher_bad.publish failed"):
        mirror.publish_all(tmp_path, warn=lambda m: None)


def test_broken_import_inside_a_publisher_is_not_hidden(tmp_path, monkeypatch):
    """A publisher that exists but imports something missing must fail loudly."""
    pkg = tmp_path / "pkgs"
    (pkg / "lab_fake_pub_imports").mkdir(parents=True)
    (pkg / "lab_fake_pub_imports/__init__.py").write_text("import no_such_module_xyz\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setattr(mirror, "PUBLISHERS", ("lab_fake_pub_imports",))
    with pytest.raises(ModuleNotFoundError, match="no_such_module_xyz"):
        mirror.publish_all(tmp_path / "m", warn=lambda m: None)


def test_server_serves_the_root_on_loopback_and_stops(tmp_path):
    root = tmp_path / "mirror"
    (root / "wheels").mkdir(parents=True)
    (root / "wheels/hello.txt").write_text("hi from the mirror\n")
    pid, port = mirror.start(root, tmp_path)
    try:
        assert pid_alive(pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/wheels/hello.txt",
                                    timeout=10) as resp:
            assert resp.read() == b"hi from the mirror\n"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
        assert err.value.code == 404
    finally:
        mirror.stop(pid)
    assert not pid_alive(pid)
    assert "GET /wheels/hello.txt" in (tmp_path / "mirror.log").read_text()
