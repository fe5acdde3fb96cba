"""uv as the installer of the locked venvs: its pin, the options and credentials it is
given, the bootstrap that installs it (run here by the real shell), its progress lines."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.install_progress import UV_LINES, uv_progress
from gpuserve.launch.locks import load_app_lock
from gpuserve.serve import uv
from gpuserve.serve.install import pip_args, pip_config_text

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "pypi" / "uv.json"  # SOURCE.md beside it


def test_the_committed_pin_is_pypis_manylinux_wheels_of_the_release() -> None:
    """gpuserve/data/tools/uv.json is what tools/gen_uv_pin.py makes of PyPI's document
    (a copy in tests/fixtures/pypi): the x86_64 and aarch64 manylinux wheels, each with
    PyPI's sha256 and size, at files.pythonhosted.org."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_uv_pin
    finally:
        sys.path.remove(str(REPO / "tools"))
    pin = uv.load_pin()
    files = json.loads(FIXTURE.read_text())["releases"][pin.version]
    expected = gen_uv_pin.pick(files, "https://pypi.org/pypi/uv/json")
    assert json.loads(uv.PIN_PATH.read_text())["wheels"] == expected
    assert {w.arch for w in pin.wheels} == {"x86_64", "aarch64"}
    by_name = {f["filename"]: f for f in files}
    for w in pin.wheels:
        assert by_name[w.filename]["digests"]["sha256"] == w.sha256
        assert w.url.startswith("https://files.pythonhosted.org/packages/")
    assert not any("musllinux_1_1_x86_64" in w.filename for w in pin.wheels)


def test_the_requirement_carries_every_pinned_hash_and_nothing_else() -> None:
    pin = uv.pin()
    words = pin.requirement().split()
    assert words[0] == f"uv=={pin.version}"
    assert words[1:] == [f"--hash=sha256:{w.sha256}" for w in pin.wheels]


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(package="pip"), "package"),
    (lambda d: d.update(version="latest"), "version"),
    (lambda d: d.update(wheels=[]), "wheels"),
    (lambda d: d["wheels"][0].update(sha256="abc"), "wheels[0].sha256"),
    (lambda d: d["wheels"][1].update(url=d["wheels"][1]["url"].replace("https", "http")),
     "wheels[1].url"),
    (lambda d: d["wheels"][0].update(filename="uv-0.1.0-py3-none-any.whl"),
     "wheels[0].filename"),
    (lambda d: d["wheels"][2].update(size="17 MB"), "wheels[2].size"),
])
def test_a_bad_pin_names_its_file_and_field(tmp_path: Path, change, field: str) -> None:
    doc = json.loads(uv.PIN_PATH.read_text())
    change(doc)
    path = tmp_path / "uv.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        uv.load_pin(path)
    assert exc.value.file == str(path) and exc.value.field == field


@pytest.mark.parametrize("index, find_links, trusted", [
    (None, "http://10.0.2.2:8000/wheels/", ("http://10.0.2.2:8000/",)),
    ("https://mirror.example/simple", None, ()),
    ("https://mirror.example/simple", "/srv/wheelhouse", ()),
])
def test_pips_index_options_are_uvs(index, find_links, trusted) -> None:
    options = pip_args(index, find_links, trusted=trusted)
    assert uv.uv_options(options) == options
    with pytest.raises(ValueError, match="--extra-index-url"):
        uv.uv_options([*options, "--extra-index-url", "https://elsewhere/simple"])


def test_the_credentials_reach_uv_in_its_own_config_file() -> None:
    """The URLs with a password never go on a command line: pip's config file and its
    uv.toml twin carry them; uv reads the twin as TOML under [pip]."""
    index = "https://user:s3cret@mirror.example/simple"
    links = "https://user:s3cret@mirror.example/wheels/"
    text = uv.uv_config_text(pip_config_text(index, links))
    assert tomllib.loads(text) == {"pip": {"index-url": index, "find-links": [links]}}
    assert uv.uv_options(pip_args(index, links)) == []


def write_exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("present", [None, "0.1.0", "same"])
def test_the_pinned_uv_is_installed_by_pip_with_its_hashes_unless_there(
        tmp_path: Path, present: str | None) -> None:
    """The bootstrap is skipped when that very uv version is installed; else its tools
    venv is made anew with the deploy's interpreter and pip installs the pin's
    requirement (every hash) from the lock's index options, its status kept."""
    pin = uv.pin()
    venv = f"{tmp_path}/venvs/0.5.23-abc"
    version = pin.version if present == "same" else present
    if version:
        write_exe(Path(uv.uv_path(venv, pin.version)),
                  f'echo "uv {version} (x86_64-unknown-linux-gnu)"\n')
    python = write_exe(tmp_path / "python", f'echo "$@" > {tmp_path}/called; exit 5\n')
    step = uv.bootstrap_step(venv, str(python), ["--no-index", "--find-links", "/srv/w"],
                             pin.version, pin.requirement(), None)
    done = subprocess.run(["sh", "-c", step], capture_output=True, text=True, timeout=30)
    if present == "same":
        assert done.returncode == 0 and not (tmp_path / "called").exists()
        return
    assert done.returncode == 5, done.stderr
    home = f"{tmp_path}/tools/uv-{pin.version}"
    assert (tmp_path / "called").read_text().split() == ["-m", "venv", home]
    assert Path(f"{home}.txt").read_text() == pin.requirement() + "\n"
    assert not Path(home).exists()  # the old one is removed before the rebuild


#: uv 0.13.9's summary lines on stderr, from `uv pip install --require-hashes --no-deps
#: -r` of gpuserve/data/locks/smg-1.13.0-py311.json into a fresh venv (2026-12-06).
UV_OUTPUT = ["Using Python 3.11.7 environment at: v1", "Resolved 7 packages in 6ms",
             "Prepared 7 packages in 732ms", "Installed 7 packages in 67ms",
             " + grpcio==1.85.3"]


def test_progress_follows_uvs_own_lines() -> None:
    import re

    lock = load_app_lock(REPO / "gpuserve" / "data" / "locks" / "smg-1.13.0-py311.json")
    selected = [line for line in UV_OUTPUT if re.search(UV_LINES, line)]
    assert selected == UV_OUTPUT[1:4]
    said = [uv_progress(selected[:n], lock, 12) for n in range(4)]
    assert said[0] == "creating the venv, 12 s"
    assert said[1].startswith("fetching and unpacking 7 packages (")
    assert said[2].startswith("all 7 packages fetched (") and "installing" in said[2]
    assert said[3].startswith("installed 7 packages (")
    assert uv_progress(["Collecting uv==0.13.9"], lock, 3) == "installing the pinned uv, 3 s"
