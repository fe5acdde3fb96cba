"""SGLang dialects: every profile renders for each version it targets, spelled right."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.launch import catalog
from gpuserve.launch.dialect import load_dialect, render_launch
from gpuserve.launch.profiles import SECTIONS, list_profiles, load_profile

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"


def fixture(name: str):
    return load_profile(FIXTURES / f"{name}.yaml")


def targets(profile) -> list[str]:
    return profile.sglang_versions or catalog.available_versions()


@pytest.mark.parametrize("name", list_profiles())
def test_every_profile_renders_and_parses_for_each_target(name):
    profile = load_profile(name)
    for version in targets(profile):
        launch = render_launch(profile, version)
        # the catalog's own parser (rebuilt from the real wheel) accepts the full argv
        ns = catalog.load_catalog(version).validate(launch.args, complete=True)
        assert ns.model_path == profile.model.path
        assert ns.tp_size == profile.parallel.tp
        assert "--tp" not in launch.args
        assert launch.args.count("--tp-size") == 1


def test_lab_profile_renders_cleanly_for_0_5_23():
    launch = render_launch(load_profile("glm5-nvfp4-tp8"), "0.5.23")
    ns = catalog.load_catalog("0.5.23").validate(launch.args, complete=True)
    assert ns.cuda_graph_max_bs_decode == 128
    assert ns.kv_cache_dtype == "fp8_e4m3"
    assert ns.disable_custom_all_reduce is False  # the host's host.json adds it
    assert ns.dsa_decode_backend == "flashinfer_sparse_mla"
    assert ns.host == "0.0.0.0"
    assert "NCCL_P2P_DISABLE" not in launch.env  # the host's nccl.env says it
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in launch.env


def test_dialect_covers_exactly_the_profile_fields():
    fields = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert set(load_dialect()) == fields


def test_every_dialect_flag_exists_in_the_catalogs_it_applies_to():
    for version in catalog.available_versions():
        flags = catalog.load_catalog(version)
        for name, rules in load_dialect().items():
            rule = next((r for r in rules if r.applies(version)), None)
            if rule is None or rule.absent or rule.kind in ("env", "none"):
                continue
            assert flags.has_flag(rule.flag), f"{name}: {rule.flag} not in SGLang {version}"
            for extra in rule.also:
                assert flags.has_flag(extra), f"{name}: {extra} not in SGLang {version}"


def test_cuda_graph_max_bs_spelling_per_version():
    p = load_profile("deepseek-v3-fp8-h200-tp8-dpattn")
    old, new = render_launch(p, "0.5.19"), render_launch(p, "0.5.23")
    assert old.value("--cuda-graph-max-bs") == "128"
    assert "--cuda-graph-max-bs-decode" not in old.args
    assert new.value("--cuda-graph-max-bs-decode") == "128"
    assert "--cuda-graph-max-bs" not in new.args
    # and the old spelling is refused by 0.5.23 itself (ambiguous prefix)
    with pytest.raises(InputError, match="ambiguous"):
        catalog.load_catalog("0.5.23").validate(["--cuda-graph-max-bs", "128"])


def test_attention_dp_spelling_per_version():
    p = load_profile("deepseek-v3-fp8-h200-tp8-dpattn")
    old = render_launch(p, "0.5.19")
    assert old.value("--dp-size") == "8" and "--enable-dp-attention" in old.args
    new = render_launch(p, "0.5.23")
    assert new.value("--attn-dp-size") == "8"
    assert "--enable-dp-attention" not in new.args and "--dp-size" not in new.args
    ns = catalog.load_catalog("0.5.23").validate(new.args)
    assert ns.attn_dp_size == 8 and ns.dp_size == 1


def test_dsa_backend_spelling_per_version(tmp_path):
    path = tmp_path / "dsa.yaml"
    path.write_text("sglang_versions: ['0.5.19', '0.5.23']\nmodel:\n  path: /m\n"
                    "attention:\n  dsa_decode_backend: flashinfer_sparse_mla\n")
    p = load_profile(path)
    assert render_launch(p, "0.5.19").value("--nsa-decode-backend") == "flashinfer_sparse_mla"
    assert render_launch(p, "0.5.23").value("--dsa-decode-backend") == "flashinfer_sparse_mla"
    with pytest.raises(InputError):
        catalog.load_catalog("0.5.23").validate(["--nsa-decode-backend", "trtllm"])


def test_nsa_flag_in_extra_args_refused_on_0_5_23():
    with pytest.raises(InputError) as info:
        fixture("nsa-on-new")
    assert info.value.field == "extra_args[0]"
    assert "--nsa-decode-backend" in info.value.message


def test_pcie_ipc_is_an_env_switch_where_the_version_has_it():
    p = fixture("pcie-ipc")
    assert render_launch(p, "0.5.23").env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    with pytest.raises(InputError) as info:
        render_launch(p, "0.5.19")
    exc = info.value
    assert (Path(exc.file).name, exc.line, exc.field) == \
        ("pcie-ipc.yaml", 6, "communication.pcie_ipc_allreduce")
    assert "SGLang 0.5.19" in exc.message and "PCIe-IPC" in exc.message


def test_dp_replicas_and_attention_dp_cannot_share_dp_size_on_old_versions():
    p = fixture("dp-and-attn-dp")
    with pytest.raises(InputError) as info:
        render_launch(p, "0.5.19")
    assert info.value.field == "parallel.attention_dp"
    assert "--dp-size" in info.value.message and "parallel.dp" in info.value.message
    new = render_launch(p, "0.5.23")
    assert new.value("--dp-size") == "2" and new.value("--attn-dp-size") == "4"


def test_extra_args_may_not_repeat_a_rendered_field():
    with pytest.raises(InputError) as info:
        render_launch(fixture("extra-duplicates-field"), "0.5.23")
    assert info.value.field == "extra_args[0]"
    assert "parallel.tp" in info.value.message


def test_bad_choice_names_the_profile_field_and_line():
    with pytest.raises(InputError) as info:
        render_launch(fixture("bad-dsa-choice"), "0.5.23")
    exc = info.value
    assert (Path(exc.file).name, exc.line, exc.field) == \
        ("bad-dsa-choice.yaml", 4, "attention.dsa_decode_backend")
    assert "flashmla_magic" in exc.message


def test_local_version_suffix_renders_as_its_release():
    launch = render_launch(load_profile("glm5-nvfp4-tp8"), "0.5.23+lab")
    assert launch.version == "0.5.23"
    assert launch.args == render_launch(load_profile("glm5-nvfp4-tp8"), "0.5.23").args


def test_version_outside_the_profile_targets_is_refused():
    with pytest.raises(InputError) as info:
        render_launch(load_profile("glm5-nvfp4-tp8"), "0.5.19")
    assert info.value.field == "sglang_versions"


def test_unknown_version_is_refused():
    with pytest.raises(InputError) as info:
        render_launch(fixture("mfs-auto"), "0.4.0")
    assert "0.4.0" in info.value.message


def test_render_cli_prints_quoted_argv_one_flag_per_line(capsys, tmp_path):
    path = tmp_path / "quoted.yaml"
    path.write_text("model:\n  path: /models/my model\nenv:\n  NCCL_DEBUG: WARN\n")
    assert main(["render", "--profile", str(path), "--sglang-version", "0.5.23"]) == 0
    out = capsys.readouterr().out
    assert "NCCL_DEBUG=WARN" in out
    argv_text = out.split("# argv\n", 1)[1]
    lines = argv_text.strip().split(" \\\n")
    assert lines[0] == "python -m sglang.launch_server"
    assert "  --model-path '/models/my model'" in lines
    assert all(line.lstrip().startswith("--") for line in lines[1:])
    argv = shlex.split(argv_text.replace("\\\n", " "))[3:]
    assert argv == render_launch(load_profile(path), "0.5.23").args


def test_render_cli_reports_bad_input_with_exit_2(capsys):
    assert main(["render", "--profile", str(FIXTURES / "pcie-ipc.yaml"),
                 "--sglang-version", "0.5.19"]) == 2
    err = capsys.readouterr().err
    assert "pcie-ipc.yaml:6: communication.pcie_ipc_allreduce:" in err
