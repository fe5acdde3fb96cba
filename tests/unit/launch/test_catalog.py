"""Flag catalogs: loading, and judging command lines the way SGLang's argparse does.

The facts checked here were read from the real wheels (sglang 0.5.19 and 0.5.23 on
PyPI) via tools/gen_flag_catalog.py.
"""

from __future__ import annotations

import json

import pytest

from gpuserve.errors import InputError
from gpuserve.launch import catalog as cat
from gpuserve.launch.flagparser import build_parser, converter, human_readable_int

MODEL = ["--model-path", "/models/m"]


@pytest.fixture(scope="module")
def c19():
    return cat.load_catalog("0.5.19")


@pytest.fixture(scope="module")
def c23():
    return cat.load_catalog("0.5.23")


def test_available_versions_lists_committed_catalogs():
    versions = cat.available_versions()
    assert "0.5.19" in versions and "0.5.23" in versions
    assert versions.index("0.5.19") < versions.index("0.5.23")


def test_local_version_part_is_stripped():
    assert cat.load_catalog("0.5.23+lab") is cat.load_catalog("0.5.23")
    assert cat.base_version("sglang==0.5.19+lab") == "0.5.19"


def test_unknown_version_is_an_input_error_naming_the_available_ones():
    with pytest.raises(InputError) as e:
        cat.load_catalog("0.4.0")
    assert e.value.field == "sglang_version"
    assert "0.5.23" in str(e.value)


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_catalog_records_provenance_and_every_option_field(version):
    c = cat.load_catalog(version)
    assert c.version == version
    assert c.prog == "sglang serve"
    assert c.data["generator"] == "tools/gen_flag_catalog.py"
    assert f"sglang-{version}-" in c.source and "sha256 " in c.source
    for raw in c.data["options"]:
        assert {"dest", "flags", "action", "type", "nargs", "choices", "default",
                "required", "help"} <= raw.keys()
        assert raw["flags"] and all(f.startswith("-") for f in raw["flags"])
    # A real parser of several hundred options, not a hand list.
    assert len(c.options) > 450
    assert len(c.flags) > len(c.options)  # aliases are recorded


def test_option_counts_of_the_committed_catalogs(c19, c23):
    # Counted from the real parsers (argparse actions minus -h/--help).
    assert len(c19.options) == 503
    assert len(c23.options) == 531


def test_aliases(c23):
    assert c23.option("--model").dest == "model_path"
    assert c23.option("--tensor-parallel-size").dest == "tp_size"
    assert c23.option("--attention-data-parallel-size").dest == "attn_dp_size"


def test_cuda_graph_max_bs_is_ambiguous_on_0523_and_valid_on_0519(c19, c23):
    with pytest.raises(InputError) as e:
        c23.validate(["--cuda-graph-max-bs", "128"], source="p.yaml", field="extra_args", line=4)
    msg = str(e.value)
    assert msg.startswith("p.yaml:4: extra_args: SGLang 0.5.23: ambiguous option")
    assert "--cuda-graph-max-bs-decode" in msg and "--cuda-graph-max-bs-prefill" in msg
    ns = c19.validate(["--cuda-graph-max-bs", "128"])
    assert ns.cuda_graph_max_bs_decode == 128  # deprecated alias storing into the new field


def test_nsa_prefill_backend_only_on_0519(c19, c23):
    assert c19.has_flag("--nsa-prefill-backend")
    assert not c23.has_flag("--nsa-prefill-backend")
    c19.validate(["--nsa-prefill-backend", "flashmla_sparse"])
    with pytest.raises(InputError, match="unrecognized arguments: --nsa-prefill-backend"):
        c23.validate(["--nsa-prefill-backend", "flashmla_sparse"])


def test_attn_dp_size_only_on_0523(c19, c23):
    assert c23.validate(["--attn-dp-size", "8"]).attn_dp_size == 8
    with pytest.raises(InputError, match="unrecognized arguments: --attn-dp-size 8"):
        c19.validate(["--attn-dp-size", "8"])


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_tp_is_only_an_abbreviation(version):
    c = cat.load_catalog(version)
    assert not c.has_flag("--tp")
    assert c.resolve("--tp").name == "--tp-size"
    assert c.validate(["--tp", "8"]).tp_size == 8


def test_quantization_choices(c23):
    with pytest.raises(InputError, match="invalid choice: 'nvfp4'"):
        c23.validate(["--quantization", "nvfp4"])
    assert c23.validate(["--quantization", "modelopt_fp4"]).quantization == "modelopt_fp4"


def test_kv_cache_dtype_fp8_e4m3_is_valid(c19, c23):
    for c in (c19, c23):
        assert c.validate(["--kv-cache-dtype", "fp8_e4m3"]).kv_cache_dtype == "fp8_e4m3"
    with pytest.raises(InputError, match="invalid choice: 'fp8'"):
        c23.validate(["--kv-cache-dtype", "fp8"])


def test_bad_types_use_argparse_wording(c23):
    with pytest.raises(InputError, match=r"argument --tp-size/--tensor-parallel-size: "
                       r"invalid int value: 'eight'"):
        c23.validate(["--tp-size", "eight"])
    with pytest.raises(InputError, match="invalid float value: 'high'"):
        c23.validate(["--mem-fraction-static", "high"])
    with pytest.raises(InputError, match="expected one argument"):
        c23.validate(["--port"])


def test_human_readable_ints(c23):
    assert c23.validate(["--context-length", "128k"]).context_length == 128_000
    assert c23.validate(["--context-length", "2Ki"]).context_length == 2048
    assert c23.validate(["--context-length=1M"]).context_length == 1_000_000
    assert human_readable_int("25.6k") == 25_600
    with pytest.raises(InputError, match="Decimals are not allowed with IEC suffixes"):
        c23.validate(["--context-length", "1.5Ki"])
    with pytest.raises(InputError, match="Invalid integer value: '12q'"):
        c23.validate(["--context-length", "12q"])


def test_cuda_graph_config_keys_follow_the_version(c19, c23):
    good = json.dumps({"decode": {"max_bs": 256}})
    assert c23.validate(["--cuda-graph-config", good]).cuda_graph_config == {
        "decode": {"max_bs": 256}}
    tc = json.dumps({"decode": {"tc_compiler": "eager"}})
    c19.validate(["--cuda-graph-config", tc])
    with pytest.raises(InputError, match="unknown key 'tc_compiler'"):
        c23.validate(["--cuda-graph-config", tc])
    with pytest.raises(InputError, match="must be JSON"):
        c23.validate(["--cuda-graph-config", "{decode"])


def test_boolean_optional_gets_its_negative_spelling(c23):
    ns = c23.validate(["--no-enable-dsa-fused-indexer"])
    assert ns.enable_dsa_fused_indexer is False


def test_required_model_path_only_for_complete_command_lines(c23):
    c23.validate(["--tp-size", "2"])  # a fragment is fine
    with pytest.raises(InputError, match="the following arguments are required: "
                       "--model-path/--model"):
        c23.validate(["--tp-size", "2"], complete=True)
    assert c23.validate([*MODEL, "--tp-size", "2"], complete=True).model_path == "/models/m"


def test_deprecated_action_with_error_message_is_refused(c19):
    with pytest.raises(InputError, match="--enable-expert-distribution-metrics is no longer "
                       "supported"):
        c19.validate(["--enable-expert-distribution-metrics"])


def test_resolve_rejects_unknown_and_ambiguous(c23):
    with pytest.raises(InputError, match="has no option --no-such-flag"):
        c23.resolve("--no-such-flag")
    with pytest.raises(InputError, match="ambiguous"):
        c23.resolve("--cuda-graph-max-bs")


def test_non_string_arguments_are_input_errors(c23):
    with pytest.raises(InputError, match="must be strings"):
        c23.validate(["--tp-size", 2])  # type: ignore[list-item]


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_every_type_name_has_a_converter(version):
    raw = cat.load_catalog(version).data
    for o in raw["options"]:
        converter(o["type"], raw.get("type_params"))  # raises for an unknown name
    build_parser(raw)


def test_unknown_converter_or_action_fails_loudly():
    with pytest.raises(ValueError, match="no stdlib converter"):
        converter("brand_new_parser")
    bad = {"options": [{"dest": "x", "flags": ["--x"], "action": "NewAction", "type": None,
                        "nargs": None, "choices": None, "default": None, "required": False,
                        "help": ""}]}
    with pytest.raises(ValueError, match="NewAction"):
        build_parser(bad)


def test_help_is_refused_without_printing_or_exiting(c23, capsys):
    with pytest.raises(InputError, match="prints the help text and exits"):
        c23.validate(["--help"])
    with pytest.raises(InputError, match="abbreviates --help"):
        c23.resolve("--he")
    with pytest.raises(InputError, match="could match --help, --host"):
        c23.validate(["--h", "x"])
    assert capsys.readouterr().out == ""
