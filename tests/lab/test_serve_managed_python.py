"""The serve deploy on a managed CPython (container tier): the lab mirror's stand-in
archive (lab/python_standin.py: Debian's python3.11 of the lab image in
python-build-standalone's install_only layout, labelled a stand-in in its catalog) is
fetched, hash-checked, unpacked beside the venvs and builds a venv of its own; the server
runs from it, python3 stays Debian's, a rerun changes nothing, and going back to python3
finds its venv again. What it does not prove: a real python-build-standalone build (see
docs/hosts.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from labhelpers import clean, healthy, no_changes, unit_venv

pytestmark = pytest.mark.lab

MANAGED = "/opt/gpuserve/python/cpython-3.11.2+lab"


def managed_args(lab) -> list[str]:
    catalog = Path(lab.state.mirror_root) / "python-builds" / "catalog.json"
    assert catalog.is_file(), "the lab mirror publishes the stand-in catalog"
    return ["--data", "sglang_python=managed", "--data", f"sglang_python_builds={catalog}",
            "--data", f"sglang_python_mirror={lab.mirror_url}python-builds/"]


@pytest.fixture(scope="module")
def managed_run(lab):
    first = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", check=False)
    assert first.returncode == 0, clean(first.stdout)[-4000:]
    system_venv = unit_venv(lab)
    r = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", *managed_args(lab),
                        check=False)
    return system_venv, r.returncode, clean(r.stdout)


def test_served_from_the_managed_interpreter(lab, managed_run) -> None:
    system_venv, rc, out = managed_run
    assert rc == 0, out[-6000:]
    assert "SGLang interpreter: managed Python 3.11.2" in out
    venv = unit_venv(lab)
    assert venv != system_venv and venv.startswith(system_venv.split("-py")[0])
    base = lab.ssh(f"{venv}/bin/python -c 'import sys; print(sys.base_prefix)'",
                   check=True).stdout.strip()
    assert base == MANAGED
    assert lab.ssh(f"test -f {MANAGED}/include/python3.11/Python.h").returncode == 0
    stamp = lab.ssh(f"cat {MANAGED}/.gpuserve-archive-sha256", check=True).stdout.strip()
    assert len(stamp) == 64 and stamp in out
    # python3 is the distribution's, untouched
    assert lab.ssh("readlink -f /usr/bin/python3", check=True).stdout.strip() == (
        "/usr/bin/python3.11")
    assert healthy(lab)


def test_rerun_no_changes_then_back_to_python3(lab, managed_run) -> None:
    system_venv, _, _ = managed_run
    again = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", *managed_args(lab),
                            check=False)
    out = clean(again.stdout)
    assert again.returncode == 0 and no_changes(out), out[-4000:]
    # keep_venvs=1: the managed interpreter's venv is pruned, so the modules after this
    # one find the host with the venvs they would find without it
    managed_venv = unit_venv(lab)
    back = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", "--data", "keep_venvs=1",
                           check=False)
    out = clean(back.stdout)
    assert back.returncode == 0, out[-4000:]
    assert unit_venv(lab) == system_venv  # the python3 venv was kept, not rebuilt
    assert f"venv: pruning {managed_venv}" in out
    assert healthy(lab)
