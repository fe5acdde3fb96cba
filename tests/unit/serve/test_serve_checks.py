"""Serve checks and secret files through pyinfra's real execution path (@fake connector).

What is asserted is the contract docs/deploys.md documents: a passing check runs its
probe but counts as *no change*; a failing check fails the host with the reason; a
secret file's contents never appear in a command line or in the log, even with --diff.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import subprocess
import time

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from gpuserve.launch.locks import available_locks
from gpuserve.roles.base import managed
from gpuserve.roles.checks.gate import wait_healthy
from gpuserve.roles.checks.smoke import SmokeRequest, smoke_completion
from gpuserve.serve.uv import pin as uv_pin
from tests.unit.conftest import run_fake_op


def run(op, responses: dict, diff: bool = False, **kwargs):
    return run_fake_op(op, responses, pyinfra_config=Config(DIFF=diff), **kwargs)


def probe_doc(health, active="active", sub="running", restarts="0", lines=(), tail=(),
              last_exit=None, first_restarts=None):
    doc = {"health": health, "unit": {"ActiveState": active, "SubState": sub,
                                      "NRestarts": restarts},
           "lines": list(lines), "tail": list(tail), "last_exit": last_exit}
    if first_restarts is not None:
        doc["first_restarts"] = first_restarts
    return json.dumps(doc)


GATE = dict(unit="gpuserve-sglang.service", port=30000, script="/opt/gpuserve/bin/sglang_probe.py")


def test_healthy_service_is_verified_without_a_change() -> None:
    meta, cmds = run(wait_healthy, {"sglang_probe.py": probe_doc(200)}, timeout=5, **GATE)
    assert meta.did_succeed() and not meta.did_change()
    assert any("sglang_probe.py --unit gpuserve-sglang.service --port 30000" in c
               for c in cmds)


def test_healthy_after_a_systemd_restart_passes_with_a_warning(caplog) -> None:
    """A crash systemd already restarted: the gate passes (the server serves) and changes
    nothing, but the warning keeps the crash in the deploy's output."""
    doc = probe_doc(200, restarts="1", last_exit="gpuserve-sglang.service: Main process "
                    "exited, code=exited, status=137/n/a")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(wait_healthy, {"sglang_probe.py": doc}, timeout=5, **GATE)
    assert meta.did_succeed() and not meta.did_change()
    assert ("@fake: health: gpuserve-sglang.service was restarted 1 time by systemd since it "
            "was started (last exit: code=exited, status=137/n/a)") in caplog.text
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        caplog.clear()
        run(wait_healthy, {"sglang_probe.py": probe_doc(200)}, timeout=5, **GATE)
    assert "ready after" in caplog.text and "was restarted" not in caplog.text


def test_dead_unit_fails_the_host_with_journal_tail(caplog) -> None:
    doc = probe_doc(None, active="activating", sub="auto-restart", restarts="1",
                    lines=["[2026-03-03 03:53:36] Received sigquit from a child process. "
                           "It usually means the child failed."],
                    tail=["Nov 29 sglang[42]: torch.OutOfMemoryError: CUDA out of memory."])
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(wait_healthy, {"sglang_probe.py": doc}, timeout=600, **GATE)
    assert not meta.did_succeed()
    text = caplog.text
    assert "unit stopped during" in text and "torch.OutOfMemoryError" in text


def test_a_restart_during_the_first_waiting_probe_fails_the_gate(caplog) -> None:
    """The first probe waits on the host; it saw NRestarts go 0 -> 1 while it waited, so
    the start attempt died: the baseline is the count when the probe began."""
    doc = probe_doc(None, active="activating", sub="start", restarts="1",
                    first_restarts="0")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(wait_healthy, {"sglang_probe.py": doc}, timeout=5, **GATE)
    assert not meta.did_succeed()
    assert sum("sglang_probe.py" in c for c in cmds) == 1  # decided on the first answer


def test_probe_without_output_fails_the_host_cleanly(caplog) -> None:
    # no fake response: the probe "succeeds" printing nothing, pyinfra returns None
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(wait_healthy, {}, timeout=5, **GATE)
    assert not meta.did_succeed()
    assert "health: the probe printed nothing" in caplog.text


def test_timeout_fails_with_last_phase(caplog) -> None:
    doc = probe_doc(503, lines=["[2025-10-16 09:06:10 TP0] Load weight begin. avail mem=1 GB"])
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(wait_healthy, {"sglang_probe.py": doc}, timeout=0, **GATE)
    assert not meta.did_succeed()
    assert "not healthy after" in caplog.text and "loading weights" in caplog.text


SMOKE = dict(port=30000, model="glm-5", profile="glm5-nvfp4-tp8",
             script="/opt/gpuserve/bin/sglang_smoke.py",
             config="/etc/gpuserve/sglang-secrets.yaml")


def smoke_doc(status=200, tokens=64, elapsed=1.9):
    return json.dumps({"endpoint": "/v1/completions", "status": status, "elapsed_s": elapsed,
                       "body": {"choices": [{"text": " Paris"}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}})


def test_smoke_prints_the_speed_line_and_changes_nothing(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(smoke_completion, {"sglang_smoke.py": smoke_doc()}, **SMOKE)
    assert meta.did_succeed() and not meta.did_change()
    assert "@fake: smoke: 64 tokens in 1.9 s = 33.7 tok/s (glm-5, profile glm5-nvfp4-tp8)" \
        in caplog.text
    assert any("--config /etc/gpuserve/sglang-secrets.yaml" in c for c in cmds)


def test_smoke_http_error_fails_the_host(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(smoke_completion, {"sglang_smoke.py": smoke_doc(status=401)}, **SMOKE)
    assert not meta.did_succeed()
    assert "HTTP 401" in caplog.text


def run_gate_then_smoke(responses: dict):
    """The health gate (asking for the smoke) and the smoke check, in one pyinfra run."""
    inv = Inventory((["@fake"], {"fake_responses": responses, "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    request = SmokeRequest(port=SMOKE["port"], model=SMOKE["model"], config=SMOKE["config"],
                           profile=SMOKE["profile"])
    gate = next(iter(add_op(state, wait_healthy, timeout=5, smoke=request, **GATE).values()))
    smoke = next(iter(add_op(state, smoke_completion, **SMOKE).values()))
    with contextlib.suppress(PyinfraError):
        run_ops(state)
    return gate, smoke, [str(c) for c in next(iter(inv)).connector.executed_commands]


def test_a_healthy_gate_makes_the_smoke_in_the_same_command(caplog) -> None:
    """On a healthy server the probe makes the smoke completion too, and the
    smoke check judges that one instead of starting another command."""
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        gate, smoke, cmds = run_gate_then_smoke(
            {"sglang_probe.py": probe_doc(200) + "\n" + smoke_doc(elapsed=1.6)})
    assert gate.did_succeed() and smoke.did_succeed() and not smoke.did_change()
    assert [c for c in cmds if "sglang_" in c] == [
        "python3 /opt/gpuserve/bin/sglang_probe.py --unit gpuserve-sglang.service --port 30000"
        " --wait 5.0 --smoke-model glm-5 --smoke-max-tokens 64 --smoke-config "
        "/etc/gpuserve/sglang-secrets.yaml"]
    assert "@fake: smoke: 64 tokens in 1.6 s = 40.0 tok/s (glm-5, profile glm5-nvfp4-tp8)" \
        in caplog.text


def test_a_failed_smoke_made_by_the_gate_fails_the_host(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        gate, smoke, _ = run_gate_then_smoke(
            {"sglang_probe.py": probe_doc(200) + "\n" + smoke_doc(status=401)})
    assert gate.did_succeed() and not smoke.did_succeed()
    assert "HTTP 401" in caplog.text


def test_without_a_smoke_from_the_gate_the_smoke_runs_its_own_command(caplog) -> None:
    """A probe that printed no smoke line (an older script, or the server was not yet
    healthy when the probe ran): the smoke check makes its own completion."""
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        gate, smoke, cmds = run_gate_then_smoke({"sglang_probe.py": probe_doc(200),
                                                 "sglang_smoke.py": smoke_doc()})
    assert gate.did_succeed() and smoke.did_succeed()
    assert sum("sglang_smoke.py --port 30000" in c for c in cmds) == 1
    assert "@fake: smoke: 64 tokens in 1.9 s" in caplog.text


def run_gate_from_batch(batch: str | None, responses: dict, change_first: bool = False,
                        age: float = 0.0):
    """The gate and the smoke check of a deploy whose first batch read the serving probe
    (``batch``: that read's kept value; None: the batch kept none), optionally after an
    operation that changed the host."""
    from pyinfra.operations import server

    import gpuserve.roles.base.prefetch as prefetch_mod
    from gpuserve.roles.base.run_context import run_context
    from gpuserve.roles.checks.probe import serving_probe

    inv = Inventory((["@fake"], {"fake_responses": responses, "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    request = SmokeRequest(port=SMOKE["port"], model=SMOKE["model"], config=SMOKE["config"],
                           profile=SMOKE["profile"])
    read = serving_probe(GATE["script"], GATE["unit"], SMOKE["profile"], request)
    store = prefetch_mod._Store()
    run_context(state).host("@fake").reads = store
    if batch is not None:
        store.values[read] = batch
        store.taken[read] = time.monotonic() - age
    if change_first:
        add_op(state, server.shell, commands=["touch /etc/gpuserve/sglang.env"])
    gate = next(iter(add_op(state, wait_healthy, timeout=5, smoke=request,
                            **GATE).values()))
    smoke = next(iter(add_op(state, smoke_completion, **SMOKE).values()))
    with contextlib.suppress(PyinfraError):
        run_ops(state)
    return gate, smoke, [str(c) for c in next(iter(inv)).connector.executed_commands]


def test_a_healthy_probe_from_the_first_batch_proves_a_no_op_rerun_without_a_command(
        caplog) -> None:
    """The first batch probed the server of this profile (health and smoke);
    with nothing changed since, the gate and the smoke judge that and run nothing."""
    batch = probe_doc(200) + "\n" + smoke_doc(elapsed=1.6)
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        gate, smoke, cmds = run_gate_from_batch(batch, {})
    assert gate.did_succeed() and smoke.did_succeed() and not gate.did_change()
    assert not [c for c in cmds if "sglang_" in c]
    assert "@fake: smoke: 64 tokens in 1.6 s = 40.0 tok/s" in caplog.text


@pytest.mark.parametrize("batch", [
    probe_doc(None, active="activating", sub="start"),  # not healthy yet: no smoke made
    probe_doc(200),  # healthy but without a smoke line (an older probe script)
    probe_doc(None, active="failed", sub="failed"),  # a stale failure must not fail the host
    probe_doc(200) + "\n" + smoke_doc(status=503),  # a smoke that failed under the batch
    "not json",
    None,  # the batch kept nothing (its guard found another profile's unit)
])
def test_a_batch_probe_that_proves_nothing_is_probed_again(batch) -> None:
    fresh = probe_doc(200) + "\n" + smoke_doc(elapsed=1.6)
    gate, smoke, cmds = run_gate_from_batch(batch, {"sglang_probe.py": fresh})
    assert gate.did_succeed() and smoke.did_succeed()
    assert sum("sglang_probe.py --unit" in c for c in cmds) == 1


def test_a_batch_probe_older_than_its_limit_is_probed_again() -> None:
    """Across a fleet a host's gate may run minutes after its batch (pyinfra runs each
    operation on every host first): an old answer proves nothing about now."""
    from gpuserve.roles.checks.probe import BATCH_PROBE_MAX_AGE

    batch = probe_doc(200) + "\n" + smoke_doc(elapsed=1.6)
    fresh = probe_doc(200) + "\n" + smoke_doc(elapsed=1.6)
    _, _, cmds = run_gate_from_batch(batch, {"sglang_probe.py": fresh},
                                     age=BATCH_PROBE_MAX_AGE + 1)
    assert sum("sglang_probe.py --unit" in c for c in cmds) == 1


def test_after_a_change_the_batch_probe_is_not_trusted() -> None:
    """An operation changed the host before the gate: the server the batch found may be
    gone (a restart), so the gate probes afresh and fails on what it finds now."""
    batch = probe_doc(200) + "\n" + smoke_doc(elapsed=1.6)
    gate, _, cmds = run_gate_from_batch(
        batch, {"sglang_probe.py": probe_doc(None, active="failed", sub="failed")},
        change_first=True)
    assert not gate.did_succeed()
    assert sum("sglang_probe.py --unit" in c for c in cmds) == 1


def test_the_batch_probe_runs_only_on_the_env_file_of_its_profile(tmp_path) -> None:
    """The guard of :func:`serving_probe` is the profile line the EnvironmentFile
    template renders, so a switch's batch makes no completion on the server it
    replaces."""
    from gpuserve.roles.checks.probe import SglangProbe, serving_probe
    from gpuserve.serve.render import SERVICE_ENV_PATH, render_env_file

    request = SmokeRequest(port=30000, model="glm-5")
    read = serving_probe("/bin/echo", "gpuserve-sglang.service", "glm5-nvfp4-tp8", request)
    command = SglangProbe().command(**dict(read.kwargs))
    env_file = tmp_path / "sglang.env"
    assert SERVICE_ENV_PATH in command
    command = command.replace(SERVICE_ENV_PATH, str(env_file)).replace("python3 ", "")

    def probe_ran(profile: str) -> bool:
        env_file.write_text(render_env_file([("NCCL_DEBUG", "WARN")], profile,
                                            ["--model-path", "/models/m"]))
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return done.returncode == 0 and "--smoke-model glm-5" in done.stdout

    assert probe_ran("glm5-nvfp4-tp8")
    assert not probe_ran("glm5-nvfp4-tp8-eagle3")  # a prefix is another profile
    assert not probe_ran("other")
    env_file.unlink()
    assert subprocess.run(["sh", "-c", command]).returncode != 0


SECRET = "hf_Sup3rSecretToken"


@pytest.mark.parametrize("diff", [False, True])
def test_secret_file_contents_never_on_argv_or_in_log(caplog, diff: bool) -> None:
    """managed.secret's operation (a missing file: the prefetch saw nothing there)."""
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        meta, cmds = run(managed._file, {}, diff=diff, name="env file",
                         dest="/etc/gpuserve/sglang.env",
                         contents=lambda: f"HF_TOKEN={SECRET}\n",
                         user="root", group="root", mode="600")
    assert meta.did_succeed() and meta.did_change()

    assert cmds, "a missing file is written"
    assert all(SECRET not in c for c in cmds)
    assert any("umask 077" in c and "mv -f" in c for c in cmds)
    assert SECRET not in caplog.text


def test_secret_file_refuses_text_contents() -> None:
    """Text would be kept among the operation's printed arguments: a function only."""
    with pytest.raises(TypeError, match="takes a function"):
        managed.secret(name="x", dest="/etc/x", contents="HF_TOKEN=" + SECRET, user="root",
                       group="root", mode="600")


LOCK = next(lk for lk in available_locks() if lk.name == "sglang-0.5.23-cu13-py311")
VENV = f"/opt/gpuserve/venvs/0.5.23-{LOCK.hash}"
BUILD = dict(venv=VENV, lock=LOCK, requirements="/opt/gpuserve/locks/r.txt",
             pip_options=["--no-index", "--find-links", "http://10.0.2.2:8000/wheels/"])
VERIFY = dict(venv=VENV, lock=LOCK, user="sglang", script="/opt/gpuserve/bin/sglang_verify.py",
              user_home="/opt/gpuserve/cache", expect_gpus=1)
REPORT = {"python": "3.11.2", "sglang": "0.5.23", "torch": "2.14.1+cu130", "torch_dist": "2.14.1",
          "torch_cuda": "13.0",
          "cuda_available": True, "error": None,
          "devices": [{"name": "NVIDIA H200", "capability": "9.0"}]}


def test_verified_venv_of_the_lock_is_no_change() -> None:
    from gpuserve.roles.sglang import locked_venv

    meta, cmds = run(locked_venv, {".gpuserve-verified": LOCK.hash}, **BUILD)
    assert meta.did_succeed() and not meta.did_change()
    assert not any("pip" in c for c in cmds)


#: The detached install's status (roles/base/progress.py JobStatus): done, exit 0.
JOB_DONE = {"/rc 2>/dev/null": ["0", "##", "Collecting torch==2.9.1", "Successfully installed",
                                "##", "Successfully installed torch-2.9.1"]}


@pytest.mark.parametrize("stamp", ["", "0123456789ab"])
def test_missing_or_other_stamp_rebuilds_from_nothing_with_hashes(stamp: str) -> None:
    from gpuserve.roles.sglang import build_steps, clear_leftovers, locked_venv

    meta, cmds = run(locked_venv, {".gpuserve-verified": stamp, **JOB_DONE}, **BUILD)
    assert meta.did_succeed() and meta.did_change()
    failed = ("{ status=$?; { free=$(df -Pm /opt/gpuserve/venvs | tail -n 1 | tr -s ' ' | "
              f'cut -d \' \' -f 4); rm -rf {VENV}; echo "gpuserve: building {VENV} failed (exit '
              '$status, ${free:-?} MiB free on its filesystem); the unfinished venv was '
              'removed" >&2; exit $status; }; }')
    steps = build_steps(VENV, "/opt/gpuserve/locks/r.txt", BUILD["pip_options"])
    version = uv_pin().version
    uv = f"UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1 /opt/gpuserve/tools/uv-{version}/bin/uv"
    # the pinned uv first, by pip with the pin's hashes, from the lock's own mirror
    assert steps[0].startswith(f'[ "$(/opt/gpuserve/tools/uv-{version}/bin/uv --version ')
    assert ("/bin/pip install --disable-pip-version-check --no-input --require-hashes "
            "--no-deps --only-binary=:all: --no-index --find-links "
            f"http://10.0.2.2:8000/wheels/ -r /opt/gpuserve/tools/uv-{version}.txt; }} || "
            f"{failed}") in steps[0]
    assert steps[1] == f"{uv} venv {VENV} --no-config --python python3 || {failed}"
    assert steps[2] == ("{ UV_CACHE_DIR=/opt/gpuserve/tools/uv-cache "
                        f"{uv} pip install --no-config --python {VENV}/bin/python "
                        "--require-hashes --no-deps --only-binary :all: --link-mode hardlink "
                        "--compile-bytecode --no-index --find-links http://10.0.2.2:8000/wheels/ "
                        "-r /opt/gpuserve/locks/r.txt; status=$?; "
                        "rm -rf /opt/gpuserve/tools/uv-cache; (exit $status); } || "
                        f"{failed}")
    assert steps[3] == f"{uv} pip check --no-config --python {VENV}/bin/python || {failed}"
    # one detached job runs them (leftovers of an interrupted run stopped first), polled
    start = shlex.split(next(c for c in cmds if "uv venv" in c))
    assert start[:2] == ["sh", "-c"] and start[2].startswith(clear_leftovers(VENV))
    assert shlex.quote("\n".join(steps)) in start[2]
    assert re.fullmatch(rf"rm -rf /run/gpuserve-jobs/venv-0\.5\.23-{LOCK.hash}-\d+", cmds[-1])


def test_a_failed_detached_install_fails_the_host_with_its_last_lines(caplog) -> None:
    from gpuserve.roles.sglang import locked_venv

    failed = {"/rc 2>/dev/null": ["1", "##", "Collecting torch==2.9.1", "##",
                                  "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES",
                                  f"gpuserve: building {VENV} failed (exit 1, 9 MiB free "
                                  "on its filesystem); the unfinished venv was removed"]}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(locked_venv, {".gpuserve-verified": "", **failed}, **BUILD)
    assert not meta.did_succeed()
    assert f"building {VENV} from lock {LOCK.name} failed (exit status 1)" in caplog.text
    assert "DO NOT MATCH THE HASHES" in caplog.text and "9 MiB free" in caplog.text
    assert "venv 0.5.23-" in caplog.text  # the last progress line, when it ended


def fake_uv(tmp_path, version: str, pip_status: int) -> None:
    """A uv at the pinned path that says ``version``, half-builds a venv and fails its
    ``pip install`` with ``pip_status`` (on a host: a full disk or a bad hash)."""
    uv = tmp_path / "tools" / f"uv-{version}" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text("#!/bin/sh\n"
                  f'case "$1" in --version) echo "uv {version} (x86_64-unknown-linux-gnu)";;\n'
                  '  venv) mkdir -p "$2/lib" && echo x > "$2/lib/half-written";;\n'
                  f'  pip) [ "$2" = install ] && exit {pip_status};;\nesac\n')
    uv.chmod(0o755)


@pytest.mark.parametrize("credentials", [False, True])
def test_a_failed_install_removes_the_unfinished_venv(tmp_path, credentials: bool) -> None:
    """uv's install fails: the step's own shell removes the half-built venv and says so,
    with uv's exit status, so a failed deploy does not leave it holding the disk; the
    credentials files go at the job's exit, the pinned uv already there is not rebuilt."""
    from gpuserve.roles.sglang import build_steps

    version = uv_pin().version
    fake_uv(tmp_path, version, pip_status=3)
    venv = tmp_path / "venvs" / "0.5.23-abc"
    venv.parent.mkdir()
    conf = tmp_path / "pip.conf"
    steps = build_steps(str(venv), "/opt/gpuserve/locks/r.txt", BUILD["pip_options"],
                        str(conf) if credentials else None)
    if credentials:  # written before the job by their own commands
        conf.write_text("[global]\n")
        (tmp_path / "pip.conf.uv.toml").write_text("[pip]\n")
    done = subprocess.run(["sh", "-c", "\n".join(steps)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3, done.stderr
    assert not venv.exists() and (tmp_path / "venvs").is_dir()
    assert re.search(rf"gpuserve: building {re.escape(str(venv))} failed \(exit 3, \d+ MiB "
                     r"free on its filesystem\); the unfinished venv was removed", done.stderr)
    assert not conf.exists() and not (tmp_path / "pip.conf.uv.toml").exists()
    assert not (tmp_path / "tools" / f"uv-{version}.txt").exists()  # no bootstrap ran
    assert not (tmp_path / "tools" / "uv-cache").exists()


def test_passing_verification_runs_as_the_service_user_and_stamps(caplog) -> None:
    from gpuserve.roles.sglang import verify_venv

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(verify_venv, {".gpuserve-verified": "", "sglang_verify.py":
                                       json.dumps(REPORT)}, **VERIFY)
    assert meta.did_succeed() and meta.did_change()
    assert any(c.startswith("cd /opt/gpuserve/cache && runuser -u sglang -- env "
                            f"HOME=/opt/gpuserve/cache {VENV}/bin/python ") for c in cmds)
    assert f"> {VENV}/.gpuserve-verified" in cmds[-1] and LOCK.hash in cmds[-1]
    assert ("venv: verified sglang 0.5.23, torch 2.14.1+cu130 (CUDA 13.0), 1 GPU(s) sm_90"
            in caplog.text)


def test_failing_verification_removes_the_venv_and_fails_the_host(caplog) -> None:
    from gpuserve.roles.sglang import verify_venv

    bad = dict(REPORT, cuda_available=False, devices=[])
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(verify_venv, {".gpuserve-verified": "", "sglang_verify.py":
                                       json.dumps(bad)}, **VERIFY)
    assert not meta.did_succeed()
    assert f"rm -rf {VENV}" in cmds
    assert not any(c.startswith("sh -c 'printf") for c in cmds)
    assert "failed verification against lock sglang-0.5.23-cu13-py311" in caplog.text
    assert "is_available() is False" in caplog.text


@pytest.mark.parametrize(
    ("active", "enabled", "files", "unit", "reload", "newer", "steps"),
    [
        # nothing to do: a no-op rerun runs no command
        ("active", "enabled", False, False, False, (), []),
        # a switch: new unit and env while serving
        ("active", "enabled", True, True, False, (),
         ["daemon-reload", "reset-failed", "restart"]),
        # only the env changed: no daemon-reload
        ("active", "enabled", True, False, False, (), ["reset-failed", "restart"]),
        # a crash loop, fixed profile: clear the start limit, then (re)start: a server
        # systemd started again meanwhile runs the old files
        ("failed", "enabled", True, True, False, (),
         ["daemon-reload", "reset-failed", "restart"]),
        # failed with nothing changed: clear and start again
        ("failed", "enabled", False, False, False, (), ["reset-failed", "start"]),
        # first deploy: nothing to clear on an inactive unit, (re)start and enable
        ("inactive", "", True, True, False, (), ["daemon-reload", "restart", "enable"]),
        # files changed while a start queued at boot had not run yet (the unit waits for
        # network-online.target): restart, so a server the boot starts meanwhile with the
        # old files is replaced (start would leave it running)
        ("inactive", "enabled", True, False, False, (), ["restart"]),
        # stopped by hand, nothing changed: start
        ("inactive", "enabled", False, False, False, (), ["start"]),
        # a deploy cut off after writing the env file: the server is older than its file
        ("active", "enabled", False, False, False, ("/etc/gpuserve/sglang.env",),
         ["reset-failed", "restart"]),
        # cut off after writing the unit, before daemon-reload
        ("active", "enabled", False, False, True, ("/etc/systemd/system/u",),
         ["daemon-reload", "reset-failed", "restart"]),
        # someone disabled it
        ("active", "disabled", False, False, False, (), ["enable"]),
    ],
)
def test_activation_steps(active, enabled, files, unit, reload, newer, steps) -> None:
    from gpuserve.host.unit_state import LiveUnit
    from gpuserve.roles.service import activation_steps

    live = LiveUnit(active=active, enabled=enabled, need_reload=reload, newer=newer)
    assert activation_steps(live, files_changed=files, unit_changed=unit) == steps


@pytest.mark.parametrize("leftover", [("pip", "install", "--python", "{venv}/bin/python"),
                                      ("venv", "{venv}", "--no-config")])
def test_leftover_build_of_a_cut_off_deploy_is_stopped_before_the_rebuild(
        tmp_path, leftover: tuple[str, ...]) -> None:
    """An SSH drop leaves uv running on the host, writing into the venv; the rebuild
    stops it (and only it: the pattern never matches its own shell) and removes the
    directory. Runs the real shell here, against a real process."""
    import subprocess
    import sys
    import time

    from gpuserve.roles.sglang import clear_leftovers

    venv = str(tmp_path / "venvs" / "0.5.19+lab-abc")
    (tmp_path / "venvs" / "0.5.19+lab-abc" / "lib").mkdir(parents=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               *(a.format(venv=venv) for a in leftover)])
    try:
        time.sleep(0.3)
        # the real step's text names the venv plainly after the clearing part
        out = subprocess.run(["sh", "-c", clear_leftovers(venv)
                              + f"echo cleared || echo uv venv {venv} --python {venv}/bin/python"],
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "cleared", out
        assert orphan.wait(timeout=10) != 0  # killed
        assert not (tmp_path / "venvs" / "0.5.19+lab-abc").exists()
    finally:
        orphan.kill()
