"""Lock files: URLs are https:// or file://, wheel file names are plain names (the
wheelhouse writes DIR/<filename>), and ``wheelhouse --python`` is a Python minor."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuserve import safeload
from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.launch.locks import LOCKS_DIR, load_lock

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
