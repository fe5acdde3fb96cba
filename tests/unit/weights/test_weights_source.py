"""A profile's Hub source (model.hf) and the bad inputs refused at load time: a revision
that is not a commit and not allowed to float, a token in a profile file, both sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.hf_source import parse_source, source_problem
from gpuserve.launch.profiles import load_profile

COMMIT = "c1899de289a04d12100db370d81485cdf75e47ca"
TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"  # shaped like a token, not one


def _profile(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "hf-profile.yaml"
    path.write_text(body)
    return path


def test_pinned_source_loads_with_the_repo_standing_in_for_path(tmp_path):
    p = load_profile(_profile(tmp_path, f"model:\n  hf: Qwen/Qwen3-0.6B@{COMMIT}\n"))
    assert p.model.hf == f"Qwen/Qwen3-0.6B@{COMMIT}"
    assert p.model.source.pinned and p.model.source.revision == COMMIT
    assert p.model.path == "Qwen/Qwen3-0.6B" and p.model.served_name == "Qwen/Qwen3-0.6B"
    hf = p.model.source
    assert hf.revision_dir("/opt/gpuserve/models", COMMIT) == \
        f"/opt/gpuserve/models/Qwen--Qwen3-0.6B/{COMMIT}"


def test_a_branch_is_refused_unless_allowed_naming_file_line_and_field(tmp_path):
    path = _profile(tmp_path, "description: x\nmodel:\n  hf: Qwen/Qwen3-0.6B@main\n")
    with pytest.raises(InputError) as e:
        load_profile(path)
    assert e.value.file == str(path.resolve()) and e.value.field == "model.hf"
    assert e.value.line == 3 and "not a 40-hex commit" in e.value.message
    assert "allow_floating_revision" in e.value.message
    ok = _profile(tmp_path, "model:\n  hf: Qwen/Qwen3-0.6B@main\n"
                            "  allow_floating_revision: true\n")
    src = load_profile(ok).model.source
    assert not src.pinned and src.ref_record("/m") == "/m/Qwen--Qwen3-0.6B/refs/main"


@pytest.mark.parametrize("body, field, words", [
    (f"model:\n  hf: Qwen/Qwen3-0.6B@{COMMIT}\n  token: {TOKEN}\n", "model.token",
     "token in a profile file is refused"),
    (f"model:\n  hf: Qwen/Qwen3-0.6B@{COMMIT}\n  hf_token: {TOKEN}\n", "model.hf_token",
     "host data hf_token"),
    (f"model:\n  path: /models/x\nextra_args: [--revision, {TOKEN}]\n", "extra_args[1]",
     "looks like a Hugging Face token"),
    (f"model:\n  hf: {TOKEN}:x@Qwen/Qwen3-0.6B@{COMMIT}\n", "model.hf",
     "looks like a Hugging Face token"),
])
def test_a_token_in_a_profile_file_is_refused_without_showing_it(tmp_path, body, field,
                                                                 words):
    with pytest.raises(InputError) as e:
        load_profile(_profile(tmp_path, body))
    assert e.value.field == field and words in e.value.message
    assert TOKEN not in str(e.value)


@pytest.mark.parametrize("body, words", [
    (f"model:\n  path: /models/x\n  hf: Qwen/Qwen3-0.6B@{COMMIT}\n", "not both"),
    ("model:\n  hf: Qwen/Qwen3-0.6B\n", "names no revision"),
    (f"model:\n  hf: not-a-repo@{COMMIT}\n", "not a Hub repository id"),
    ("model:\n  hf: Qwen/Qwen3-0.6B@a..b\n  allow_floating_revision: true\n",
     "neither a 40-hex commit"),
])
def test_bad_sources_name_model_hf(tmp_path, body, words):
    with pytest.raises(InputError) as e:
        load_profile(_profile(tmp_path, body))
    assert e.value.field == "model.hf" and words in e.value.message


def test_floating_flag_without_hf_is_refused(tmp_path):
    with pytest.raises(InputError) as e:
        load_profile(_profile(tmp_path, "model:\n  path: /m\n  allow_floating_revision: true\n"))
    assert e.value.field == "model.allow_floating_revision"


def test_parse_source_checks_like_the_profile():
    assert source_problem(f"a/b@{COMMIT}", False) is None
    assert "not a 40-hex commit" in source_problem("a/b@v1.0", False)
    assert parse_source("a/b@v1.0", True).revision == "v1.0"
    with pytest.raises(ValueError):
        parse_source("a/b@v1.0")
