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

from gpuserve.measure.results import read_results, record_spec
from gpuserve.paths import PROJECT_ROOT
from gpuserve.roles.checks import DEFAULTS, results_root, smoke_completion

SECRET = "hf_Sup3rSecretToken"


def run(responses: dict, execute: bool = True, **kwargs):
    inv = Inventory((["@fake"], {"fake_responses": responses, "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    meta = next(iter(add_op(state, smoke_completion, **kwargs).values()))
    if execute:
        with contextlib.suppress(PyinfraError):
            run_ops(state)
    host = next(iter(inv))
    return meta, [str(c) for c in host.connector.executed_commands]


def smoke_doc(status=200, tokens=64, elapsed=1.9):
    return json.dumps({"endpoint": "/v1/completions", "status": status, "elapsed_s": elapsed,
                       "body": {"choices": [{"text": " Paris"}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}})


def spec(results_dir):
    return record_spec(str(results_dir), "inventory/gpu.py", profile="glm5-nvfp4-tp8",
                       args=["--model-path", "/models/GLM-5-NVFP4", "--tp-size", "8"],
                       env={"NCCL_P2P_DISABLE": "1", "HF_TOKEN": SECRET},
                       sglang_version="0.5.23", model="/models/GLM-5-NVFP4",
                       served_name="glm-5")


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
    assert record_spec("", "inventory/gpu.py", profile="p", args=[], env={},
                       sglang_version="0.5.23", model="m", served_name="m") is None
    assert DEFAULTS["results_dir"] == "results"
    assert results_root("results") == PROJECT_ROOT / "results"
    assert (PROJECT_ROOT / "pyproject.toml").is_file()  # a checkout: the repository root
    assert results_root(str(tmp_path)) == tmp_path
