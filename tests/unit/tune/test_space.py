"""Tune files: good ones parse into knobs; bad ones are refused naming file, line, field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.cli import main as cli_main
from gpuserve.errors import InputError
from gpuserve.tune.session import precheck
from gpuserve.tune.space import Budget, check_space, knob_values, load_tune

REPO = Path(__file__).resolve().parents[3]
INCUMBENT = REPO / "profiles/glm5-nvfp4-tp8.yaml"


def tune_file(tmp_path: Path, body: str, name: str = "t.tune.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"incumbent: {INCUMBENT}\n{body}")
    return path


def knobs_of(path: Path, version: str = "0.5.23"):
    spec, raw = load_tune(path)
    knobs = tuple(knob_values(n, v, spec) for n, v in raw.items())
    check_space(spec, knobs, version)
    return spec, knobs


def test_shipped_tune_file_parses_and_renders_for_its_version() -> None:
    spec, raw = load_tune(REPO / "profiles/tune/glm5-nvfp4-tp8.tune.yaml")
    precheck(spec, raw)
    assert spec.name == "glm5-nvfp4-tp8" and spec.incumbent == INCUMBENT.resolve()
    assert spec.loads[0] == 1 and spec.objective("goodput").slo == {
        "median_ttft_ms": 3000.0, "p99_itl_ms": 100.0}
    knobs = {k.name: k for k in (knob_values(n, v, spec) for n, v in raw.items())}
    assert [v.label for v in knobs["memory.cuda_graph_max_bs"].values] == ["128", "256", "512"]
    assert knobs["speculative"].values[0].label == "off"
    assert knobs["speculative"].values[0].fields["speculative.algorithm"] is None
    ep = knobs["layout"].values[1].fields
    assert ep["parallel.ep"] == 8 and ep["memory.mem_fraction_static"] == 0.78


def test_a_flag_knob_checked_against_the_catalog(tmp_path) -> None:
    spec, knobs = knobs_of(tune_file(tmp_path, "knobs:\n  --schedule-conservativeness: "
                                               "[0.8, 1.3]\n"))
    assert knobs[0].values[1].extra_args == ("--schedule-conservativeness", "1.3")


@pytest.mark.parametrize(("body", "field", "words"), [
    # a flag the version lacks: renamed (ambiguous since 0.5.20) and unknown
    ("knobs:\n  --cuda-graph-max-bs: [128, 256]\n", "knobs.--cuda-graph-max-bs",
     "lacks this flag"),
    ("knobs:\n  --no-such-flag: [1]\n", "knobs.--no-such-flag", "has no option"),
    # a profile field the version has no flag for
    ("knobs:\n  attention.prefill_backend: [fa3, no_such_backend]\n",
     "knobs.attention.prefill_backend[1]", "no_such_backend"),
    # values of the wrong type
    ("knobs:\n  memory.cuda_graph_max_bs: [128, big]\n", "knobs.memory.cuda_graph_max_bs[1]",
     "integer"),
    ("knobs:\n  memory.mem_fraction_static: [0.9, 1.5]\n",
     "knobs.memory.mem_fraction_static[1]", "(0, 1)"),
    ("knobs:\n  layout: [{parallel.ep: eight}]\n", "knobs.layout[0]", "integer"),
    # an empty space
    ("knobs: {}\n", "knobs", "empty"),
    ("knobs:\n  memory.cuda_graph_max_bs: []\n", "knobs.memory.cuda_graph_max_bs",
     "non-empty"),
    # an SLO in unknown units, or without one
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nobjectives:\n  goodput: {slo: "
     "{p99_itl: 100 us}}\n", "objectives.goodput.slo.p99_itl", "ms or s"),
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nobjectives:\n  goodput: {slo: "
     "{p99_itl: 100}}\n", "objectives.goodput.slo.p99_itl", "give a unit"),
    # a budget of zero
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nbudget: {loads: 0}\n", "budget.loads",
     "1..10000"),
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nbudget: {wall: 0 h}\n", "budget.wall",
     "positive"),
    # a repeat resolution that is not a relative gain (0 would ask for endless runs)
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nrepeats: {resolution: 0}\n",
     "repeats.resolution", "between 0.001 and 0.5"),
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nrepeats: {resolution: .nan}\n",
     "repeats.resolution", "between 0.001 and 0.5"),
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nrepeats: {resolution: 2 %}\n",
     "repeats.resolution", "0.02: 2 %"),
    # a field a tune may not vary, an unknown key
    ("knobs:\n  model.path: [/models/x]\n", "knobs.model.path", "not the model"),
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nbudgets: {}\n", "budgets", "unknown key"),
])
def test_bad_input_names_file_line_and_field(tmp_path, body, field, words) -> None:
    path = tune_file(tmp_path, body)
    with pytest.raises(InputError) as info:
        knobs_of(path)
    err = info.value
    assert err.file == str(path) and err.field == field, str(err)
    assert err.line is not None and words in err.message, str(err)


def test_deprecated_alias_named_on_the_version_that_has_it(tmp_path) -> None:
    path = tune_file(tmp_path, "knobs:\n  --cuda-graph-max-bs: [128]\n")
    with pytest.raises(InputError, match="deprecated alias of --cuda-graph-max-bs-decode"):
        knobs_of(path, "0.5.19")


@pytest.mark.parametrize("body", [
    "knobs:\n  --cuda-graph-max-bs: [128, 256]\n",                      # flag the version lacks
    "knobs:\n  memory.cuda_graph_max_bs: [128, big]\n",                 # wrong type
    "knobs: {}\n",                                                      # empty space
    "knobs:\n  memory.cuda_graph_max_bs: [128]\nobjectives:\n  goodput: {slo: "
    "{p99_itl: 100 us}}\n",                                             # SLO unit
    "knobs:\n  memory.cuda_graph_max_bs: [128]\nbudget: {loads: 0}\n",   # zero budget
])
def test_bad_tune_file_never_reaches_the_host(tmp_path, capsys, body) -> None:
    """The CLI refuses before running pyinfra at all: --pyinfra points at a program
    that would leave a mark."""
    mark = tmp_path / "pyinfra-ran"
    fake = tmp_path / "pyinfra"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    fake.chmod(0o755)
    bad = tune_file(tmp_path, body)
    rc = cli_main(["tune", "inventory.py", str(bad), "--pyinfra", str(fake),
                   "--results", str(tmp_path / "r")])
    assert rc == 2 and not mark.exists()
    assert f"{bad}:" in capsys.readouterr().err


def test_cli_help_lists_tune() -> None:
    out = subprocess.run([sys.executable, "-m", "gpuserve", "tune", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--leave" in out and "tune_file" in out


def _fake_pyinfra(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "pyinfra-ran"
    fake = tmp_path / "pyinfra"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    fake.chmod(0o755)
    return fake, mark


_MANY = "knobs:\n" + "".join(f"  --knob-{i}: [{', '.join(str(v) for v in range(10))}]\n"
                             for i in range(12))
SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(("body", "field", "line", "words"), [
    # an unbounded space: 12 knobs x 10 values and no budget at all
    (_MANY, "knobs", 2, "without a budget"),
    # the same space with a budget of explicit nulls: null is "not set", so no bound
    (_MANY + "budget: {loads: null, wall: null}\n", "budget", 15, "bounds nothing"),
    (_MANY + "budget:\n  loads: null\n", "budget", 15, "bounds nothing"),
    # values that are not finite, or hold a newline or a terminal escape
    ("knobs:\n  --schedule-conservativeness: [.nan, 1.3]\nbudget: {loads: 4}\n",
     "knobs.--schedule-conservativeness[0]", 3, "finite"),
    ("knobs:\n  --schedule-conservativeness: [1.0, .inf]\nbudget: {loads: 4}\n",
     "knobs.--schedule-conservativeness[1]", 3, "finite"),
    ("knobs:\n  attention.decode_backend: [\"flashinfer\\n--api-key x\"]\n"
     "budget: {loads: 4}\n", "knobs.attention.decode_backend[0]", 3, "control character"),
    ("knobs:\n  attention.decode_backend: [\"\\e[31mred\"]\nbudget: {loads: 4}\n",
     "knobs.attention.decode_backend[0]", 3, "control character"),
    # the model, its checkpoint and the node layout are not launch settings
    ("knobs:\n  model.hf: [zai-org/GLM-5]\nbudget: {loads: 4}\n", "knobs.model.hf", 3,
     "not the model"),
    ("knobs:\n  layout:\n    - {parallel.ep: 8, model.path: /models/other}\n"
     "budget: {loads: 4}\n", "knobs.layout[0].model.path", None, "not the model"),
    ("knobs:\n  --nnodes: [1, 2]\nbudget: {loads: 4}\n", "knobs.--nnodes", 3,
     "node layout"),
    ("knobs:\n  --model-path: [/models/x]\nbudget: {loads: 4}\n", "knobs.--model-path", 3,
     "checkpoint"),
    # a host verdict (the host's measured gates decide it) without the profile's reason
    ("knobs:\n  communication.disable_custom_all_reduce: [true, false]\nbudget: {loads: 4}\n",
     "knobs.communication.disable_custom_all_reduce[0]", 3, "communication.insist"),
    # a wall budget that overflows to infinity
    ("knobs:\n  memory.cuda_graph_max_bs: [128]\nbudget: {wall: " + "9" * 400 + " h}\n",
     "budget.wall", 4, "at most 30 days"),
])
def test_issue_inputs_refused_before_any_connection(tmp_path, capsys, body, field, line,
                                                    words) -> None:
    fake, mark = _fake_pyinfra(tmp_path)
    bad = tune_file(tmp_path, body)
    rc = cli_main(["tune", "inventory.py", str(bad), "--pyinfra", str(fake),
                   "--results", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists(), err
    where = f"{bad}:{line}: " if line else f"{bad}:"
    assert where in err and f"{field}: " in err and words in err, err
    assert "\x1b" not in err and "flashinfer\n" not in err


def test_secret_flag_refused_without_its_value(tmp_path, capsys) -> None:
    fake, mark = _fake_pyinfra(tmp_path)
    bad = tune_file(tmp_path, f"knobs:\n  --api-key: [{SECRET}]\nbudget: {{loads: 4}}\n")
    rc = cli_main(["tune", "inventory.py", str(bad), "--pyinfra", str(fake)])
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists()
    assert f"{bad}:3: knobs.--api-key: " in err and "secret" in err
    assert SECRET not in err


@pytest.mark.parametrize(("data", "words"), [
    (["nonsense"], "must be KEY=VALUE"),
    (["=x"], "must be KEY=VALUE"),
    (["profile=" + "[" * 3000], "nested too deeply"),
    ([f"sglang_api_key={SECRET}"], "carries a secret"),
])
def test_data_checked_like_pyinfra_before_any_connection(tmp_path, capsys, data,
                                                         words) -> None:
    fake, mark = _fake_pyinfra(tmp_path)
    good = tune_file(tmp_path, "knobs:\n  memory.cuda_graph_max_bs: [128]\n")
    argv = ["tune", "inventory.py", str(good), "--pyinfra", str(fake)]
    for item in data:
        argv += ["--data", item]
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists() and "--data" in err and words in err, err
    assert SECRET not in err and "internal exception" not in err


def test_incumbent_symlink_to_a_system_file(tmp_path, capsys) -> None:
    fake, mark = _fake_pyinfra(tmp_path)
    (tmp_path / "evil.yaml").symlink_to("/etc/passwd")
    bad = tmp_path / "t.tune.yaml"
    bad.write_text("incumbent: ./evil.yaml\nknobs:\n  memory.cuda_graph_max_bs: [128]\n")
    rc = cli_main(["tune", "inventory.py", str(bad), "--pyinfra", str(fake)])
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists()
    assert f"{bad}:1: incumbent: " in err and "/etc/passwd" in err, err


@pytest.mark.parametrize("budget", ["", "budget: {loads: null, wall: null}\n",
                                    "budget: {wall: null}\n"])
def test_budget_of_nulls_is_no_budget(tmp_path, budget) -> None:
    """A null bound is not set: a small space is measured whole (its plan's size), as
    with no budget at all, never without a bound."""
    spec, _ = load_tune(tune_file(tmp_path, "knobs:\n  memory.cuda_graph_max_bs: [128, 256]\n"
                                            "objectives: {single_stream: {}}\n" + budget))
    assert spec.budget == Budget(loads=1 + 2 + 2)


def test_small_space_without_budget_says_its_size(tmp_path) -> None:
    spec, _ = load_tune(tune_file(tmp_path, "knobs:\n  memory.cuda_graph_max_bs: [128, 256]\n"
                                            "objectives: {single_stream: {}}\n"))
    assert spec.budget.loads == 1 + 2 + 2 and spec.budget.wall_s is None
