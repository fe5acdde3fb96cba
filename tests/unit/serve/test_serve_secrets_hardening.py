"""Secrets: regression tests for each leak a hostile review found.

- an API key through an abbreviated flag (``--api-k``) reached the unit and the journal;
- secrets shorter than a few characters were never redacted;
- credentials in ``pip_index_url`` / ``pip_find_links`` sat on the pip command line.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from gpuserve.commands import render
from gpuserve.errors import InputError
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.launch.locks import available_locks
from gpuserve.measure.results import ResultRecord
from gpuserve.redact import REDACTED
from gpuserve.roles.base.managed import write_secret_command
from gpuserve.roles.sglang import locked_venv
from gpuserve.serve.install import (
    PIP_CONFIG,
    pip_args,
    pip_config_text,
    strip_credentials,
    validate_pip_url,
)
from gpuserve.serve.secret import MIN_SECRET_LENGTH, validate_secret
from tests.serve_plans import plan_of, service_plan_of

REPO = Path(__file__).resolve().parents[3]
REDACT = REPO / "gpuserve" / "data" / "scripts" / "sglang_redact.py"
KEY = "sk-hardening-0123456789"
TOKEN = "hf_HardeningToken0123456789"
PASSWORD = "pa55-w0rd-never-on-argv"


def plan(**kw):
    base = dict(args=["--model-path", "/models/x"], env={}, venv="/opt/gpuserve/venv",
                user="sglang", state_dir="/opt/gpuserve/cache", bin_dir="/opt/gpuserve/bin",
                profile_name="p", profile_source="profiles/p.yaml", sglang_version="0.5.23",
                model_path="/models/x", port=30000, served_name="x", extra_env={},
                hf_token=None, api_key=None, data_source="inventory/gpu.py")
    base.update(kw)
    return service_plan_of(**base)


# ------------------------------------------------------------ abbreviated secret flags


@pytest.mark.parametrize("args", [["--api-k", KEY], ["--api-ke=" + KEY],
                                  ["--admin-api-k", KEY], ["--ssl-keyfile-passw", KEY]])
def test_service_plan_refuses_a_secret_flag_in_any_spelling(args) -> None:
    with pytest.raises(InputError) as info:
        plan(args=["--model-path", "/models/x", *args])
    assert info.value.field == "extra_args" and info.value.file == "profiles/p.yaml"
    assert KEY not in str(info.value)


def test_service_plan_keeps_token_named_settings() -> None:
    p = plan(args=["--model-path", "/m", "--max-total-tokens", "4096", "--tokenizer-path", "/x"])
    assert "--max-total-tokens 4096" in p.env_text and "--tokenizer-path /x" in p.env_text


def test_render_command_masks_a_secret_that_reached_the_argv(monkeypatch, capsys) -> None:
    # load_profile refuses it; the command still never prints one (defence in depth)
    from gpuserve.launch.dialect import Launch

    fake = Launch(version="0.5.23", args=["--model-path", "/m", "--api-k", KEY],
                  env={"HF_TOKEN": TOKEN, "SGLANG_MAX_TOKENS": "8"}, by_field={})
    monkeypatch.setattr(render, "load_profile",
                        lambda name: Namespace(name="p", source="p.yaml"))
    monkeypatch.setattr(render, "render_launch", lambda profile, version: fake)
    assert render.run(Namespace(profile="p", sglang_version="0.5.23")) == 0
    out = capsys.readouterr().out
    assert KEY not in out and TOKEN not in out
    assert "--api-k '<redacted>'" in out and "SGLANG_MAX_TOKENS=8" in out


# ------------------------------------------------------------ short secrets


@pytest.mark.parametrize(("key", "value"), [
    ("sglang_api_key", "abc"), ("sglang_api_key", "x" * (MIN_SECRET_LENGTH - 1)),
    ("hf_token", "hf_short"), ("hf_token", "not-an-hf-token-at-all"),
    ("hf_token", "hf_has spaces_inside_0123"),
])
def test_short_or_malformed_secrets_are_refused_without_the_value(key, value) -> None:
    with pytest.raises(InputError) as info:
        validate_secret(value, key, "inventory/gpu.py")
    exc = info.value
    assert exc.file == "inventory/gpu.py" and exc.field == key
    assert value not in str(exc) and str(len(value)) not in exc.message.replace("16", "")
    assert "16" in exc.message or "control" in exc.message


def test_three_character_api_key_is_refused_by_the_service_plan() -> None:
    with pytest.raises(InputError) as info:
        plan(api_key="k3y")
    assert info.value.field == "sglang_api_key" and "at least 16" in info.value.message
    assert "k3y" not in str(info.value)


def test_real_looking_secrets_pass() -> None:
    p = plan(api_key=KEY, hf_token=TOKEN)
    assert KEY not in p.unit_text and TOKEN not in p.unit_text
    # the token is an env value for the server; the key only in the --config file
    assert KEY not in p.env_text and f"HF_TOKEN={TOKEN}" in p.env_text.splitlines()


def run_redactor(tmp_path: Path, key: str, child: str, env: dict | None = None) -> str:
    cfg = tmp_path / "sglang-secrets.yaml"
    cfg.write_text(f"api-key: {json.dumps(key)}\n")
    proc = subprocess.run([sys.executable, str(REDACT), str(cfg), "--", sys.executable, "-c",
                           child], capture_output=True, timeout=60,
                          env={"PATH": os.environ["PATH"], **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode()


def test_wrapper_redacts_a_sixteen_character_key_and_a_token(tmp_path) -> None:
    line = f"server_args=ServerArgs(api_key={KEY!r}, hf={TOKEN!r})"
    out = run_redactor(tmp_path, KEY, f"print({line!r})", env={"HF_TOKEN": TOKEN})
    assert KEY not in out and TOKEN not in out and out.count(REDACTED) == 2


def test_wrapper_redacts_a_secret_of_any_length(tmp_path) -> None:
    # the deploy refuses short keys, but a hand-written secrets file is still redacted
    out = run_redactor(tmp_path, "Q7z", "print(\"api_key='Q7z' ok\")")
    assert "Q7z" not in out and f"api_key='{REDACTED}' ok" in out


def test_records_redact_short_secrets_everywhere() -> None:
    record = ResultRecord(kind="smoke", profile="p", figures={"tokens": 1},
                          context={"argv": ["--model-path", "/m", "--api-k", "zq9"],
                                   "env": {"HF_TOKEN": "hq"}}, note="saw zq9 and hq")
    text = json.dumps(record.to_dict())
    assert "zq9" not in text and "hq" not in text and "--api-k" not in text


# ------------------------------------------------------------ pip mirror credentials

INDEX = f"https://ci-user:{PASSWORD}@mirror.example/simple"
LINKS = f"https://ci-user:{PASSWORD}@mirror.example/wheels/"


def test_credentials_never_in_pip_args_and_only_in_the_config_file() -> None:
    args = pip_args(INDEX, None)
    assert PASSWORD not in " ".join(args) and "--index-url" not in args
    assert pip_args(None, LINKS) == ["--no-index"]
    text = pip_config_text(INDEX, LINKS)
    assert text == f"[global]\nindex-url = {INDEX}\nfind-links = {LINKS}\n"
    assert pip_config_text("https://m/simple", None) is None
    assert strip_credentials(INDEX) == "https://mirror.example/simple"


@pytest.mark.parametrize("field", ["pip_index_url", "pip_find_links"])
def test_credentials_over_plain_http_are_refused_naming_the_field(field) -> None:
    url = f"http://u:{PASSWORD}@10.0.2.2:8000/simple"
    with pytest.raises(InputError) as info:
        validate_pip_url(url, field, "inventory/gpu.py")
    assert info.value.field == field and "https" in info.value.message
    assert PASSWORD not in str(info.value)
    # and by the serve plan, before the profile, the lock or the host are looked at
    with pytest.raises(InputError) as info:
        plan_of({"profile": "glm5-nvfp4-tp8", field: url}, "inventory/gpu.py",
                   lambda home: HostRuntime(name="h", python="3.11.2", glibc="2.36",
                                            driver="580.126.20", cuda_toolkit="13.0",
                                            free_bytes=10**12, gpus=8))
    assert info.value.field == field and PASSWORD not in str(info.value)


def test_plain_http_mirror_is_trusted_only_when_marked() -> None:
    assert pip_args(None, "http://10.0.2.2:8000/wheels/",
                    trusted=("http://10.0.2.2:8000/",))[-2:] == ["--trusted-host", "10.0.2.2"]
    with pytest.raises(InputError, match="trusted_mirrors"):
        pip_args(None, "http://10.0.2.2:8000/wheels/")


LOCK = next(lk for lk in available_locks() if lk.name == "sglang-0.5.23-cu13-py311")
VENV = f"/opt/gpuserve/venvs/0.5.23-{LOCK.hash}"


def test_no_command_of_the_install_holds_the_password(caplog) -> None:
    text = pip_config_text(INDEX, None)

    def pip_credentials() -> str:
        return text

    # the detached install's status (roles/base/progress.py): done
    inv = Inventory((["@fake"], {"fake_responses": {".gpuserve-verified": "",
                                                    "/rc 2>/dev/null": ["0", "##", "##"]},
                                 "fake_delay": 0}))
    state = State(inv, Config())
    connect_all(state)
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        metas = add_op(state, locked_venv, name="venv", venv=VENV, lock=LOCK,
                       requirements="/opt/gpuserve/locks/r.txt",
                       pip_options=pip_args(INDEX, None), pip_config=pip_credentials,
                       pip_config_path=f"/opt/gpuserve/{PIP_CONFIG}")
        with contextlib.suppress(PyinfraError):
            run_ops(state)
    assert next(iter(metas.values())).did_change()
    cmds = [str(c) for c in next(iter(inv)).connector.executed_commands]
    assert cmds and all(PASSWORD not in c for c in cmds)
    assert PASSWORD not in caplog.text
    # the operation's arguments (pyinfra --json prints them) name the function only
    assert all(PASSWORD not in a for meta in state.op_meta.values() for a in meta.args)
    install = next(c for c in cmds if " install " in c)
    # pip (the pinned uv's bootstrap) and uv read the URL from their files, removed at
    # the job's exit whatever its status
    assert f"PIP_CONFIG_FILE=/opt/gpuserve/{PIP_CONFIG}" in install
    assert f"--config-file /opt/gpuserve/{PIP_CONFIG}.uv.toml --no-config" in install
    assert (f"rm -f -- /opt/gpuserve/{PIP_CONFIG} /opt/gpuserve/{PIP_CONFIG}.uv.toml"
            in install and "' EXIT" in install)
    written = [i for i, c in enumerate(cmds) if "umask 077 && cat >" in c]
    assert len(written) == 2 and max(written) < cmds.index(install)


def test_the_config_file_travels_on_stdin() -> None:
    cmd = write_secret_command(f"/opt/gpuserve/{PIP_CONFIG}", pip_config_text(INDEX, None))
    assert PASSWORD not in str(cmd) and PASSWORD in cmd.connector_arguments["_stdin"]
    assert "chmod 600" in str(cmd) and "chown root:root" in str(cmd)


def test_redactor_stays_stdlib_only() -> None:
    # it runs with the host's python3 before any venv exists
    source = io.StringIO(REDACT.read_text()).read()
    assert "import gpuserve" not in source and "from gpuserve" not in source
