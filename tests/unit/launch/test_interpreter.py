"""The interpreter choice against real recorded outputs of Ubuntu 22.04/24.04 and Debian
12/13 (gpuserve/data/distros/SOURCES.md) and the committed locks and managed-CPython
catalog (gpuserve/data/python/managed-cpython.json, from uv's download metadata)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpuserve.launch.interpreter import (
    DistroFacts,
    InterpreterError,
    choose_interpreter,
    is_release,
    managed_builds,
)
from gpuserve.launch.lock_choice import wanted_locks
from gpuserve.launch.locks import available_locks
from gpuserve.parsers.distro import parse_apt_policy, parse_os_release

FIXTURES = Path(__file__).resolve().parents[3] / "gpuserve" / "data" / "distros"
#: the Pythons SGLang 0.5.23's committed locks are for
PY_0523 = {lk.python for lk in wanted_locks(available_locks(), versions=["0.5.23"],
                                           pinned=None) if lk.sglang.startswith("0.5.23")}


def facts(distro: str, **kw) -> DistroFacts:
    d = FIXTURES / distro
    return DistroFacts(parse_os_release((d / "os-release").read_text()),
                       (d / "python3-version").read_text().strip(),
                       parse_apt_policy((d / "apt-policy").read_text()), **kw)


def choose(distro: str, pythons=None, **kw):
    args = dict(asked=None, mirror=None, home="/opt/gpuserve", host="gpu1")
    args.update(kw)
    return choose_interpreter(facts(distro), PY_0523 if pythons is None else pythons, **args)


def test_recorded_outputs_parse() -> None:
    jammy = facts("ubuntu2204")
    assert (jammy.os_release["ID"], jammy.os_release["VERSION_ID"]) == ("ubuntu", "22.04")
    rc = jammy.apt["python3.11"]
    assert (rc.candidate, rc.installed, rc.components) == ("3.11.0~rc1-1~22.04", None,
                                                          ("universe",))
    assert set(facts("debian13").apt) == {"python3.13"}  # trixie has no 3.11 or 3.12
    assert facts("debian12").apt["python3.11"].installed == "3.11.2-6+deb12u8"


def test_python_310_host_gets_managed_cpython_312_with_the_py312_lock() -> None:
    assert {"3.11", "3.12"} == PY_0523
    choice = choose("ubuntu2204")
    build = choice.build
    assert (choice.kind, choice.python, build.python, build.arch) == (
        "managed", "3.12", "3.12", "x86_64")
    assert choice.path == f"/opt/gpuserve/python/{build.dirname}/bin/python3.12"
    assert f"sha256 {build.sha256}" in choice.reason and choice.url in choice.reason
    assert "python3 is 3.10.12 (no lock for 3.10)" in choice.reason
    assert "python3.11 3.11.0~rc1-1~22.04 (universe) is a pre-release: not used" in (
        choice.reason)
    lock = next(lk for lk in available_locks()
                if lk.sglang == "0.5.23" and lk.python == choice.python)
    assert lock.name == "sglang-0.5.23-cu13-py312"


def test_debian13_uses_managed_312_not_its_313() -> None:
    choice = choose("debian13")
    assert (choice.kind, choice.python) == ("managed", "3.12")
    assert "python3 is 3.13.5 (no lock for 3.13)" in choice.reason


@pytest.mark.parametrize("distro,python,headers", [("debian12", "3.11", "python3.11-dev"),
                                                   ("ubuntu2404", "3.12", "python3.12-dev")])
def test_system_python3_when_a_lock_is_for_it(distro, python, headers) -> None:
    choice = choose(distro)
    assert (choice.kind, choice.python, choice.path) == ("system", python, "python3")
    assert headers in choice.packages  # Python.h for Triton's JIT


def test_a_release_distribution_interpreter_is_used_a_candidate_is_not() -> None:
    release = DistroFacts(facts("ubuntu2204").os_release, "3.10.12",
                          parse_apt_policy((FIXTURES / "debian12" / "apt-policy").read_text()))
    choice = choose_interpreter(release, PY_0523, asked=None, mirror=None,
                                home="/opt/gpuserve", host="gpu1")
    assert (choice.kind, choice.path) == ("distribution", "/usr/bin/python3.11")
    assert "python3.11-dev" in choice.packages and "python3.11-venv" in choice.packages
    assert not is_release("3.11.0~rc1-1~22.04") and is_release("3.11.2-6+deb12u8")


def test_mirror_keeps_the_release_layout() -> None:
    choice = choose("ubuntu2204", mirror="https://mirror.example/pbs/")
    b = choice.build
    assert choice.url == (f"https://mirror.example/pbs/{b.build}/"
                          f"{b.filename.replace('+', '%2B')}")


def test_refusals_name_what_was_looked_for_and_the_key() -> None:
    with pytest.raises(InterpreterError) as e:
        choose("ubuntu2204", asked="system")
    msg = str(e.value)
    assert ("gpu1 (Ubuntu 22.04.4 LTS): no interpreter for the SGLang venvs: its locks are "
            "for Python 3.12, 3.11 (sglang_python=system)") in msg
    assert "python3 is 3.10.12" in msg and "sglang_python=managed" in msg
    with pytest.raises(InterpreterError, match="sglang_python=managed"):
        choose("ubuntu2204", builds=())
    with pytest.raises(InterpreterError, match="sglang_python /opt/py/bin/python3.10 "
                       "Python 3.10.12, but the locks of the SGLang venvs are for "
                       "Python 3.12, 3.11"):
        choose_interpreter(facts("ubuntu2204", explicit="3.10.12"), PY_0523,
                           asked="/opt/py/bin/python3.10", mirror=None,
                           home="/opt/gpuserve", host="gpu1")


def test_explicit_interpreter_is_used_as_named() -> None:
    choice = choose_interpreter(facts("ubuntu2204", explicit="3.12.9"), PY_0523,
                                asked="/opt/py/bin/python3.12", mirror=None,
                                home="/opt/gpuserve", host="gpu1")
    assert (choice.kind, choice.python, choice.path) == ("explicit", "3.12",
                                                         "/opt/py/bin/python3.12")


def test_catalog_entries_are_pinned_install_only_archives() -> None:
    doc = json.loads((Path(__file__).resolve().parents[3] / "gpuserve" / "data" / "python"
                      / "managed-cpython.json").read_text())
    assert doc["source"]["repository"] == "astral-sh/uv"
    for b in managed_builds():
        assert len(b.sha256) == 64 and int(b.sha256, 16) >= 0
        assert b.url.endswith(b.filename.replace("+", "%2B"))
        assert "install_only" in b.filename and b.filename.startswith(f"cpython-{b.version}+")
    assert {(b.python, b.arch) for b in managed_builds()} >= {("3.12", "x86_64"),
                                                              ("3.11", "x86_64")}


def test_catalog_tool_picks_the_newest_stable_install_only_build(tmp_path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_python_catalog", Path(__file__).resolve().parents[3] / "tools" /
        "gen_python_catalog.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def entry(patch, pre="", variant=None, suffix="install_only_stripped.tar.gz"):
        url = (f"https://github.com/astral-sh/python-build-standalone/releases/download/"
               f"20260814/cpython-3.12.{patch}{pre}%2B20260814-x86_64-unknown-linux-gnu-"
               f"{suffix}")
        return {"name": "cpython", "arch": {"family": "x86_64", "variant": None},
                "os": "linux", "libc": "gnu", "major": 3, "minor": 12, "patch": patch,
                "prerelease": pre, "url": url, "variant": variant, "build": "20260814",
                "sha256": hashlib.sha256(url.encode()).hexdigest()}
    meta = {"a": entry(13), "b": entry(14), "c": entry(15, pre="rc1"),
            "d": entry(16, variant="debug", suffix="debug-full.tar.zst")}
    (picked,) = tool.pick(meta)
    assert picked["version"] == "3.12.14" and picked["sha256"] == meta["b"]["sha256"]


def test_serve_plan_on_ubuntu2204_facts_takes_the_py312_lock_and_its_own_venv() -> None:
    """The serve plan with the choice for Ubuntu 22.04's recorded answers: the lock of
    the managed CPython's Python, the server and the venv from that interpreter."""
    from gpuserve.launch.lock_choice import HostRuntime
    from tests.serve_plans import plan_of

    choice = choose("ubuntu2204")
    runtime = HostRuntime(name="gpu1", python=choice.version, glibc="2.35",
                          driver="580.126.20", cuda_toolkit="13.0", free_bytes=500 * 1024**3,
                          gpus=0, interpreter=choice)
    plan = plan_of({"profile": "glm5-nvfp4-tp8", "preflight": "off"}, "inventory/gpu.py",
                      lambda home: runtime, host_name="gpu1")
    assert plan.lock.name == "sglang-0.5.23-cu13-py312"
    assert plan.interpreter is choice
    assert plan.venv.startswith(f"/opt/gpuserve/venvs/0.5.23-{plan.lock.hash}-py")
    assert plan.service.unit_text.count(f"{plan.venv}/bin/python") >= 1
