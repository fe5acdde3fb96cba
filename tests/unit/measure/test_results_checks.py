"""The smoke check records its result on the controller without counting as a change.

Runs ``roles.checks.smoke_completion`` through pyinfra's real execution path (@fake
connector), as tests/unit/serve/test_serve_checks.py does for the check itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from gpuserve.measure.results import Served, read_results, record_spec
from gpuserve.paths import PROJECT_ROOT
from gpuserve.roles.checks.smoke import smoke_completion
from gpuserve.serve.checks import DEFAULTS, results_root
from tests.unit.conftest import run_fake_op

SECRET = "hf_Sup3rSecretToken"


def run(responses: dict, execute: bool = True, **kwargs):
    if execute:
        return run_fake_op(smoke_completion, responses, **kwargs)
    inv = Inventory((["@fake"], {"fake_responses": responses, "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    meta = next(iter(add_op(state, smoke_completion, **kwargs).values()))
    return meta, [str(c) for c in next(iter(inv)).connector.executed_commands]


def smoke_doc(status=200, tokens=64, elapsed=1.9):
    return json.dumps({"endpoint": "/v1/completions", "status": status, "elapsed_s": elapsed,
                       "body": {"choices": [{"text": " Paris"}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}})


def spec(results_dir):
    return record_spec(str(results_dir), "inventory/gpu.py",
                       Served(profile="glm5-nvfp4-tp8", sglang_version="0.5.23",
                              model="/models/GLM-5-NVFP4", served_name="glm-5"),
                       args=["--model-path", "/models/GLM-5-NVFP4", "--tp-size", "8"],
                       env={"NCCL_P2P_DISABLE": "1", "HF_TOKEN": SECRET})


def smoke_args(results_dir):
    return dict(port=30000, model="glm-5", profile="glm5-nvfp4-tp8",
                script="/opt/gpuserve/bin/sglang_smoke.py",
                config="/etc/gpuserve/sglang-secrets.yaml", record=spec(results_dir))


def test_passing_smoke_is_recorded_and_still_no_change(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run({"sglang_smoke.py": smoke_doc()}, **smoke_args(tmp_path))
    assert meta.did_succeed() and not meta.did_change()
    assert len(cmds) == 1 and "sglang_smoke.py" in cmds[0], "only the smoke fact ran"
    [path] = (tmp_path / "@fake").iterdir()
    assert path.name.endswith("-smoke-glm5-nvfp4-tp8.json")
    assert f"@fake: smoke: recorded {path}" in caplog.text
    [rec] = read_results(tmp_path)
    assert (rec.kind, rec.host, rec.profile, rec.sglang_version, rec.served_name) == (
        "smoke", "@fake", "glm5-nvfp4-tp8", "0.5.23", "glm-5")
    assert rec.figures == {"tokens": 64, "seconds": 1.9, "tok_s": 33.684}
    assert rec.launch_hash.startswith("sha256:")
    text = path.read_text()
    assert SECRET not in text and "sglang-secrets" not in text


def test_each_rerun_adds_a_record_and_none_is_a_change(tmp_path: Path) -> None:
    for _ in range(2):
        meta, _ = run({"sglang_smoke.py": smoke_doc()}, **smoke_args(tmp_path))
        assert meta.did_succeed() and not meta.did_change()
    assert len(list((tmp_path / "@fake").iterdir())) == 2


def test_failed_smoke_records_nothing(tmp_path: Path) -> None:
    meta, _ = run({"sglang_smoke.py": smoke_doc(status=401)}, **smoke_args(tmp_path))
    assert not meta.did_succeed()
    assert not (tmp_path / "@fake").exists()


def test_prepare_time_records_nothing(tmp_path: Path) -> None:
    run({"sglang_smoke.py": smoke_doc()}, execute=False, **smoke_args(tmp_path))
    assert not any(tmp_path.iterdir())


def test_unwritable_results_dir_warns_but_the_check_passes(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("a file where the directory should be")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run({"sglang_smoke.py": smoke_doc()}, **smoke_args(blocker))
    assert meta.did_succeed() and not meta.did_change()
    assert "@fake: smoke: result not recorded" in caplog.text


def test_recording_off_and_default_location(tmp_path: Path) -> None:
    assert record_spec("", "inventory/gpu.py", Served("p", "0.5.23", "m", "m"), args=[],
                       env={}) is None
    assert DEFAULTS["results_dir"] == "results"
    assert results_root("results") == PROJECT_ROOT / "results"
    assert (PROJECT_ROOT / "pyproject.toml").is_file()  # a checkout: the repository root
    assert results_root(str(tmp_path)) == tmp_path


START = "4f6e0c2b9d5a4e7f8a1b3c5d7e9f0a12"  # a systemd InvocationID


def gate_then_smoke(results_dir: Path, probe_second_line: str, responses: dict | None = None):
    """The health gate (asking for the smoke unless the newest record's start still
    runs, as roles/checks.check_service does) and the smoke check, in one pyinfra run."""
    from gpuserve.roles.checks.gate import wait_healthy
    from gpuserve.roles.checks.smoke import SmokeRequest, smoked_start

    probe = json.dumps({"health": 200, "unit": {"ActiveState": "active",
                                                "SubState": "running", "NRestarts": "0"},
                        "lines": [], "tail": []})
    inv = Inventory((["@fake"], {"fake_responses": {
        "sglang_probe.py": probe + "\n" + probe_second_line, **(responses or {})},
        "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    args = smoke_args(results_dir)
    unless = smoked_start(str(results_dir), "@fake")
    request = SmokeRequest(port=30000, model="glm-5", config=args["config"],
                           unless_start=unless)
    add_op(state, wait_healthy, unit="u.service", port=30000,
           script="/opt/gpuserve/bin/sglang_probe.py", timeout=5, smoke=request)
    meta = next(iter(add_op(state, smoke_completion, unless_start=unless, **args).values()))
    with contextlib.suppress(PyinfraError):
        run_ops(state)
    cmds = [str(c) for c in next(iter(inv)).connector.executed_commands]
    return meta, cmds


def smoke_of_start(start: str, elapsed: float = 1.6) -> str:
    return json.dumps({**json.loads(smoke_doc(elapsed=elapsed)), "start": start})


def test_one_smoke_per_server_start_and_the_rerun_names_it(tmp_path: Path, caplog) -> None:
    """The first smoke of a start is recorded with that start; a rerun that finds the
    same start running asks for no completion, records nothing and names the record;
    a new start (a restart, a reboot) is smoked and recorded again."""
    meta, cmds = gate_then_smoke(tmp_path, smoke_of_start(START))
    assert meta.did_succeed() and "--smoke-unless-start" not in " ".join(cmds)
    [first] = read_results(tmp_path)
    assert first.server_start == START and first.figures["tok_s"] == 40.0

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = gate_then_smoke(tmp_path, json.dumps({"same_start": START}))
    assert meta.did_succeed() and not meta.did_change()
    assert any(f"--smoke-unless-start {START}" in c for c in cmds)
    assert not any("sglang_smoke.py" in c for c in cmds)
    assert len(read_results(tmp_path)) == 1
    [path] = (tmp_path / "@fake").iterdir()
    assert (f"@fake: smoke: none made, the server has run since its smoke of "
            f"{first.timestamp} (40.0 tok/s, {path}) and its /health generated a "
            "token now") in caplog.text

    other = "0" * 31 + "1"
    meta, cmds = gate_then_smoke(tmp_path, smoke_of_start(other, elapsed=2.0))
    assert meta.did_succeed()
    assert sorted(r.server_start for r in read_results(tmp_path)) == sorted([START, other])


def test_a_same_start_answer_for_another_start_is_no_proof(tmp_path: Path, caplog) -> None:
    """The host answers "same start" for a start the controller did not name: that is
    not a smoke result, and the check fails rather than pass unproven."""
    gate_then_smoke(tmp_path, smoke_of_start(START))
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = gate_then_smoke(tmp_path, json.dumps({"same_start": "1" * 32}))
    assert not meta.did_succeed()
    assert "[@fake] smoke: unreadable smoke output" in caplog.text


def test_a_smoke_line_without_a_valid_start_records_none(tmp_path: Path) -> None:
    """Anything the host sends is input: a start that is not an InvocationID is dropped,
    and the next rerun smokes again rather than trust it."""
    from gpuserve.roles.checks.smoke import smoked_start

    gate_then_smoke(tmp_path, smoke_of_start("../../etc\nx"))
    [rec] = read_results(tmp_path)
    assert rec.server_start is None and smoked_start(str(tmp_path), "@fake") == ""


def test_the_newest_unreadable_record_means_smoke_again(tmp_path: Path) -> None:
    from gpuserve.measure.results import newest_smoke

    gate_then_smoke(tmp_path, smoke_of_start(START))
    assert newest_smoke(tmp_path, "@fake").server_start == START
    (tmp_path / "@fake" / "29991231T000000Z-smoke-glm5-nvfp4-tp8.json").write_text("{")
    assert newest_smoke(tmp_path, "@fake") is None
    assert newest_smoke(tmp_path, "other-host") is None
