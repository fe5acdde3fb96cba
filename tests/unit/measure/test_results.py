"""gpuserve.measure.results: record round trip, launch hash, writer, and the two readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.measure.results import (
    SCHEMA,
    RecordSpec,
    launch_hash,
    read_file,
    read_results,
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
