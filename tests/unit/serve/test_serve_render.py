"""Serve deploy: the exact unit, EnvironmentFile and --config bytes, and their quoting."""

from __future__ import annotations

import shlex

import pytest
from systemd_words import env_value, server_argv, split_variable

from gpuserve.errors import GpuserveError, InputError
from gpuserve.serve.render import (
    ARGS_VAR,
    UnitSpec,
    args_value,
    env_line,
    exec_start,
    render_config,
    render_env_file,
    render_unit,
    systemd_quote,
)
from gpuserve.serve.service import CONFIG_PATH, ENV_PATH
from tests.serve_plans import service_plan_of


def unquote_systemd(text: str) -> list[str]:
    """Split an ExecStart= value the way systemd does for the cases we emit."""
    text = text.replace("\\\n", " ")
    words = shlex.split(text.replace("$$", "$").replace("%%", "%"), posix=True)
    return words


@pytest.mark.parametrize(
    "word",
    ["--model-path", "/models/GLM-5", 'a "quoted" word', "has space", "50%", "$HOME",
     "back\\slash", "{\"decode\": {\"max_bs\": 256}}", ""],
)
def test_systemd_quote_round_trips(word: str) -> None:
    quoted = systemd_quote(word)
    assert unquote_systemd(quoted) == [word]
    # specifiers and variables are always escaped
    assert "%" not in quoted.replace("%%", "")
    assert "$" not in quoted.replace("$$", "")


def test_systemd_quote_refuses_control_characters() -> None:
    # a gpuserve error (one clear line from the CLI and the deploys), not a traceback
    with pytest.raises(GpuserveError, match="contains a control character"):
        systemd_quote("a\nb")


def test_exec_start_one_flag_per_line() -> None:
    argv = ["/v/bin/python", "-m", "sglang.launch_server", "--tp-size", "8",
            "--cuda-graph-bs-decode", "1", "2", "4", "--trust-remote-code",
            "--cuda-graph-config", '{"decode": {"max_bs": 256}}']
    text = exec_start(argv)
    assert text.splitlines()[0] == "/v/bin/python -m sglang.launch_server \\"
    assert "    --cuda-graph-bs-decode 1 2 4 \\" in text.splitlines()
    assert unquote_systemd(text) == argv


TRICKY = ["--model-path", "/models/GLM-5", 'a "quoted" word', "has space", "50%", "$HOME",
          "back\\slash", "{\"decode\": {\"max_bs\": 256}}", "", "it's", "`x`", "ü"]


@pytest.mark.parametrize("word", TRICKY)
def test_args_value_splits_back_into_the_word(word: str) -> None:
    """Through both of systemd's parsers: the EnvironmentFile, then $VAR's splitting."""
    env = render_env_file([], "p", ["--x", word, "--y"])
    assert split_variable(env_value(env, ARGS_VAR)) == ["--x", word, "--y"]


def test_no_env_file_line_ends_in_a_backslash() -> None:
    """systemd before v254 joins a comment line ending in \\ with the next line."""
    env = render_env_file([env_line("A", "x\\", "p.yaml", "env")], "p", ["--x", "back\\"])
    assert not [line for line in env.splitlines() if line.endswith("\\")], env


def test_args_value_refuses_control_characters() -> None:
    with pytest.raises(GpuserveError, match="contains a control character"):
        args_value(["a\nb"])


def test_the_server_runs_the_launcher_then_the_profile_arguments() -> None:
    unit = render_unit(spec())
    env = render_env_file([("NCCL_DEBUG", "WARN")], "p", TRICKY)
    assert server_argv(unit, env) == ["/opt/gpuserve/venv/bin/python", "-m",
                                      "sglang.launch_server", *TRICKY]
    # the unit names no profile and no argument: a switch of profile leaves it as it is
    assert "--model-path" not in unit and "Profile: p" not in unit
    assert render_unit(spec()) == unit


def spec(**kw) -> UnitSpec:
    base = dict(user="sglang", group="sglang", state_dir="/opt/gpuserve/cache",
                env_file=ENV_PATH, launcher=["/opt/gpuserve/venv/bin/python", "-m",
                                             "sglang.launch_server"],
                sglang_version="0.5.23", model_path="/models/x")
    base.update(kw)
    return UnitSpec(**base)


def directives(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    joined = unit.replace("\\\n", " ")
    for line in joined.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_unit_is_hardened_and_runs_the_venv_python() -> None:
    d = directives(render_unit(spec()))
    assert d["User"] == ["sglang"] and d["Group"] == ["sglang"]
    assert d["ExecStart"][0].split()[:3] == ["/opt/gpuserve/venv/bin/python", "-m",
                                             "sglang.launch_server"]
    # host NCCL env first (optional), then the profile env, which wins
    assert d["EnvironmentFile"] == ["-/etc/gpuserve/nccl.env", ENV_PATH]
    assert d["Restart"] == ["on-failure"]
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("ReadWritePaths", "/opt/gpuserve/cache"), ("WorkingDirectory", "/"),
                       ("UMask", "0077"), ("CapabilityBoundingSet", ""),
                       ("DevicePolicy", "closed")]:
        assert d[key] == [value], key
    # the writable state dir is HOME, never the working directory `python -m` imports from
    assert "HOME=/opt/gpuserve/cache" in d["Environment"]
    assert "PYTHONSAFEPATH=1" in d["Environment"]
    assert int(d["LimitNOFILE"][0]) >= 65536
    assert d["TimeoutStartSec"][0].endswith("min") and int(d["TimeoutStartSec"][0][:-3]) >= 10
    assert int(d["StartLimitBurst"][0]) >= 1


def test_model_under_home_keeps_home_readable() -> None:
    d = directives(render_unit(spec(model_path="/home/ml/models/x")))
    assert d["ProtectHome"] == ["read-only"]


def test_env_line_quoting_and_validation() -> None:
    assert env_line("NCCL_P2P_DISABLE", "1", "p.yaml", "env") == ("NCCL_P2P_DISABLE", "1")
    assert env_line("X", 'a "b" $c\\', "p.yaml", "env") == ("X", '"a \\"b\\" \\$c\\\\"')
    for key, value in [("1BAD", "x"), ("A-B", "x"), ("OK", "two\nlines"), ("OK", ["x"]),
                       ("OK", True)]:
        with pytest.raises(InputError) as e:
            env_line(key, value, "inv.py", "sglang_extra_env")
        assert e.value.file == "inv.py" and e.value.field.startswith("sglang_extra_env.")


def test_config_is_yaml_with_json_string() -> None:
    text = render_config({"api-key": 'k"ey\\'})
    line = [x for x in text.splitlines() if x.startswith("api-key:")][0]
    import json

    assert json.loads(line.split(":", 1)[1]) == 'k"ey\\'


def plan(**kw):
    base = dict(args=["--model-path", "/models/x", "--port", "30000"],
                env={"NCCL_DEBUG": "WARN"}, venv="/opt/gpuserve/venv", user="sglang",
                state_dir="/opt/gpuserve/cache", bin_dir="/opt/gpuserve/bin", profile_name="p",
                profile_source="profiles/p.yaml", sglang_version="0.5.23",
                model_path="/models/x", port=30000, served_name="x", extra_env={},
                hf_token=None, api_key=None, data_source="inventory/gpu.py")
    base.update(kw)
    return service_plan_of(**base)


SECRET_TOKEN = "hf_Sup3rSecretToken"
SECRET_KEY = "sk-very-secret-key"


def test_secrets_stay_out_of_the_unit() -> None:
    p = plan(hf_token=SECRET_TOKEN, api_key=SECRET_KEY, extra_env={"A": "1"})
    assert SECRET_TOKEN not in p.unit_text and SECRET_KEY not in p.unit_text
    assert SECRET_TOKEN not in env_value(p.env_text, ARGS_VAR)
    assert f"HF_TOKEN={SECRET_TOKEN}" in p.env_text.splitlines()
    assert SECRET_KEY not in p.env_text
    assert SECRET_KEY in p.config_text
    exec_words = server_argv(p.unit_text, p.env_text)
    assert exec_words[-2:] == ["--config", CONFIG_PATH]
    # the server runs under the redacting wrapper, which reads the same secrets file
    assert exec_words[:5] == ["/opt/gpuserve/venv/bin/python", "/opt/gpuserve/bin/sglang_redact.py",
                              CONFIG_PATH, "--", "/opt/gpuserve/venv/bin/python"]
    assert exec_words[5:7] == ["-m", "sglang.launch_server"]
    assert "NCCL_DEBUG=WARN" in p.env_text and "A=1" in p.env_text


def test_no_api_key_means_no_config_flag() -> None:
    p = plan()
    assert p.config_text is None and "--config" not in server_argv(p.unit_text, p.env_text)
    assert "sglang_redact.py" not in p.unit_text  # no secret, nothing to redact


def test_extra_env_overrides_profile_env() -> None:
    p = plan(extra_env={"NCCL_DEBUG": "INFO"})
    assert "NCCL_DEBUG=INFO" in p.env_text and "NCCL_DEBUG=WARN" not in p.env_text


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"args": ["--api-key", "x"]}, "extra_args"),
        ({"extra_env": ["A=1"]}, "sglang_extra_env"),
        ({"hf_token": 123}, "hf_token"),
        ({"api_key": ""}, "sglang_api_key"),
        ({"api_key": "a\nb"}, "sglang_api_key"),
    ],
)
def test_bad_service_input_names_the_field(kw: dict, field: str) -> None:
    with pytest.raises(InputError) as e:
        plan(**kw)
    assert e.value.field == field


def test_non_string_secret_names_its_type_but_never_its_value() -> None:
    with pytest.raises(InputError) as e:
        plan(api_key=918273645)
    assert e.value.field == "sglang_api_key" and "int" in e.value.message
    assert "918273645" not in str(e.value)
