"""The gateway's interpreter: the same choice as the SGLang venvs' (gpuserve/launch/
interpreter.py) made for smg's locks, against the real recorded outputs of Ubuntu 22.04,
Debian 12 and Debian 13 (gpuserve/data/distros/SOURCES.md), and what it does to the
plan (lock, venv, ``-m venv``), ``gpuserve check`` and the wheelhouse."""

from __future__ import annotations

import shlex

import pytest

from gpuserve.commands.check import check_host
from gpuserve.errors import InputError
from gpuserve.fleet.multinode import Member
from gpuserve.launch.interpreter import (
    GATEWAY,
    DistroFacts,
    InterpreterError,
    choose_interpreter,
    managed_builds,
    recorded_facts,
)
from gpuserve.launch.locks import app_locks, available_locks
from gpuserve.plans.router import plan_router
from gpuserve.roles.sglang import build_steps
from gpuserve.serve.install import validate_python

KEY = "router-key-0123456789abcdef"
SRC = "inventory/fleet.py"
HOME = "/opt/gpuserve-router"
SMG_PYTHONS = {lk.python for lk in app_locks("smg")}


def gateway_choice(distro: str, asked: str | None = None, **kw):
    args = dict(mirror=None, home=HOME, host="gw", role=GATEWAY)
    args.update(kw)
    return choose_interpreter(recorded_facts(distro), SMG_PYTHONS, asked=asked, **args)


def router_plan(**kwargs):
    data = {"router_workers_group": "gpu", "router_api_key": KEY}
    workers = [Member("gpu-a", {"profile": "glm5-nvfp4-tp8", "private_address": "10.0.0.21",
                                "listen_address": "10.0.0.21"})]
    groups = {"gpu": workers, "router": [Member("gw", data)]}
    return plan_router(data, SRC, host_name="gw", group_members=groups.get, **kwargs)


@pytest.mark.parametrize("distro,python3", [("ubuntu2204", "3.10.12"), ("debian13", "3.13.5")])
def test_python3_without_an_smg_lock_gets_the_managed_cpython_312(distro, python3) -> None:
    assert {"3.11", "3.12"} == SMG_PYTHONS
    choice = gateway_choice(distro)
    build = choice.build
    assert (choice.kind, choice.python, build.arch) == ("managed", "3.12", "x86_64")
    assert choice.path == f"{HOME}/python/{build.dirname}/bin/python3.12"
    assert f"python3 is {python3} (no lock for {python3[:4]})" in choice.reason
    assert f"sha256 {build.sha256}" in choice.reason and choice.url in choice.reason
    assert "for the gateway's (smg) venv only" in choice.reason
    plan = router_plan(python=choice.version, glibc="2.35", interpreter=choice)
    assert plan.lock.name == "smg-1.13.0-py312"
    # built beside a python3 venv of the same lock, never in its place
    assert plan.venv.startswith(f"{HOME}/venvs/smg-1.13.0-{plan.lock.hash}-py")
    steps = build_steps(plan.venv, plan.requirements, [], None, plan.python)
    assert f" venv {shlex.quote(plan.venv)} --no-config --python {shlex.quote(choice.path)} " \
        in steps[1]
    assert plan.argv()[0] == f"{plan.venv}/bin/python"


def test_debian12_keeps_python3_its_venv_path_and_needs_no_headers() -> None:
    choice = gateway_choice("debian12")
    assert (choice.kind, choice.path, choice.python) == ("system", "python3", "3.11")
    # smg compiles nothing: python3-venv only, where the SGLang venv also takes Python.h
    assert choice.packages == ("python3-venv",)
    plan = router_plan(python=choice.version, glibc="2.36", interpreter=choice)
    assert plan.lock.name == "smg-1.13.0-py311"
    assert plan.venv == f"{HOME}/venvs/smg-1.13.0-{plan.lock.hash}"  # as before: no rebuild
    assert plan.venv == router_plan(python="3.11.2", glibc="2.36").venv


def test_refusal_names_the_interpreter_looked_for_and_the_gateways_key() -> None:
    with pytest.raises(InterpreterError) as e:
        gateway_choice("ubuntu2204", asked="system")
    msg = str(e.value)
    assert msg.startswith("gw (Ubuntu 22.04.4 LTS): no interpreter for the gateway's (smg) "
                          "venv: its locks are for Python 3.12, 3.11 (router_python=system)")
    assert "python3 is 3.10.12 (no lock for 3.10)" in msg
    assert "set router_python=managed" in msg and "router_python=/path/to/python3.12" in msg
    with pytest.raises(InterpreterError, match="no managed CPython 3.12 for x86_64.*"
                       "router_python=managed"):
        gateway_choice("debian13", builds=())
    with pytest.raises(InterpreterError, match="router_python /usr/bin/python3.13 Python "
                       "3.13.5, but the locks of the gateway's"):
        trixie = DistroFacts(recorded_facts("debian13").os_release, "3.13.5",
                             explicit="3.13.5")
        choose_interpreter(trixie, SMG_PYTHONS, asked="/usr/bin/python3.13", mirror=None,
                           home=HOME, host="gw", role=GATEWAY)


def test_router_python_falls_back_to_sglang_python_and_is_checked() -> None:
    assert validate_python({}, SRC, "router_python") == ("auto", None)
    assert validate_python({"sglang_python": "managed"}, SRC, "router_python")[0] == "managed"
    assert validate_python({"sglang_python": "managed", "router_python": "system"}, SRC,
                           "router_python")[0] == "system"
    with pytest.raises(InputError) as e:
        validate_python({"router_python": "python3.12"}, SRC, "router_python")
    assert (e.value.file, e.value.field) == (SRC, "router_python")
    with pytest.raises(InputError) as e:  # gpuserve check and the deploy: before any change
        plan_router({"router_workers_group": "gpu", "router_api_key": KEY,
                     "router_python": "../python"}, SRC, host_name="gw",
                    group_members={"gpu": [Member("gw", {"profile": "glm5-nvfp4-tp8"})]}.get)
    assert e.value.field == "router_python"


@pytest.mark.parametrize("distro,summary", [
    ("ubuntu2204", "on ubuntu2204: managed Python 3.12.14, lock smg-1.13.0-py312"),
    ("debian13", "on debian13: managed Python 3.12.14, lock smg-1.13.0-py312"),
    ("debian12", "on debian12: system Python 3.11.2, lock smg-1.13.0-py311"),
])
def test_check_reports_the_gateways_choice_when_host_data_names_the_distribution(
        distro, summary) -> None:
    groups = {"gpu": [Member("gpu-a", {"profile": "glm5-nvfp4-tp8",
                                       "private_address": "10.0.0.21",
                                       "listen_address": "10.0.0.21"})]}
    data = {"router_workers_group": "gpu", "router_api_key": KEY, "host_distribution": distro}
    result = check_host("gw", data, SRC, "router", groups)
    assert result.ok, result.error
    assert summary in result.summary
    found = result.details["interpreter"]
    assert found["packages"] == (["python3-venv"] if distro == "debian12" else [])
    if distro != "debian12":
        assert found["path"].startswith(f"{HOME}/python/cpython-3.12.14+")
    refused = check_host("gw", {**data, "router_python": "system"}, SRC, "router", groups)
    assert (not refused.ok) == (distro != "debian12")
    if not refused.ok:
        assert "router_python=managed" in refused.error
    without = check_host("gw", {k: v for k, v in data.items() if k != "host_distribution"},
                         SRC, "router", groups)
    assert without.ok and without.details["interpreter"] is None


def test_the_wheelhouse_python_builds_carry_every_interpreter_a_lock_needs() -> None:
    """``gpuserve wheelhouse --python-builds`` fetches the catalog: it holds a build for
    the Python of every committed lock, smg's included, on both machines."""
    catalog = {(b.python, b.arch) for b in managed_builds()}
    pythons = SMG_PYTHONS | {lk.python for lk in available_locks()}
    missing = {(p, a) for p in pythons for a in ("x86_64", "aarch64")} - catalog
    assert not missing


def test_the_wheelhouse_takes_smgs_lock_with_its_filters(tmp_path, capsys) -> None:
    """``gpuserve wheelhouse --lock`` on smg's lock (it has no CUDA facts): the plan of
    exactly its wheels, and ``--check`` naming each one missing; a wrong filter refused."""
    from gpuserve.cli import main
    from gpuserve.serve.uv import pin as uv_pin

    lock = next(lk for lk in app_locks("smg") if lk.python == "3.12")
    assert main(["wheelhouse", "--lock", str(lock.path), "--dry-run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"lock smg-1.13.0-py312: {len(lock.packages)} wheels" in out
    assert f"to fetch: {len(lock.packages)} wheels" in out
    assert main(["wheelhouse", "--lock", str(lock.path), "--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    # each of the lock's wheels, and the pinned uv that installs them
    assert err.count("is missing or its sha256 differs") == len(lock.packages) + 1
    assert f"uv {uv_pin().version} (the venvs' installer):" in err
    assert f"smg==1.13.0: {tmp_path}/{lock.package('smg').filename}" in err
    assert main(["wheelhouse", "--lock", str(lock.path), "--version", "1.12.0", "--dry-run",
                 str(tmp_path)]) != 0
    assert "is for 1.13.0, not 1.12.0" in capsys.readouterr().err
