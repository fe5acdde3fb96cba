"""The wheel carries the deploys: built from this checkout, installed into a fresh venv
and called from a user's own pyinfra project outside the repository.

How, offline: the wheel is built with ``pip wheel --no-deps --no-build-isolation`` from a
copy of the files it is made of (no build/ or egg-info left in the checkout), with the
setuptools of the environment running the tests (the ``test`` extra requires one that
meets pyproject's build-system). The fresh venv (``--without-pip``) gets the wheel alone
(``pip --python VENV install --no-deps``); its dependencies (pyinfra, paramiko, jinja2,
pyyaml) come from this environment's site-packages through a plain path line in a
``.pth`` file, which adds the directory to ``sys.path`` without running the ``.pth``
files in it: gpuserve's editable finder there stays off, and the assertions check that
gpuserve, gpuserve.roles, the templates and the profiles are the wheel's and the
project's, nothing from the checkout.

Then ``pyinfra --dry`` on an ``@fake`` host, from the project directory: a deploy file of
two lines calls ``gpuserve.roles.deploys.serve_sglang`` with a bare profile name, which
resolves to the project's own ``profiles/``; the plan renders the unit from the packaged
template and names the packaged host scripts. A second run with an unknown profile
shows the deploy's refusal (one ``gpuserve: error:`` line naming the project's
profiles/), and ``gpuserve check`` of the project's inventory passes from the wheel
alone. About 4 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# what the wheel is built from (pyproject's readme is README.md)
SOURCES = ("pyproject.toml", "README.md", "gpuserve", "roles", "templates")

RESPONSES = {"uname -s": ["Linux"], "useradd": ["/usr/sbin/useradd"],
             "groupadd": ["/usr/sbin/groupadd"]}

DEPLOY = """\
import json
from pathlib import Path

import gpuserve
import gpuserve.paths
import gpuserve.roles
from gpuserve.roles.deploys import serve_sglang

Path("where.json").write_text(json.dumps({
    "gpuserve": gpuserve.__file__, "roles": gpuserve.roles.__file__,
    "templates": str(gpuserve.paths.TEMPLATES_DIR),
    "profiles": str(gpuserve.paths.PROFILES_DIR.resolve()),
    "checkout": gpuserve.paths.CHECKOUT and str(gpuserve.paths.CHECKOUT),
}))
serve_sglang()
"""


def run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={**clean, **env})


def build_wheel(tmp: Path) -> Path:
    try:
        import setuptools  # noqa: F401
    except ImportError:  # never skipped: make setup installs the test extra
        pytest.fail("setuptools is missing: `make setup` installs gpuserve[test], which has it")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    r = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "-q", "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp / "dist").glob("gpuserve-*.whl")
    return wheel


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    r = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    assert r.returncode == 0, r.stderr
    python = venv / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  cwd=tmp).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "deps-of-the-test-env.pth").write_text("\n".join(sorted(deps)) + "\n")
    r = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
             "--no-index", "-q", str(wheel)], cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return python


def user_project(tmp: Path) -> Path:
    project = tmp / "myproject"
    shutil.copytree(REPO / "profiles", project / "profiles")
    (project / "serve.py").write_text(DEPLOY)
    data = {"fake_delay": 0, "fake_delay_jitter": 0, "fake_responses": RESPONSES,
            "profile": "glm5-nvfp4-tp8"}
    (project / "hosts.py").write_text(f"gpus = [('@fake/gpu1', {data!r})]\n")
    return project


@pytest.mark.slow
def test_the_wheel_serves_sglang_from_a_users_project(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"gpuserve/roles/{p.relative_to(REPO / 'roles')}" for p in
            (REPO / "roles").rglob("*.py")}
    want |= {f"gpuserve/templates/{p.name}" for p in (REPO / "templates").glob("*.j2")}
    scripts = REPO / "gpuserve/data/scripts"
    want |= {f"gpuserve/data/scripts/{p.name}" for p in scripts.glob("*.py")}
    assert not want - names, f"missing from the wheel (pyproject's packages?): {want - names}"
    assert "gpuserve/roles/deploys/serve.py" in names

    python = fresh_venv(tmp_path, wheel)
    project = user_project(tmp_path)
    r = run([str(python), "-m", "pyinfra", "--dry", "hosts.py", "serve.py"], cwd=project,
            PYINFRA_FAKE_DELAY="0")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    where = json.loads((project / "where.json").read_text())
    site = str(python.parent.parent)
    assert where["gpuserve"].startswith(site) and where["roles"].startswith(site), where
    assert where["templates"] == str(Path(where["gpuserve"]).parent / "templates"), where
    assert where["profiles"] == str(project.resolve() / "profiles"), where
    # nothing from the checkout: every path is the fresh venv's or the project's (both
    # under tmp_path, which make test puts inside the checkout's .venv)
    assert where["checkout"] is None, where
    assert all(Path(v).resolve().is_relative_to(tmp_path.resolve())
               for v in where.values() if v is not None), where
    for op in ("Install SGLang | Service group sglang",
               "Host scripts of the checks | host script /opt/gpuserve/bin/sglang_probe.py",
               "Configure the SGLang service | systemd unit "
               "/etc/systemd/system/gpuserve-sglang.service",
               "Check SGLang | smoke completion on port 30000",
               "keep this configuration as the last good one"):
        assert op in out, op
    assert "serve_sglang |" not in out and "Traceback" not in out

    r = run([str(python), "-m", "pyinfra", "-y", "hosts.py", "serve.py", "--data",
             "profile=no-such-profile"], cwd=project, PYINFRA_FAKE_DELAY="0")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    # the bare name resolved in the project's profiles/, whose profiles the line lists
    assert ("gpuserve: error: profiles/no-such-profile.yaml: no such profile (known: "
            in out and "glm5-nvfp4-tp8" in out), out
    assert "Traceback" not in out and "Beginning operation run" not in out
    # the message alone, not pyinfra's "pyinfra error in .../roles/base/inventory.py line N:"
    assert "pyinfra error" not in out and r.returncode == 2, out

    # gpuserve check runs the deploys' prepare-time plans from the wheel alone
    r = run([str(python.parent / "gpuserve"), "check", "hosts.py"], cwd=project)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "@fake/gpu1" in out and "glm5-nvfp4-tp8" in out and "Traceback" not in out, out
