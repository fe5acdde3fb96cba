"""lab/locks.py's real PyPI wheels for the gateway: kept only when the lock's sha256 says so.

No network: ``urllib.request.urlopen`` is replaced by a fake that serves given bytes."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from gpuserve.launch.locks import app_locks
from lab import locks as lab_locks

GOOD = b"a wheel's bytes"
SHA = hashlib.sha256(GOOD).hexdigest()
URL = "https://files.pythonhosted.org/packages/x/smg-1.13.0-cp38-abi3-any.whl"


@pytest.fixture
def served(monkeypatch):
    """The fake index: the bytes to serve, and every URL asked for."""
    state = {"body": GOOD, "asked": []}

    def urlopen(req, timeout=None):
        state["asked"].append(req.full_url)
        return io.BytesIO(state["body"])

    monkeypatch.setattr(lab_locks.urllib.request, "urlopen", urlopen)
    return state


def test_a_wheel_with_the_locks_digest_is_kept_and_then_reused(tmp_path, served) -> None:
    dest = tmp_path / "cache" / "smg.whl"
    assert lab_locks.fetch_wheel(URL, SHA, dest).read_bytes() == GOOD
    assert lab_locks.fetch_wheel(URL, SHA, dest) == dest
    assert served["asked"] == [URL]  # the second call found the checked file


def test_a_download_with_another_digest_is_refused_and_not_kept(tmp_path, served) -> None:
    served["body"] = b"something else"
    dest = tmp_path / "smg.whl"
    with pytest.raises(RuntimeError, match=f"the lock says {SHA}"):
        lab_locks.fetch_wheel(URL, SHA, dest)
    assert list(tmp_path.iterdir()) == []


def test_a_cached_file_that_changed_is_downloaded_again(tmp_path, served) -> None:
    dest = tmp_path / "smg.whl"
    dest.write_bytes(b"tampered")
    assert lab_locks.fetch_wheel(URL, SHA, dest).read_bytes() == GOOD
    assert served["asked"] == [URL]


def test_plain_http_is_refused(tmp_path, served) -> None:
    with pytest.raises(RuntimeError, match="refusing to download over http"):
        lab_locks.fetch_wheel("http://mirror/smg.whl", SHA, tmp_path / "smg.whl")
    assert served["asked"] == []


def test_publish_puts_every_wheel_of_the_guests_lock_on_the_mirror(tmp_path, monkeypatch,
                                                                  served) -> None:
    lock = next(lk for lk in app_locks("smg") if lk.python == lab_locks.GUEST_PYTHON)
    fetched = []

    def fetch(url: str, sha256: str, dest: Path) -> Path:
        fetched.append(url)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(sha256.encode())  # stands for a checked file
        return dest

    monkeypatch.setattr(lab_locks, "fetch_wheel", fetch)
    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path / "home"))
    names = lab_locks.publish_pypi(tmp_path / "mirror")
    assert sorted(names) == sorted(p.filename for p in lock.packages)
    assert sorted(fetched) == sorted(p.url for p in lock.packages)  # py312's not fetched
    for pkg in lock.packages:
        assert (tmp_path / "mirror/pypi" / pkg.filename).read_bytes() == pkg.sha256.encode()


def test_publish_uv_puts_the_pinned_guest_wheel_in_both_find_links(tmp_path, monkeypatch,
                                                                    served) -> None:
    """The guest (x86_64) gets the pin's x86_64 wheel, fetched by its pinned sha256, in
    wheels/ (the SGLang deploy's find-links) and pypi/ (the gateway's); no other."""
    from gpuserve.serve.uv import pin

    fetched = []

    def fetch(url: str, sha256: str, dest: Path) -> Path:
        fetched.append((url, sha256))
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(sha256.encode())
        return dest

    monkeypatch.setattr(lab_locks, "fetch_wheel", fetch)
    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path / "home"))
    (wheel,) = [w for w in pin().wheels if w.arch == "x86_64"]
    assert lab_locks.publish_uv(tmp_path / "mirror") == [wheel.filename]
    assert fetched == [(wheel.url, wheel.sha256)]
    for sub in ("wheels", "pypi"):
        assert [p.name for p in (tmp_path / "mirror" / sub).iterdir()] == [wheel.filename]
