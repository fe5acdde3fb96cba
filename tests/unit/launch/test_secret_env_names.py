"""Secret env names: one judge (gpuserve.launch.secrets.is_secret_env_name) for profiles,
``gpuserve render``, the launch hash and result records.

Regression: a profile env key with "TOKEN" anywhere in it
(``SGLANG_MAX_TOKENS_PER_BATCH``) was refused as a secret by a substring match, and the
launch hash and records dropped such settings, so two different launches hashed alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.launch.profiles import load_profile
from gpuserve.launch.secrets import is_secret_env_name
from gpuserve.measure.results import launch_hash, strip_secret_env

SECRET_NAMES = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "TOKEN", "hf_token",
                "OPENAI_API_KEY", "API_KEY", "SGLANG_APIKEY", "MY_API_KEY_FILE",
                "AWS_SECRET_ACCESS_KEY", "CLIENT_SECRET", "SECRETS", "DB_PASSWORD",
                "PGPASSWD", "PGPASSWORD", "SSL_PASSPHRASE", "GCP_CREDENTIALS", "PASSWORD"]
PLAIN_NAMES = ["SGLANG_MAX_TOKENS_PER_BATCH", "SGLANG_MAX_TOKENS_X", "MAX_TOKENS",
               "SGLANG_TOKEN_USAGE_LOG", "TOKENIZERS_PARALLELISM", "HF_TOKEN_PATH",
               "NCCL_DEBUG", "SGLANG_KEY_CACHE", "CUDA_VISIBLE_DEVICES", "TOKENS",
               "SECRETARY_NAME", "NUM_KEYS"]
VALUE = "sk-env-0123456789abcdef"


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_names_of_secrets_are_judged_secret(name: str) -> None:
    assert is_secret_env_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_settings_with_token_inside_are_no_secret(name: str) -> None:
    assert not is_secret_env_name(name)


def write(tmp_path: Path, env: dict[str, str]) -> Path:
    path = tmp_path / "p.yaml"
    lines = "".join(f"  {k}: '{v}'\n" for k, v in env.items())
    path.write_text(f"model:\n  path: /m\nsglang_versions: ['0.5.23']\nenv:\n{lines}")
    return path


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD",
                                  "AWS_SECRET_ACCESS_KEY"])
def test_profile_env_with_a_secret_name_is_refused_without_printing_it(tmp_path,
                                                                     name) -> None:
    path = write(tmp_path, {name: VALUE})
    with pytest.raises(InputError) as err:
        load_profile(path)
    assert err.value.field == f"env.{name}" and err.value.file == str(path)
    assert "secret" in str(err.value) and VALUE not in str(err.value)


def test_profile_env_with_token_settings_is_accepted_and_rendered(tmp_path, capsys) -> None:
    path = write(tmp_path, {"SGLANG_MAX_TOKENS_PER_BATCH": "8192",
                            "SGLANG_TOKEN_USAGE_LOG": "1"})
    profile = load_profile(path)
    assert profile.env["SGLANG_MAX_TOKENS_PER_BATCH"] == "8192"
    assert main(["render", "--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "SGLANG_MAX_TOKENS_PER_BATCH=8192" in out and "SGLANG_TOKEN_USAGE_LOG=1" in out


def test_launch_hash_keeps_token_settings_and_drops_secrets() -> None:
    env = {"SGLANG_MAX_TOKENS_PER_BATCH": "8192", "HF_TOKEN": VALUE}
    assert strip_secret_env(env) == {"SGLANG_MAX_TOKENS_PER_BATCH": "8192"}
    # a setting changes the hash; a secret's value never does
    assert launch_hash([], env) != launch_hash([], {**env, "SGLANG_MAX_TOKENS_PER_BATCH": "1"})
    assert launch_hash([], env) == launch_hash([], {**env, "HF_TOKEN": "hf_other"})
