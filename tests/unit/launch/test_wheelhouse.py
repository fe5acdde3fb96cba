"""``gpuserve wheelhouse``: exactly a lock's wheels, hash-checked, for an air-gapped host.

The lock here is written by the test with file:// URLs to wheels it made, so the
download path (urllib, sha256 while streaming, rename only on a match) runs for real
without a network.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.serve import uv


@pytest.fixture(autouse=True)
def uv_pin(tmp_path: Path, monkeypatch) -> uv.UvPin:
    """A uv pin of a wheel the test made (file://), in place of PyPI's."""
    body = b"u" * 50
    path = tmp_path / "src" / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body)
    pin = uv.UvPin("0.13.9", (uv.UvWheel(path.name, "x86_64", path.as_uri(),
                                         hashlib.sha256(body).hexdigest(), len(body)),
                              uv.UvWheel("uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl",
                                         "aarch64", "file:///nonexistent", "0" * 64, 1)))
    monkeypatch.setattr(uv, "pin", lambda: pin)
    return pin


def wheel(tmp: Path, name: str, body: bytes) -> dict:
    path = tmp / "src" / f"{name}-1.0-py3-none-any.whl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body)
    return {"name": name, "version": "1.0", "filename": path.name, "url": path.as_uri(),
            "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}


def write_lock(tmp: Path, packages: list[dict], external: list[dict] = ()) -> Path:
    sg = next(p for p in packages if p["name"] == "sglang")
    lock = {"lock_format": 1, "sglang": sg["version"], "sglang_sha256": sg["sha256"],
            "python": "3.11", "requires_python": ">=3.11", "platform": "any",
            "glibc_min": "2.17", "torch": "1.0", "torch_cuda": "13.0", "cuda_major": 13,
            "driver_min": "580.65.06", "cuda_archs": ["sm_90"],
            "download_bytes": sum(p.get("size") or 0 for p in packages),
            "external": list(external), "packages": packages}
    path = tmp / "sglang-1.0-cu13-py311.json"
    path.write_text(json.dumps(lock))
    return path


def test_downloads_exactly_the_lock_and_keeps_what_is_there(tmp_path: Path, capsys) -> None:
    lock = write_lock(tmp_path, [wheel(tmp_path, "sglang", b"s" * 100),
                                 wheel(tmp_path, "torch", b"t" * 300)])
    house = tmp_path / "house"
    assert main(["wheelhouse", "--lock", str(lock), str(house)]) == 0
    # and the pinned uv for the lock's platform (the deploy installs it from here first)
    assert sorted(p.name for p in house.iterdir()) == [
        "sglang-1.0-py3-none-any.whl", "torch-1.0-py3-none-any.whl",
        "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl"]
    assert "[2/2] torch-1.0-py3-none-any.whl" in capsys.readouterr().out
    # a rerun downloads nothing; --check agrees the house is complete
    assert main(["wheelhouse", "--lock", str(lock), str(house)]) == 0
    assert "downloaded 0.00 GiB" in capsys.readouterr().out
    assert main(["wheelhouse", "--lock", str(lock), "--check", str(house)]) == 0
    # without uv the air-gapped host could not build the venv: --check says so
    (house / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"x" * 50)
    assert main(["wheelhouse", "--lock", str(lock), "--check", str(house)]) == 1
    assert "uv 0.13.9 (the venvs' installer):" in capsys.readouterr().err


def test_check_names_a_missing_wheel_and_a_wrong_hash_is_never_kept(tmp_path: Path,
                                                                      capsys) -> None:
    good = wheel(tmp_path, "sglang", b"s" * 100)
    bad = dict(wheel(tmp_path, "torch", b"t" * 300), sha256="0" * 64)
    lock = write_lock(tmp_path, [good, bad])
    house = tmp_path / "house"
    assert main(["wheelhouse", "--lock", str(lock), "--check", str(house)]) == 1
    err = capsys.readouterr().err
    assert "sglang-1.0-cu13-py311: sglang==1.0:" in err and "missing" in err
    assert main(["wheelhouse", "--lock", str(lock), str(house)]) == 2
    err = capsys.readouterr().err
    assert "gpuserve: error:" in err and "is not the lock's 000000" in err
    assert not (house / "torch-1.0-py3-none-any.whl").exists()
    assert not list(house.glob("*.part"))


def test_placeholder_package_is_named_with_where_its_wheel_comes_from(tmp_path: Path,
                                                                        capsys) -> None:
    ext = {"name": "cuda-tile", "version": "1.6.0rc5", "sha256": None, "size": None,
           "external": True, "filename": None, "url": None}
    lock = write_lock(tmp_path, [wheel(tmp_path, "sglang", b"s"), ext],
                      [{"name": "cuda-tile", "version": "1.6.0rc5", "why": "placeholder",
                        "index": "https://pypi.nvidia.com/"}])
    assert main(["wheelhouse", "--lock", str(lock), str(tmp_path / "h")]) == 1
    err = capsys.readouterr().err
    assert "cuda-tile==1.6.0rc5: PyPI has only a placeholder" in err
    assert "--extra-index-url https://pypi.nvidia.com/ cuda-tile==1.6.0rc5" in err


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["packages"][1].update(sha256="abc"), "packages[1] (torch).sha256"),
    (lambda d: d["packages"][1].pop("sha256"), "packages[1] (torch).sha256"),
    (lambda d: d.pop("torch_cuda"), "torch_cuda"),
    (lambda d: d["packages"].append(dict(d["packages"][1])), "packages"),
])
def test_bad_lock_names_file_and_package(tmp_path: Path, capsys, change, field) -> None:
    lock = write_lock(tmp_path, [wheel(tmp_path, "sglang", b"s"), wheel(tmp_path, "torch", b"t")])
    data = json.loads(lock.read_text())
    change(data)
    lock.write_text(json.dumps(data))
    assert main(["wheelhouse", "--lock", str(lock), str(tmp_path / "h")]) == 2
    assert f"gpuserve: error: {lock}: {field}: " in capsys.readouterr().err


def test_bad_arguments_are_refused_before_dir_is_created(tmp_path: Path, capsys) -> None:
    house = tmp_path / "house"
    assert main(["wheelhouse", "--lock", str(tmp_path / "nope.json"), str(house)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert not house.exists()


def test_the_plan_comes_first_and_a_large_fetch_needs_yes(tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    from gpuserve.commands import wheelhouse

    lock = write_lock(tmp_path, [wheel(tmp_path, "sglang", b"s" * 100),
                                 wheel(tmp_path, "torch", b"t" * 300)])
    house = tmp_path / "house"
    assert main(["wheelhouse", "--lock", str(lock), "--dry-run", str(house)]) == 0
    assert "to fetch: 2 wheels" in capsys.readouterr().out and not house.exists()
    monkeypatch.setattr(wheelhouse, "CONFIRM_BYTES", 350)
    assert main(["wheelhouse", "--lock", str(lock), str(house)]) == 1
    out, err = capsys.readouterr()
    assert "to fetch: 2 wheels" in out and "add --yes" in err
    assert list(house.iterdir()) == []  # nothing fetched
    assert main(["wheelhouse", "--lock", str(lock), "--yes", str(house)]) == 0
    assert len(list(house.iterdir())) == 3  # and the pinned uv
    # once there, the rest is under the threshold: no --yes needed
    assert main(["wheelhouse", "--lock", str(lock), str(house)]) == 0
    assert "to fetch: 0 wheels, 0.00 GiB" in capsys.readouterr().out


def test_version_and_python_filters(tmp_path: Path, capsys) -> None:
    assert main(["wheelhouse", "--profile", "glm5-nvfp4-tp8", "--version", "0.5.23",
                 "--python", "3.12", "--dry-run", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "lock sglang-0.5.23-cu13-py312" in out and "py311" not in out
    assert main(["wheelhouse", "--profile", "glm5-nvfp4-tp8", "--version", "0.5.19",
                 "--dry-run", str(tmp_path / "h")]) == 2
    assert "renders for SGLang 0.5.23, not '0.5.19'" in capsys.readouterr().err
    lock = write_lock(tmp_path, [wheel(tmp_path, "sglang", b"s")])
    assert main(["wheelhouse", "--lock", str(lock), "--python", "3.12", str(tmp_path)]) == 2
    assert "is for 3.11, not 3.12" in capsys.readouterr().err


def test_python_builds_fetched_in_the_release_layout_and_hash_checked(tmp_path: Path, capsys,
                                                                       monkeypatch) -> None:
    """The catalog's archives (here a stand-in catalog of file:// archives) land in
    DIR/<build>/<archive>, the layout sglang_python_mirror names; a wrong hash keeps
    nothing."""
    from gpuserve.commands import wheelhouse
    from gpuserve.launch import interpreter

    body = b"stand-in archive"
    src = tmp_path / "cpython-3.12.14+20260814-x86_64-unknown-linux-gnu-install_only.tar.gz"
    src.write_bytes(body)
    build = interpreter.ManagedBuild("3.12.14", "3.12", "x86_64", "20260814", src.name,
                                     src.as_uri(), hashlib.sha256(body).hexdigest(), None)
    monkeypatch.setattr(interpreter, "managed_builds", lambda: (build,))
    house = tmp_path / "mirror"
    assert main(["wheelhouse", "--python-builds", "--python", "3.12", str(house)]) == 0
    assert (house / "20260814" / src.name).read_bytes() == body
    assert main(["wheelhouse", "--python-builds", "--check", str(house)]) == 0
    assert "to fetch: 0 managed CPython archives" in capsys.readouterr().out
    bad = interpreter.ManagedBuild(**{**build.__dict__, "sha256": "0" * 64})
    monkeypatch.setattr(interpreter, "managed_builds", lambda: (bad,))
    assert main(["wheelhouse", "--python-builds", str(tmp_path / "m2")]) != 0
    assert "is not the catalog's " + "0" * 64 in capsys.readouterr().err
    assert not any((tmp_path / "m2").rglob("*.tar.gz"))
    assert wheelhouse.CONFIRM_BYTES > 0
