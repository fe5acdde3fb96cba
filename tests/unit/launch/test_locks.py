"""Committed SGLang locks (gpuserve/data/locks/, tools/gen_lock.py from PyPI) and the loader.

No network: the committed files are read as they are, and the bad-input cases are
edits of a copy of a real lock.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest

from gpuserve import safeload
from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.launch import catalog
from gpuserve.launch.locks import (
    LOCKS_DIR,
    available_locks,
    check_against_catalog,
    load_lock,
)

LOCKS = available_locks()
BY_NAME = {lk.name: lk for lk in LOCKS}
EXPECTED = {f"sglang-{v}-cu{c}-py{p}" for v, c in (("0.5.10.post1", 12), ("0.5.19", 13),
                                                      ("0.5.23", 13)) for p in ("311", "312")}
COMPILER = re.compile(r"^nvidia-(cuda-nvcc|nvjitlink|nvvm|cuda-crt)(-cu\d+)?$")
RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$")
REQ_LINE = re.compile(r"^([a-z0-9-]+)==(\S+) --hash=sha256:([0-9a-f]{64})$")


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_committed_locks_load_and_are_named_after_their_header() -> None:
    assert set(BY_NAME) >= EXPECTED
    for lk in LOCKS:
        py = lk.python.replace(".", "")
        assert lk.name == f"sglang-{lk.sglang}-cu{lk.cuda_major}-py{py}"
        assert lk.generator == "tools/gen_lock.py"
        assert lk.resolved["pip"] and lk.resolved["date"]


def test_every_non_external_package_has_a_hash_and_a_size() -> None:
    for lk in LOCKS:
        for pkg in lk.packages:
            if pkg.external:
                assert pkg.sha256 is None and pkg.index, (lk.name, pkg)
                assert pkg.name in {e.name for e in lk.external}
            else:
                assert re.fullmatch(r"[0-9a-f]{64}", pkg.sha256), (lk.name, pkg.name)
                assert pkg.size > 0 and pkg.filename.endswith(".whl")
                assert pkg.url.startswith("https://files.pythonhosted.org/")
        assert lk.download_bytes == sum(p.size or 0 for p in lk.packages)


def test_requirements_text_round_trips_and_is_stable() -> None:
    for lk in LOCKS:
        text = lk.requirements_text()
        assert text == lk.requirements_text() and text.endswith("\n")
        pinned = [REQ_LINE.match(line).groups() for line in text.splitlines()
                  if not line.startswith("#")]
        assert pinned == sorted((p.name, p.version, p.sha256) for p in lk.packages
                                if not p.external)
        comments = [line for line in text.splitlines() if line.startswith("#")]
        assert len(comments) == len(lk.external)
        assert re.fullmatch(r"[0-9a-f]{12}", lk.hash)
        assert load_lock(lk.path).hash == lk.hash
    assert len({lk.hash for lk in LOCKS}) == len(LOCKS)


def test_sglang_wheel_is_the_one_the_flag_catalog_was_read_from() -> None:
    lk = BY_NAME["sglang-0.5.23-cu13-py311"]
    source = catalog.load_catalog("0.5.23").source
    assert lk.sglang_sha256 in source and lk.package("sglang").filename in source
    assert check_against_catalog(lk, source) is None
    assert check_against_catalog(lk, lk.sglang_sha256) is None
    # the cp312 lock installs another wheel of the release: not comparable, not a mismatch
    assert check_against_catalog(BY_NAME["sglang-0.5.23-cu13-py312"], source) is None
    other = source.replace(lk.sglang_sha256, "0" * 64)
    assert "0" * 64 in check_against_catalog(lk, other)
    # 0.5.10.post1 is py3-none-any: both Python minors install the catalog's very file
    source = catalog.load_catalog("0.5.10.post1").source
    for py in ("311", "312"):
        old = BY_NAME[f"sglang-0.5.10.post1-cu12-py{py}"]
        assert old.package("sglang").filename in source
        assert check_against_catalog(old, source) is None


def test_torch_cuda_and_driver_are_what_sglang_install_md_says() -> None:
    want = {"0.5.10.post1": ("2.9.1", "12.8", "570.26"), "0.5.19": ("2.13.0", "13.0", "580.65.06"),
            "0.5.23": ("2.14.1", "13.0", "580.65.06")}
    for lk in LOCKS:
        assert (lk.torch, lk.torch_cuda, lk.driver_min) == want[lk.sglang], lk.name
        assert lk.cuda_major == int(lk.torch_cuda.split(".")[0])
        assert "Table 3" in lk.driver_source
        assert lk.glibc_min == "2.34" and lk.platform == "manylinux_2_34_x86_64"
        assert lk.cuda_archs == ("sm_80", "sm_89", "sm_90", "sm_100", "sm_120")


def test_compiler_wheels_are_pinned_to_the_runtime_minor() -> None:
    for lk in LOCKS:
        runtime = [p for p in lk.packages if RUNTIME.match(p.name)]
        assert len(runtime) == 1 and minor(runtime[0].version) == lk.torch_cuda
        assert runtime[0].name in lk.cuda_runtime
        for pkg in lk.packages:
            if COMPILER.match(pkg.name):
                assert minor(pkg.version) == lk.torch_cuda, (lk.name, pkg.name, pkg.version)
        for c in lk.constraints:
            assert c.endswith(f"=={lk.torch_cuda}.*")


def test_placeholder_pin_is_external_only_where_sglang_pins_it() -> None:
    for lk in LOCKS:
        tile = lk.package("cuda-tile")
        if lk.sglang == "0.5.19":
            assert tile.external and tile.version == "1.6.0rc5"
            assert [(e.name, e.index) for e in lk.external] == [
                ("cuda-tile", "https://pypi.nvidia.com/")]
            assert "# external, not hash-pinned: cuda-tile==1.6.0rc5" in lk.requirements_text()
        else:
            assert lk.external == () and not tile.external


def test_supports_python_minor_and_glibc() -> None:
    lk = BY_NAME["sglang-0.5.23-cu13-py311"]
    assert lk.supports(python="3.11.2", glibc="2.36") is None
    assert lk.supports() is None
    assert "Python 3.12" in lk.supports(python="3.12", glibc="2.39")
    reason = lk.supports(python="3.11", glibc="2.31")
    assert "2.31" in reason and "2.34" in reason and lk.name in reason
    with pytest.raises(ValueError):
        lk.supports(glibc="new")


# --------------------------------------------------------------------------
# Bad input: every problem is an InputError naming the file and the package/field.
# --------------------------------------------------------------------------

BASE = json.loads((LOCKS_DIR / "sglang-0.5.19-cu13-py311.json").read_text())


def index_of(data: dict, name: str) -> int:
    return next(i for i, p in enumerate(data["packages"]) if p["name"] == name)


def torch_pkg(d: dict) -> dict:
    return d["packages"][index_of(d, "torch")]


def _drop_hash(d: dict) -> None:
    del torch_pkg(d)["sha256"]


def _short_hash(d: dict) -> None:
    torch_pkg(d)["sha256"] = "abc123"


def _upper_hash(d: dict) -> None:
    torch_pkg(d)["sha256"] = torch_pkg(d)["sha256"].upper()


def _null_hash(d: dict) -> None:
    torch_pkg(d)["sha256"] = None


def _duplicate(d: dict) -> None:
    d["packages"].append(copy.deepcopy(torch_pkg(d)))


def _size_type(d: dict) -> None:
    torch_pkg(d)["size"] = "big"


def _negative_size(d: dict) -> None:
    torch_pkg(d)["size"] = -1


def _fractional_size(d: dict) -> None:
    torch_pkg(d)["size"] = 1.5


def _bad_version(d: dict) -> None:
    torch_pkg(d)["version"] = "latest"


def _unlisted_external(d: dict) -> None:
    d["external"] = []


CASES = [
    (_drop_hash, "packages[{torch}] (torch).sha256", "missing"),
    (_short_hash, "packages[{torch}] (torch).sha256", "64 lowercase hex"),
    (_upper_hash, "packages[{torch}] (torch).sha256", "64 lowercase hex"),
    (_null_hash, "packages[{torch}] (torch).sha256", "must be a string"),
    (_duplicate, "packages", "duplicate package torch"),
    (_size_type, "packages[{torch}] (torch).size", "must be"),
    (_negative_size, "packages[{torch}] (torch).size", "negative"),
    (_fractional_size, "packages[{torch}] (torch).size", "whole number"),
    (_bad_version, "packages[{torch}] (torch).version", "PEP 440"),
    (lambda d: d.pop("torch_cuda"), "torch_cuda", "missing"),
    (lambda d: d.pop("packages"), "packages", "missing"),
    (lambda d: d.update(cuda_major="13"), "cuda_major", "must be an integer"),
    (lambda d: d.update(cuda_major=True), "cuda_major", "boolean"),
    (lambda d: d.update(cuda_archs="sm_90"), "cuda_archs", "must be a list"),
    (lambda d: d.update(cuda_archs=["90"]), "cuda_archs[0]", "sm_90"),
    (lambda d: d.update(python=3.11), "python", "must be a string"),
    (lambda d: d.update(sglang_sha256="0" * 64), "sglang_sha256", "packages say"),
    (lambda d: d.update(download_bytes=1), "download_bytes", "add up to"),
    (lambda d: d.update(lock_format=2), "lock_format", "format 1"),
    (_unlisted_external, "packages[{tile}] (cuda-tile).external", "not listed"),
]


@pytest.mark.parametrize(("change", "field", "words"), CASES)
def test_bad_lock_is_an_input_error_naming_file_and_field(tmp_path: Path, change, field,
                                                          words) -> None:
    data = copy.deepcopy(BASE)
    change(data)
    path = tmp_path / "sglang-0.5.19-cu13-py311.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        load_lock(path)
    want = field.format(torch=index_of(BASE, "torch"), tile=index_of(BASE, "cuda-tile"))
    assert info.value.field == want
    text = str(info.value)
    assert text.startswith(f"{path}: {want}: ") and words in text
    if "packages[" in want or "duplicate" in words:  # the package is named too
        assert "torch" in text or "cuda-tile" in text


def test_not_json_not_an_object_or_not_finite(tmp_path: Path) -> None:
    text = json.dumps(BASE)
    size = f'"size": {torch_pkg(BASE)["size"]}'
    assert size in text
    for body, words in (("{", "invalid JSON"), ("[]", "JSON object"),
                        (text.replace(size, '"size": NaN'), "NaN"),
                        (text.replace(size, '"size": 1e400'), r"torch\).size: .*whole number")):
        path = tmp_path / "lock.json"
        path.write_text(body)
        with pytest.raises(InputError, match=words) as info:
            load_lock(path)
        assert str(path) in str(info.value)


def test_available_locks_reads_another_directory(tmp_path: Path) -> None:
    assert available_locks(tmp_path) == []
    (tmp_path / "sglang-0.5.19-cu13-py311.json").write_text(json.dumps(BASE))
    assert [lk.name for lk in available_locks(tmp_path)] == ["sglang-0.5.19-cu13-py311"]


# --------------------------------------------------------------------------------------
# Lock files: URLs are https:// or file://, wheel file names are plain names (the wheelhouse writes
# DIR/<filename>), and ``wheelhouse --python`` is a Python minor.


SOURCE = LOCKS_DIR / "sglang-0.5.23-cu13-py312.json"


def lock_with(tmp_path: Path, **pkg) -> Path:
    doc = json.loads(SOURCE.read_text())
    doc["packages"][0].update(pkg)
    path = tmp_path / SOURCE.name
    path.write_text(json.dumps(doc))
    return path


def test_committed_locks_load() -> None:
    assert load_lock(SOURCE).packages


@pytest.mark.parametrize("url", ["http://files.example/a.whl", "ftp://x/a.whl",
                                 "files.example/a.whl", "https:///a.whl"])
def test_urls_other_than_https_or_file_are_refused(tmp_path, url) -> None:
    with pytest.raises(InputError) as err:
        load_lock(lock_with(tmp_path, url=url))
    assert err.value.field == "packages[0] (aiohappyeyeballs).url"


def test_file_urls_of_a_local_mirror_load(tmp_path) -> None:
    load_lock(lock_with(tmp_path, url="file:///srv/mirror/wheels/a.whl"))


@pytest.mark.parametrize("name", ["../../home/u/.bashrc.whl", "/etc/x.whl", ".hidden.whl",
                                  "a/b.whl"])
def test_wheel_names_with_a_directory_are_refused(tmp_path, name) -> None:
    with pytest.raises(InputError) as err:
        load_lock(lock_with(tmp_path, filename=name))
    assert err.value.field == "packages[0] (aiohappyeyeballs).filename"
    assert "plain file name" in err.value.message


def test_wheelhouse_python_must_be_a_minor(tmp_path, capsys) -> None:
    assert main(["wheelhouse", "--profile", "glm5-nvfp4-tp8", "--python", "abc",
                 "--check", str(tmp_path)]) == 2
    assert "--python: python: must be a Python minor" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_a_regular_file_is_read(tmp_path, kind) -> None:
    """A FIFO nobody writes (its open used to wait forever), a device that never ends
    and a directory are refused naming the path and what it is, before any read."""
    path = tmp_path / "facts.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(InputError) as refused:
        safeload.read_bytes(path, field="--facts")
    assert (refused.value.file, refused.value.field) == (str(path), "--facts")
    assert refused.value.message.endswith("not a regular file")
    assert {"fifo": "FIFO", "device": "character device",
            "directory": "directory"}[kind] in refused.value.message
