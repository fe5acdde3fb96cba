"""gpuserve.measure.results: record round trip, launch hash, writer, and the two readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpuserve import __version__
from gpuserve.errors import InputError
from gpuserve.measure.results import (
    SCHEMA,
    RecordSpec,
    ResultRecord,
    Served,
    bench_record,
    last_good,
    launch_hash,
    parse_sglang_line,
    profile_hash,
    read_file,
    read_results,
    record_spec,
    smoke_record,
    validate_results_dir,
    write_record,
)
from gpuserve.measure.smoke import SmokeResult

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"
SPEC = RecordSpec(results_dir="results", profile="glm5-nvfp4-tp8",
                  launch_hash=launch_hash(["--tp-size", "8"], {"NCCL_P2P_DISABLE": "1"}),
                  sglang_version="0.5.23", model="/models/GLM-5-NVFP4", served_name="glm-5")
SMOKE = SmokeResult("/v1/completions", 64, 5, 1.9, " Paris")


def test_smoke_record_round_trips_through_a_file(tmp_path: Path) -> None:
    rec = smoke_record(SPEC, "gpu1", SMOKE, timestamp="2026-11-29T12:00:00Z")
    path = write_record(tmp_path, rec)
    assert path == tmp_path / "gpu1" / "20261129T120000Z-smoke-glm5-nvfp4-tp8.json"
    text = path.read_text()
    assert text.count("\n") == 1, "one JSON object on one line: also valid JSONL"
    doc = json.loads(text)
    assert doc["schema"] == SCHEMA and doc["kind"] == "smoke"
    assert doc["figures"] == {"tokens": 64, "seconds": 1.9, "tok_s": 33.684}
    assert doc["timestamp"] == "2026-11-29T12:00:00Z"
    [back] = read_results(tmp_path)
    assert back.output_tok_s == pytest.approx(33.684) and back.concurrency == 1
    assert back.host == "gpu1" and back.launch_hash == SPEC.launch_hash
    assert back.source == f"{path}:1"


def test_writer_never_overwrites_and_leaves_no_temp_file(tmp_path: Path) -> None:
    rec = smoke_record(SPEC, "gpu1", SMOKE, timestamp="2026-11-29T12:00:00Z")
    first, second = write_record(tmp_path, rec), write_record(tmp_path, rec)
    assert first != second and second.name.endswith("-2.json")
    assert sorted(p.name for p in (tmp_path / "gpu1").iterdir()) == sorted(
        [first.name, second.name])


def test_timestamp_is_utc_iso8601() -> None:
    ts = smoke_record(SPEC, "gpu1", SMOKE).timestamp
    assert len(ts) == 20 and ts[10] == "T" and ts.endswith("Z")


@pytest.mark.parametrize("host", ["../etc", "a/b", ".."])
def test_host_name_cannot_escape_the_results_dir(tmp_path: Path, host: str) -> None:
    path = write_record(tmp_path, smoke_record(SPEC, host, SMOKE))
    assert path.resolve().parent.parent == tmp_path.resolve()


def test_launch_hash_ignores_secrets_and_env_order() -> None:
    args = ["--model-path", "/m", "--tp-size", "8"]
    base = launch_hash(args, {"A": "1", "B": "2"})
    assert base.startswith("sha256:") and len(base) == 7 + 64
    assert launch_hash(args, {"B": "2", "A": "1"}) == base
    assert launch_hash(args, {"A": "1", "B": "2", "HF_TOKEN": "hf_x"}) == base
    assert launch_hash(args + ["--api-key", "k1"], {"A": "1", "B": "2"}) == base
    assert launch_hash(args + ["--api-key=k1"], {"A": "1", "B": "2"}) == base
    assert launch_hash(args, {"A": "1", "B": "3"}) != base
    assert launch_hash(["--tp-size", "8", "--model-path", "/m"], {"A": "1", "B": "2"}) != base


def test_record_holds_no_secret_even_from_sglang_server_info() -> None:
    records = read_file(FIXTURES / "sglang-bench.jsonl")
    for r in records:
        assert "sk-fixture-not-a-real-key" not in json.dumps(r.to_dict())


def test_sglang_bench_lines_become_bench_records() -> None:
    base, eagle = read_file(FIXTURES / "sglang-bench.jsonl")
    assert (base.kind, base.profile, base.sglang_version, base.served_name, base.model) == (
        "bench", "glm5-nvfp4-tp8", "0.5.23", "glm-5", "/models/GLM-5-NVFP4")
    assert base.host is None and base.timestamp is None
    assert base.figures["output_throughput"] == 535.42
    assert base.figures["median_ttft_ms"] == 1204.7 and base.figures["median_itl_ms"] == 26.9
    assert base.figures["max_concurrency"] == 16 and base.concurrency == 16
    assert base.figures["random_input_len"] == 1024 and base.figures["completed"] == 64
    assert base.figures["num_prompts"] is None  # this client variant does not write it
    assert base.figures["accept_length"] is None and eagle.figures["accept_length"] == 2.71
    assert eagle.profile == "glm5-nvfp4-tp8-eagle3"
    assert eagle.source.endswith("sglang-bench.jsonl:2")


def test_untagged_sglang_line_takes_the_file_stem(tmp_path: Path) -> None:
    f = tmp_path / "h200-run.jsonl"
    f.write_text(json.dumps({"output_throughput": 100.0, "server_info": None}) + "\n\n")
    [r] = read_file(f)
    assert r.profile == "h200-run" and r.sglang_version is None


def test_indented_hand_written_record_is_read(tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"schema": SCHEMA, "kind": "smoke", "profile": "p",
                             "figures": {"tok_s": 10}}, indent=2))
    [r] = read_file(f)
    assert r.output_tok_s == 10 and r.source == f"{f}:1"


@pytest.mark.parametrize(
    ("lines", "where"),
    [
        (['{"output_throughput": 1}', "{not json"], ":2: not a JSON object per line"),
        (['{"output_throughput": "fast"}'], ":1: output_throughput: must be a finite number"),
        (['{"output_throughput": 1}', '{"completed": 3}'], ":2: neither a gpuserve result"),
        (['{"median_ttft_ms": 1.0, "output_throughput": null}'],
         ":1: output_throughput: required number"),
        (['[1, 2]'], ":1: expected a JSON object"),
        (['{"schema": "gpuserve.result/9", "kind": "smoke", "figures": {}}'],
         ":1: schema: unsupported"),
        (['{"schema": "gpuserve.result/1", "kind": "perf", "figures": {}}'], ":1: kind:"),
        (['{"schema": "gpuserve.result/1", "kind": "smoke", "figures": {"tok_s": 1}, '
          '"args": ["--api-key", "x"]}'], ":1: args: unknown key"),
        (['{"schema": "gpuserve.result/1", "kind": "smoke", "figures": {"ttft": 1}}'],
         ":1: figures.ttft: not a smoke figure"),
        (['{"schema": "gpuserve.result/1", "kind": "smoke", "figures": {"tok_s": true}}'],
         ":1: figures.tok_s: must be a finite number"),
        (['{"schema": "gpuserve.result/1", "kind": "bench", "host": 3, '
          '"figures": {"output_throughput": 1}}'], ":1: host: must be a string"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path: Path, lines: list[str], where: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as e:
        read_file(f)
    assert str(e.value).startswith(f"{f}{where}")


def test_missing_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_results(tmp_path / "nope")


@pytest.mark.parametrize(("value", "expected"),
                         [("results", "results"), ("", None), (None, None), (False, None)])
def test_results_dir_host_data(value, expected) -> None:
    assert validate_results_dir(value, "inventory/gpu.py") == expected


def test_results_dir_must_be_a_path() -> None:
    with pytest.raises(InputError, match="inventory/gpu.py: results_dir: must be a directory"):
        validate_results_dir(["results"], "inventory/gpu.py")


# --------------------------------------------------------------------------------------
# gpuserve.result/2: bench records with their context, SGLang's own line, the gate, and the promises
# around them (strict JSON, no secret in a file, append-only, /1 still read).


FIXTURES_V2 = Path(__file__).resolve().parents[2] / "fixtures"
BENCH = FIXTURES_V2 / "bench"
# composed in the shape of SGLang 0.5.23's --output-file (see tests/fixtures/bench/README.md)
C1_TEXT, C64_TEXT = (BENCH / "sglang-serving-composed.jsonl").read_text().splitlines()
TS = "2026-11-29T12:00:00Z"


def strict_loads(text: str):
    """json.loads that refuses Infinity/NaN, as jq or Go's encoding/json do."""
    def refuse(name: str):
        raise ValueError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def make_spec(results_dir: Path, args=(), env=None, **extra) -> RecordSpec:
    spec = record_spec(str(results_dir), "inventory/gpu.py",
                       Served(profile="glm5-nvfp4-tp8", sglang_version="0.5.23",
                              model="/models/GLM-5-NVFP4", served_name="glm-5",
                              profile_hash="sha256:" + "ab" * 32,
                              lock="sglang-0.5.23-cu13-py311"),
                       args=["--model-path", "/models/GLM-5-NVFP4", "--tp-size", "8", *args],
                       env=env or {"NCCL_P2P_DISABLE": "1"},
                       context={"gpus": {"name": "NVIDIA H200", "count": 8},
                                "driver": "580.95.05", "cuda": "13.0", "p2p": "ok",
                                "nccl_env": {"NCCL_P2P_LEVEL": "NVL"}, **extra})
    assert spec is not None
    return spec


def test_parse_sglang_line_accepts_infinity_and_nan() -> None:
    line = parse_sglang_line(C1_TEXT, "bench.jsonl:1")
    assert "Infinity" in C1_TEXT and line["request_rate"] == math.inf
    assert line["output_throughput"] == 89.5
    assert math.isnan(parse_sglang_line('{"output_throughput": NaN}', "x")["output_throughput"])


@pytest.mark.parametrize(("text", "why"), [
    ("Traceback (most recent call last):", "not an SGLang benchmark JSON line: Expecting"),
    ("[1, 2]", "expected an object, got list"),
    ("", "not an SGLang benchmark JSON line"),
])
def test_parse_sglang_line_names_its_source(text: str, why: str) -> None:
    with pytest.raises(InputError) as e:
        parse_sglang_line(text, "gpu1:/var/lib/gpuserve/bench-single.jsonl")
    assert str(e.value).startswith("gpu1:/var/lib/gpuserve/bench-single.jsonl: ")
    assert why in str(e.value)


def test_bench_record_round_trip(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    gate = {"passed": True, "misses": [], "checked": ["single: output_throughput >= 80"]}
    rec = bench_record(spec, "gpu1", "single", parse_sglang_line(C1_TEXT, "c1"), gate=gate,
                       timestamp=TS)
    path = write_record(tmp_path, rec)
    assert path == tmp_path / "gpu1" / "20261129T120000Z-bench-glm5-nvfp4-tp8-single.json"
    text = path.read_text()
    assert text.count("\n") == 1 and text.endswith("}\n")
    doc = strict_loads(text)  # our writer never writes Infinity
    assert doc["schema"] == SCHEMA == "gpuserve.result/2"
    assert (doc["kind"], doc["host"], doc["scenario"], doc["lock"]) == (
        "bench", "gpu1", "single", "sglang-0.5.23-cu13-py311")
    assert doc["profile_hash"] == "sha256:" + "ab" * 32
    assert doc["gate"] == gate
    assert doc["figures"]["output_throughput"] == 89.5
    assert doc["figures"]["p99_itl_ms"] == 19.98 and doc["figures"]["max_concurrency"] == 1
    # SGLang's line untouched but for server_info and the infinite request rate
    original = parse_sglang_line(C1_TEXT, "c1")
    assert doc["sglang"]["request_rate"] == "inf"
    assert "server_info" not in doc["sglang"]
    assert set(doc["sglang"]) == set(original) - {"server_info"}
    assert {k: v for k, v in doc["sglang"].items() if k != "request_rate"} == {
        k: v for k, v in original.items() if k not in ("request_rate", "server_info")}
    ctx = doc["context"]
    assert ctx["argv"] == ["--model-path", "/models/GLM-5-NVFP4", "--tp-size", "8"]
    assert ctx["env"] == {"NCCL_P2P_DISABLE": "1"} and ctx["p2p"] == "ok"
    assert ctx["gpus"] == {"name": "NVIDIA H200", "count": 8}
    assert ctx["gpuserve_version"] == __version__
    [back] = read_results(tmp_path)
    assert back.to_dict() == doc
    assert back.source == f"{path}:1" and back.concurrency == 1 and back.is_good


def test_nan_and_minus_inf_are_stored_as_strings(tmp_path: Path) -> None:
    line = parse_sglang_line(C1_TEXT, "c1")
    line.update({"median_itl_ms": float("nan"), "std_itl_ms": float("-inf"),
                 "cache_report": {"hit_rate": float("nan")}})
    rec = bench_record(make_spec(tmp_path), "gpu1", "single", line, timestamp=TS)
    doc = strict_loads(write_record(tmp_path, rec).read_text())
    assert doc["figures"]["median_itl_ms"] is None, "a non-finite figure is unknown"
    assert doc["sglang"]["median_itl_ms"] == "nan" and doc["sglang"]["std_itl_ms"] == "-inf"
    assert doc["sglang"]["cache_report"] == {"hit_rate": "nan"}


@pytest.mark.parametrize(("change", "where"), [
    ({"output_throughput": None}, "output_throughput: required number"),
    ({"output_throughput": float("inf")}, "output_throughput: must be a finite number"),
    ({"median_ttft_ms": "12 ms"}, "median_ttft_ms: must be a finite number"),
    ({"max_concurrency": True}, "max_concurrency: must be a finite number"),
])
def test_bench_record_refuses_a_bad_line(tmp_path: Path, change: dict, where: str) -> None:
    line = {**parse_sglang_line(C64_TEXT, "c64"), **change}
    if change.get("output_throughput", 0) is None:
        del line["output_throughput"]
    with pytest.raises(InputError) as e:
        bench_record(make_spec(tmp_path), "gpu1", "batch", line)
    assert str(e.value).startswith(f"gpu1: bench glm5-nvfp4-tp8/batch: {where}")


def test_bench_record_refuses_a_bad_gate(tmp_path: Path) -> None:
    line = parse_sglang_line(C1_TEXT, "c1")
    with pytest.raises(InputError, match="gate.passed: must be true or false"):
        bench_record(make_spec(tmp_path), "gpu1", "single", line, gate={"passed": "yes"})


SECRETS = {"K1": "sk-argv-space-1111", "K2": "sk-argv-equals-2222",
           "K3": "sk-argv-abbrev-3333", "K4": "sk-admin-4444", "K5": "hf_argvtoken5555",
           "K6": "hf_envtoken6666", "K7": "sk-openai-7777", "K8": "nccl-secret-8888",
           "K9": "sk-argv-abbrev-eq-9999"}
SECRET_ARGV = ["--api-key", SECRETS["K1"], "--api-key=" + SECRETS["K2"],
               "--api-k", SECRETS["K3"], "--admin-api-key", SECRETS["K4"],
               "--hf-token", SECRETS["K5"], "--api-ke=" + SECRETS["K9"],
               "--max-total-tokens", "200000"]
SECRET_ENV = {"NCCL_P2P_DISABLE": "1", "HF_TOKEN": SECRETS["K6"],
              "OPENAI_API_KEY": SECRETS["K7"]}


def assert_no_secret(text: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} reached the record"
    assert "sk-fixture-not-a-real-key" not in text  # SGLang's server_info.api_key


def test_no_secret_from_argv_env_or_server_info_reaches_the_file(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, args=SECRET_ARGV, env=SECRET_ENV,
                     nccl_env={"NCCL_P2P_LEVEL": "NVL", "NCCL_SECRET": SECRETS["K8"]})
    line = parse_sglang_line(C64_TEXT, "c64")
    path = write_record(tmp_path, bench_record(spec, "gpu1", "batch", line, timestamp=TS))
    text = path.read_text()
    assert_no_secret(text)
    doc = strict_loads(text)
    # what is not secret is kept: the argv still tells what produced the run
    assert doc["context"]["argv"][-2:] == ["--max-total-tokens", "200000"]
    assert "--api-key" not in doc["context"]["argv"]
    assert doc["context"]["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert doc["context"]["nccl_env"] == {"NCCL_P2P_LEVEL": "NVL"}
    smoke = smoke_record(spec, "gpu1", SmokeResult("/v1/completions", 64, 5, 1.9, " Paris"))
    assert_no_secret(write_record(tmp_path, smoke).read_text())


def test_the_writer_rechecks_a_context_built_by_hand(tmp_path: Path) -> None:
    """A caller that bypasses record_spec still cannot leak: the writer strips again, and
    a secret value found elsewhere in the record (a path, a note) is redacted."""
    rec = ResultRecord(
        kind="bench", profile="p", host="gpu1", scenario="single", timestamp=TS,
        figures={"output_throughput": 1.0}, note=f"key was {SECRETS['K1']}",
        context={"argv": [*SECRET_ARGV, "--log-dir", f"/tmp/{SECRETS['K6']}"],
                 "env": SECRET_ENV},
        sglang={"output_throughput": 1.0, "server_info": {"api_key": SECRETS["K4"]}},
    )
    text = write_record(tmp_path, rec).read_text()
    assert_no_secret(text)
    assert "<redacted>" in text and "--log-dir" in text


def test_a_short_value_of_a_secret_looking_setting_is_not_redacted_everywhere(
        tmp_path: Path) -> None:
    rec = ResultRecord(kind="bench", profile="p", host="gpu1", timestamp=TS,
                       figures={"output_throughput": 1.0}, note="true to the profile",
                       context={"env": {"SGLANG_TOKENIZER_CACHE": "true"}})
    doc = strict_loads(write_record(tmp_path, rec).read_text())
    # a setting with "TOKEN" inside is no secret (is_secret_env_name): kept, and its
    # value is not scrubbed from other strings
    assert doc["note"] == "true to the profile"
    assert doc["context"]["env"] == {"SGLANG_TOKENIZER_CACHE": "true"}


def test_unknown_context_key_is_refused_before_writing(tmp_path: Path) -> None:
    rec = ResultRecord(kind="bench", profile="p", host="gpu1", timestamp=TS,
                       figures={"output_throughput": 1.0}, context={"argvs": []})
    with pytest.raises(InputError, match="context.argvs: unknown key"):
        write_record(tmp_path, rec)
    assert not any(tmp_path.rglob("*")), "a refused record leaves no file behind"


def test_records_are_append_only(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    rec = bench_record(spec, "gpu1", "single", parse_sglang_line(C1_TEXT, "c1"), timestamp=TS)
    paths = [write_record(tmp_path, rec) for _ in range(3)]
    assert [p.name for p in paths] == [
        "20261129T120000Z-bench-glm5-nvfp4-tp8-single.json",
        "20261129T120000Z-bench-glm5-nvfp4-tp8-single-2.json",
        "20261129T120000Z-bench-glm5-nvfp4-tp8-single-3.json"]
    assert sorted(p.name for p in (tmp_path / "gpu1").iterdir()) == sorted(
        p.name for p in paths), "no temp file left behind"
    assert len(read_results(tmp_path)) == 3


def test_v1_files_are_still_read() -> None:
    v1 = FIXTURES_V2 / "results" / "gpu1" / "20261129T120000Z-smoke-glm5-nvfp4-tp8.json"
    [smoke] = read_file(v1)
    assert smoke.kind == "smoke" and smoke.output_tok_s == 33.684
    assert smoke.scenario is None and smoke.context is None and smoke.gate is None
    assert smoke.to_dict()["schema"] == SCHEMA, "rewritten, it becomes a /2 record"
    notes = read_file(FIXTURES_V2 / "results" / "field-notes.jsonl")
    assert [r.output_tok_s for r in notes] == [89.5, 54.1, 82.0]


def test_raw_sglang_lines_keep_the_line_without_server_info() -> None:
    [c1, c64] = read_file(BENCH / "sglang-serving-composed.jsonl")
    assert (c1.profile, c1.concurrency, c64.concurrency) == ("glm5-nvfp4-tp8", 1, 64)
    assert c1.host is None and c1.scenario is None
    doc = strict_loads(json.dumps(c64.to_dict(), allow_nan=False))
    assert doc["sglang"]["request_rate"] == "inf" and "server_info" not in doc["sglang"]
    assert "sk-fixture-not-a-real-key" not in json.dumps(doc)


V2 = '{"schema": "gpuserve.result/2", "kind": "bench", "figures": {"output_throughput": 1}'


@pytest.mark.parametrize(("line", "where"), [
    (V2 + ', "gate": {"passed": "no"}}', ":2: gate.passed: must be true or false"),
    (V2 + ', "gate": {"passed": true, "misses": "none"}}', ":2: gate.misses: must be a list"),
    (V2 + ', "gate": {"passed": true, "why": 1}}', ":2: gate.why: unknown key"),
    (V2 + ', "context": {"argv": "--tp 8"}}', ":2: context.argv: must be a list of strings"),
    (V2 + ', "context": {"host": "x"}}', ":2: context.host: unknown key"),
    (V2 + ', "context": {"gpus": 8}}', ":2: context.gpus: must be an object"),
    (V2 + ', "sglang": [1]}', ":2: sglang: must be an object or null"),
    (V2 + ', "scenario": 1}', ":2: scenario: must be a string"),
    (V2 + ', "extra": 1}', ":2: extra: unknown key in gpuserve.result/2"),
    ('{"schema": "gpuserve.result/1", "kind": "bench", "scenario": "single", '
     '"figures": {"output_throughput": 1}}', ":2: scenario: unknown key in gpuserve.result/1"),
    ('{"output_throughput": 1, "request_rate": Infinity, "median_ttft_ms": "slow"}',
     ":2: median_ttft_ms: must be a finite number"),
])
def test_bad_lines_are_named_by_file_and_line(tmp_path: Path, line: str, where: str) -> None:
    f = tmp_path / "runs.jsonl"
    f.write_text(V2 + "}\n" + line + "\n")
    with pytest.raises(InputError) as e:
        read_file(f)
    assert str(e.value).startswith(f"{f}{where}")


def test_last_good_skips_failed_gates_and_takes_the_latest() -> None:
    records = read_results(BENCH / "results")
    single = last_good(records, "gpu1", "glm5-nvfp4-tp8", "single")
    assert single.timestamp == "2026-11-29T12:00:00Z" and single.output_tok_s == 90.1
    assert last_good(records, "gpu1", "glm5-nvfp4-tp8-eagle3", "single").output_tok_s == 131.2
    assert last_good(records, "gpu1", "glm5-nvfp4-tp8-eagle3", "batch") is None, "gate failed"
    assert last_good(records, "gpu2", "glm5-nvfp4-tp8", "single") is None
    assert last_good(records, "gpu1", "glm5-nvfp4-tp8", "smoke") is None, "bench only"


def test_a_results_directory_skips_what_is_not_a_result() -> None:
    skipped: list[str] = []
    records = read_results(BENCH / "results", skipped)
    assert len(records) == 10
    assert {r.kind for r in records} == {"bench", "smoke"}
    assert any("host.json: no result record" in s for s in skipped)
    assert any("measure.json: schema 'gpuserve.measure/1'" in s for s in skipped)


def test_a_named_non_result_file_is_still_an_error() -> None:
    with pytest.raises(InputError, match="host.json:1: neither a gpuserve result record"):
        read_results(BENCH / "results" / "gpu1" / "host.json")


def test_a_broken_json_file_in_a_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "gpu1").mkdir()
    (tmp_path / "gpu1" / "notes.json").write_text("{half a record\n")
    (tmp_path / "gpu1" / "plot.png").write_bytes(b"\x89PNG\r\n")
    with pytest.raises(InputError, match=r"notes.json:1: not a JSON object per line"):
        read_results(tmp_path)


def test_launch_hash_counts_max_total_tokens_and_ignores_abbreviated_keys() -> None:
    args = ["--model-path", "/m"]
    base = launch_hash(args, {})
    assert launch_hash(args + ["--max-total-tokens", "1000"], {}) != launch_hash(
        args + ["--max-total-tokens", "2000"], {}), "a setting, not a secret"
    assert launch_hash(args + ["--api-k", "k1"], {}) == base
    assert launch_hash(args + ["--admin-api-key=k2"], {}) == base


def test_profile_hash_follows_the_file(tmp_path: Path) -> None:
    f = tmp_path / "glm5.yaml"
    f.write_text("name: glm5\n")
    first = profile_hash([f])
    assert first.startswith("sha256:") and len(first) == 7 + 64
    assert profile_hash([f]) == first
    f.write_text("name: glm5\nserve: {tp: 8}\n")
    assert profile_hash([f]) != first
    with pytest.raises(InputError, match="nope.yaml: cannot read"):
        profile_hash([tmp_path / "nope.yaml"])


def test_record_spec_without_new_arguments_is_unchanged(tmp_path: Path) -> None:
    spec = record_spec(str(tmp_path), "inventory/gpu.py", Served("p", "0.5.23", "m", "m"),
                       args=["--tp-size", "8"], env={})
    assert (spec.profile_hash, spec.lock, spec.context) == (None, None, None)
    doc = smoke_record(spec, "gpu1", SmokeResult("/v1/completions", 1, 1, 1.0, "x")).to_dict()
    assert doc["context"] is None and doc["scenario"] is None and doc["sglang"] is None


def test_a_full_disk_leaves_no_half_written_file(tmp_path, monkeypatch):
    """Writing fails (ENOSPC): the error is raised, nothing half-written stays behind."""
    import errno
    from pathlib import Path

    from gpuserve.measure import results as results_module

    real_write = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        real_write(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left") as raised:
        results_module.write_new_file(tmp_path / "h" / "r.json", '{"a": 1}\n')
    monkeypatch.undo()
    # the error names the record that was lost (the failed write itself names no file)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == f"[Errno 28] No space left on device: '{tmp_path}/h/r.json'"
    assert [p.name for p in (tmp_path / "h").iterdir()] == []
