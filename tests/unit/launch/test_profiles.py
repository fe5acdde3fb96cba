"""Profiles: loading, extends, and errors that name file, line and dotted field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.profiles import (
    PROFILES_DIR,
    SECTIONS,
    TOP_LEVEL,
    list_profiles,
    load_profile,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


def load(name: str):
    return load_profile(FIXTURES / f"{name}.yaml")


def error_of(name: str) -> InputError:
    with pytest.raises(InputError) as info:
        load(name)
    return info.value


def where(exc: InputError) -> tuple[str, int | None, str | None]:
    return Path(exc.file).name, exc.line, exc.field


# ---------------------------------------------------------------- shipped profiles


def test_shipped_profiles_exist_and_load():
    names = list_profiles()
    for expected in ("glm5-nvfp4-tp8", "glm5-nvfp4-tp8-ep8", "glm5-nvfp4-tp8-eagle3",
                     "deepseek-v3-fp8-h200-tp8", "deepseek-v3-fp8-h200-tp8-dpattn",
                     "qwen3-235b-a22b-fp8-h200-tp8"):
        assert expected in names
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        assert profile.model.path
        assert profile.sglang_versions, f"{name} should say which SGLang versions it targets"


def test_every_shipped_profile_brings_its_weights_or_says_it_needs_them_local():
    """The server runs offline: a shipped profile pins a Hub commit (the file that pins
    it names where the commit comes from, next to it) or names an absolute directory
    and says the checkpoint must be put there."""
    for path in [*PROFILES_DIR.glob("*.yaml"), *PROFILES_DIR.glob("base/*.yaml")]:
        profile = load_profile(path)
        if profile.model.hf:
            source = profile.model.source
            assert source is not None and source.pinned, path.name
            text = Path(profile.where("model.hf").file).read_text()
            comment = text.split(f"hf: {source.spec}")[0].rsplit("model:", 1)[-1]
            assert source.revision[:8] in comment and "/" in comment, \
                f"{path.name}: say where {source.revision} comes from"
        else:
            assert profile.model.path.startswith("/"), path.name
            text = Path(profile.where("model.path").file).read_text()
            assert "Needs a local checkpoint" in text, path.name


def test_every_shipped_profile_has_a_source_header():
    for path in [*PROFILES_DIR.glob("*.yaml"), *PROFILES_DIR.glob("base/*.yaml")]:
        head = path.read_text().splitlines()[:3]
        assert head and head[0].startswith("#"), f"{path.name} needs a comment header"


def test_reference_baseline_choices():
    """The lab serves glm5-nvfp4-tp8: the field-notes baseline on the no-P2P box."""
    p = load_profile("glm5-nvfp4-tp8")
    assert p.parallel.tp == 8 and p.parallel.ep == 1
    assert p.memory.cuda_graph_max_bs == 128
    assert p.memory.kv_cache_dtype == "fp8_e4m3"
    # no host verdict: the NCCL transport and custom all-reduce come from the host's
    # measured gates (nccl.env, host.json), not from the profile
    assert p.communication.disable_custom_all_reduce is False
    assert p.communication.pcie_ipc_allreduce is False
    assert p.communication.insist is None
    assert "NCCL_P2P_DISABLE" not in p.env
    assert p.attention.dsa_decode_backend == "flashinfer_sparse_mla"
    assert "0.5.23" in p.sglang_versions
    # inherited from the base: the origin names the base file and its line
    origin = p.where("memory.cuda_graph_max_bs")
    assert Path(origin.file).name == "glm5-nvfp4.yaml"
    line = Path(origin.file).read_text().splitlines()[origin.line - 1]
    assert line.strip().startswith("cuda_graph_max_bs:")


def test_ep_profile_raises_static_memory_over_baseline():
    base, ep = load_profile("glm5-nvfp4-tp8"), load_profile("glm5-nvfp4-tp8-ep8")
    assert ep.parallel.ep == 8
    assert ep.memory.mem_fraction_static > base.memory.mem_fraction_static
    assert ep.moe.a2a_backend == "flashinfer"
    assert ep.moe.runner_backend == "flashinfer_cutlass"


def test_documented_keys_exist_in_schema():
    """Every `section.key` in the architecture table is a real field (docs cannot drift)."""
    import dataclasses

    text = DOCS.read_text()
    table = text[text.index("## Profiles"):text.index("## Host facts")]
    documented = set()
    for cell in re.findall(r"^\| (`[^|]+`)", table, flags=re.M):
        keys = re.findall(r"`([a-z0-9_.]+)`", cell)
        section = None
        for key in keys:
            if "." in key:
                section, name = key.split(".", 1)
            elif section:
                name = key
            else:
                documented.add(key)
                continue
            documented.add(f"{section}.{name}")
    assert "memory.cuda_graph_max_bs" in documented
    for key in documented:
        if "." in key:
            section, name = key.split(".", 1)
            assert section in SECTIONS, key
            assert name in {f.name for f in dataclasses.fields(SECTIONS[section])}, key
        else:
            assert key in TOP_LEVEL, key


# ---------------------------------------------------------------- errors name file:line field


@pytest.mark.parametrize(
    ("fixture", "line", "field", "words"),
    [
        ("unknown-key", 5, "memory.cuda_graph_maxbs", "unknown key"),
        ("unknown-top", 3, "paralel", "unknown key"),
        ("wrong-type", 4, "parallel.tp", "must be an integer"),
        ("ep-not-dividing", 5, "parallel.ep", "must divide tp=8"),
        ("attn-dp-too-large", 5, "parallel.attention_dp", "exceeds tp=4"),
        ("attn-dp-not-dividing", 5, "parallel.attention_dp", "must divide tp=8"),
        ("mfs-one", 4, "memory.mem_fraction_static", "(0, 1)"),
        ("mfs-zero", 4, "memory.mem_fraction_static", "(0, 1)"),
        ("spec-no-algorithm", 4, "speculative.num_steps", "speculative.algorithm"),
        ("spec-partial", 5, "speculative.num_steps", "eagle_topk"),
        ("extra-secret", 4, "extra_args[0]", "secret"),
        ("env-secret", 5, "env.HF_TOKEN", "secret"),
        ("env-bool", 4, "env.NCCL_P2P_DISABLE", "quote"),
        ("duplicate-key", 5, "parallel.tp", "duplicate"),
        ("bad-yaml", 4, None, "invalid YAML"),
        ("bad-version", 1, "sglang_versions[1]", "no flag catalog"),
        ("bad-arch", 3, "model.arch", "no model record"),
        ("extends-missing", 3, "extends", "no such file"),
    ],
)
def test_errors_name_file_line_and_field(fixture, line, field, words):
    exc = error_of(fixture)
    assert where(exc) == (f"{fixture}.yaml", line, field)
    assert words in exc.message
    assert str(exc).startswith(f"{exc.file}:{line}: ")


def test_missing_model_path_names_the_model_section():
    exc = error_of("missing-path")
    assert where(exc) == ("missing-path.yaml", 2, "model.path")
    assert "required" in exc.message


def test_unknown_extra_args_flag_is_refused_with_its_line():
    exc = error_of("extra-bogus")
    assert where(exc) == ("extra-bogus.yaml", 5, "extra_args[1]")
    assert "--bogus-flag" in exc.message


def test_removed_flag_in_extra_args_is_refused_for_the_version_targeted():
    # --cuda-graph-max-bs is ambiguous (-decode / -prefill) in 0.5.23
    exc = error_of("extra-unknown")
    assert where(exc) == ("extra-unknown.yaml", 6, "extra_args[1]")
    assert "0.5.23" in exc.message and "ambiguous" in exc.message


def test_bad_choice_in_extra_args():
    exc = error_of("extra-bad-choice")
    assert exc.field == "extra_args[0]"  # the flag whose value was refused
    assert "nccl" in exc.message


def test_env_name_that_no_environment_file_can_carry_is_refused(tmp_path):
    path = tmp_path / "env-name.yaml"
    path.write_text("model:\n  path: /m\nenv:\n  NCCL_DEBUG: WARN\n  BAD NAME: '1'\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert where(info.value) == ("env-name.yaml", 5, "env.BAD NAME")
    assert "environment variable name" in info.value.message


def test_non_utf8_profile_is_an_input_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfemodel: {}\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert info.value.file == str(path) and "not UTF-8" in info.value.message


def test_auto_mem_fraction_is_none():
    assert load("mfs-auto").memory.mem_fraction_static is None


# ---------------------------------------------------------------- extends


def test_extends_deep_merges_and_null_resets():
    p = load("child-merge")
    assert p.parallel.tp == 8  # from parent
    assert p.parallel.ep == 4  # child wins
    assert p.memory.mem_fraction_static == 0.85  # sibling key kept by deep merge
    assert p.memory.cuda_graph_max_bs is None  # null removes the parent's value
    assert p.env == {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1"}
    assert p.extra_args == ["--enable-metrics"]
    assert p.name == "child-merge"
    assert Path(p.where("parallel.ep").file).name == "child-merge.yaml"
    assert Path(p.where("parallel.tp").file).name == "parent-ok.yaml"
    assert not p.is_set("memory.cuda_graph_max_bs")


def test_error_in_parent_names_the_parent_file():
    exc = error_of("child-of-bad")
    assert where(exc) == ("parent-bad.yaml", 5, "memory.mem_fraction_static")


def test_cross_field_error_names_the_child_that_broke_it():
    exc = error_of("child-breaks-parent")
    # ep 8 (parent) no longer divides tp 6 (child): reported at the ep line of the parent
    assert exc.field == "parallel.ep"
    assert Path(exc.file).name == "parent-ok.yaml"
    assert "tp=6" in exc.message


def test_extends_cycle_is_detected():
    exc = error_of("cycle-a")
    assert exc.field == "extends"
    assert "cycle" in exc.message
    assert "cycle-a.yaml" in exc.message and "cycle-b.yaml" in exc.message


def test_unknown_profile_name_lists_known_ones():
    with pytest.raises(InputError) as info:
        load_profile("no-such-profile")
    assert "glm5-nvfp4-tp8" in info.value.message


# ---------------------------------------------------------------- host verdicts


def _write(tmp_path, body: str) -> Path:
    path = tmp_path / "verdict.yaml"
    path.write_text("model:\n  path: /m\nparallel:\n  tp: 8\n" + body)
    return path


@pytest.mark.parametrize("body, line, field", [
    ("communication:\n  disable_custom_all_reduce: true\n", 6,
     "communication.disable_custom_all_reduce"),
    ("env:\n  NCCL_P2P_DISABLE: '1'\n", 6, "env.NCCL_P2P_DISABLE"),
    ("env:\n  NCCL_DEBUG: WARN\n  NCCL_SHM_DISABLE: '1'\n", 7, "env.NCCL_SHM_DISABLE"),
    ("env:\n  NCCL_P2P_LEVEL: SYS\n", 6, "env.NCCL_P2P_LEVEL"),
])
def test_a_host_verdict_in_a_profile_needs_a_reason(tmp_path, body, line, field):
    """The transport is the host's measured choice: a profile overriding it says why."""
    with pytest.raises(InputError) as info:
        load_profile(_write(tmp_path, body))
    assert where(info.value) == ("verdict.yaml", line, field)
    assert "host's verdict" in info.value.message and "communication.insist" in \
        info.value.message
    insisted = body + ("communication:\n" if "communication" not in body else "") + \
        "  insist: custom all-reduce corrupts this model's outputs at tp 8 (a bug report)\n"
    p = load_profile(_write(tmp_path, insisted))
    assert p.communication.insist.startswith("custom all-reduce corrupts")


@pytest.mark.parametrize("body, message", [
    ("communication:\n  insist: because\n", "overrides nothing"),
    ("communication:\n  disable_custom_all_reduce: true\n  insist: ' '\n", "one line"),
])
def test_insist_must_say_why_and_override_something(tmp_path, body, message):
    with pytest.raises(InputError) as info:
        load_profile(_write(tmp_path, body))
    assert info.value.field == "communication.insist" and message in info.value.message


def test_no_shipped_profile_carries_a_host_verdict():
    """NCCL's transport and custom all-reduce come from the host's measured gates."""
    for name in list_profiles():
        p = load_profile(name)
        assert p.communication.disable_custom_all_reduce is False, name
        assert not {"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE"} & set(p.env), name
