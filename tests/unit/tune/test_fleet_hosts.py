"""A fleet's hosts must be the same box: compared from the inventory before any connection
(the CLI), and from each host's snapshot before any load (gpuserve/tune/sameness.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpuserve.cli import main as cli_main
from gpuserve.errors import InputError
from gpuserve.tune.sameness import data_fields, differences, require_same, snapshot_fields
from gpuserve.tune.snapshot import HostSnapshot

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
SCAN = json.dumps({"config": {"model_type": "glm"}, "files": [
    {"name": "model-00001.safetensors", "size": 10, "tensors": 2}]})


def snap(**changes) -> HostSnapshot:
    base = HostSnapshot(host="gpu1", sglang_version="0.5.23", lock="sglang-0.5.23@abc",
                        gpus=BOX["gpus"], checkpoint=SCAN, host_facts=BOX, host_json=None,
                        drafts={"/models/eagle3": SCAN})
    return replace(base, **changes)


def test_equal_snapshots_have_no_difference() -> None:
    a, b = snap(), snap(host="gpu2", checkpoint=SCAN.replace('"glm"', '"glm"'))
    assert differences([("gpu1", snapshot_fields(a)), ("gpu2", snapshot_fields(b))]) == []


@pytest.mark.parametrize(("changes", "field", "theirs"), [
    ({"gpus": BOX["gpus"][:4]}, "gpu count", "4"),
    ({"gpus": [{**g, "name": "NVIDIA H200"} for g in BOX["gpus"]]}, "gpu model",
     "'NVIDIA H200'"),
    ({"lock": "sglang-0.5.23@def"}, "lock", "'sglang-0.5.23@def'"),
    ({"sglang_version": "0.5.19"}, "sglang version", "'0.5.19'"),
    ({"checkpoint": SCAN.replace("10", "11")}, "checkpoint", "'1 files, scan "),
    ({"host_facts": {**BOX, "driver": {"version": "575.57.08"}}}, "driver",
     "'575.57.08'"),
    ({"host_facts": {**BOX, "cuda": {"toolkit": "12.9"}}}, "cuda", "'12.9'"),
    ({"drafts": {"/models/eagle3": SCAN.replace("10", "12")}}, "draft checkpoints",
     "'/models/eagle3: 1 files, scan "),
    ({"drafts": {}}, "draft checkpoints", "'none'"),
])
def test_a_snapshot_difference_names_host_field_and_both_values(changes, field,
                                                                theirs) -> None:
    hosts = [("gpu1", snapshot_fields(snap())), ("gpu2", snapshot_fields(snap(**changes)))]
    diff = differences(hosts)
    assert len(diff) == 1 and diff[0].startswith(f"gpu2: {field} is {theirs}"), diff
    assert "gpu1's is " in diff[0]
    with pytest.raises(InputError) as e:
        require_same("inv.py", hosts, "snapshots")
    assert "inv.py" in str(e.value) and "--limit" in str(e.value) and field in str(e.value)


def test_host_data_differences_are_bounded_and_escaped() -> None:
    a = data_fields({"cuda_lane": "13.0"})
    b = data_fields({"cuda_lane": "12.8\x1b[31m" + "x" * 200})
    (line,) = differences([("gpu1", a), ("gpu2", b)])
    assert "\x1b" not in line and len(line) < 200 and "gpu1's is '13.0'" in line


def _fake_pyinfra(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "pyinfra-ran"
    fake = tmp_path / "pyinfra"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    fake.chmod(0o755)
    return fake, mark


def _inventory(tmp_path: Path, second: dict) -> Path:
    inv = tmp_path / "inv.py"
    one = {"ssh_hostname": "192.0.2.1", "cuda_lane": "13.0", "nvidia_driver_branch": 580}
    inv.write_text(f"gpu = [('gpu1', {one!r}), ('gpu2', {({**one, **second})!r})]\n")
    return inv


def _tune_file(tmp_path: Path) -> Path:
    tune = tmp_path / "t.tune.yaml"
    tune.write_text(f"incumbent: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\nknobs:\n"
                    "  memory.cuda_graph_max_bs: [128, 256]\n")
    return tune


@pytest.mark.parametrize(("second", "words"), [
    ({"cuda_lane": "12.8"}, "gpu2: cuda_lane is '12.8', gpu1's is '13.0'"),
    ({"nvidia_driver_branch": 575}, "gpu2: nvidia_driver_branch is '575', gpu1's is '580'"),
    ({"sglang_version": "0.5.19"}, "gpu2: sglang_version is '0.5.19', gpu1's is (default)"),
])
def test_hosts_that_differ_are_refused_before_any_connection(tmp_path, capsys, second,
                                                             words) -> None:
    fake, mark = _fake_pyinfra(tmp_path)
    rc = cli_main(["tune", str(_inventory(tmp_path, second)), str(_tune_file(tmp_path)),
                   "--limit", "gpu1,gpu2", "--pyinfra", str(fake),
                   "--results", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists(), err
    assert words in err and "same box" in err, err


@pytest.mark.parametrize(("limit", "words"), [
    ("gpu1,gpu9", "unknown host 'gpu9'"), ("gpu1,gpu1", "names a host twice"),
    (",", "names no host")])
def test_limit_names_checked_before_any_connection(tmp_path, capsys, limit, words) -> None:
    fake, mark = _fake_pyinfra(tmp_path)
    rc = cli_main(["tune", str(_inventory(tmp_path, {})), str(_tune_file(tmp_path)),
                   "--limit", limit, "--pyinfra", str(fake)])
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists() and words in err, err


def test_equal_hosts_go_on_to_the_snapshots(tmp_path, capsys) -> None:
    """The same hosts pass the inventory check: the first connection is the snapshot
    (here the fake pyinfra, failing: nothing changed)."""
    fake, mark = _fake_pyinfra(tmp_path)
    rc = cli_main(["tune", str(_inventory(tmp_path, {})), str(_tune_file(tmp_path)),
                   "--limit", "gpu1,gpu2", "--pyinfra", str(fake),
                   "--results", str(tmp_path / "r")])
    err = capsys.readouterr()
    assert rc != 0 and mark.exists()
    assert "the snapshot of gpu1 failed (nothing changed)" in err.err + err.out


def test_snapshots_that_differ_are_refused_before_any_load(tmp_path, capsys) -> None:
    """The snapshots (read-only runs) go ahead; gpu2's has four GPUs: refused, naming
    host, field and both values, before any serve deploy (the fake pyinfra writes the
    snapshot it is asked for and marks any other deploy)."""
    loaded = tmp_path / "serve-ran"
    doc = {"schema": "gpuserve.tune-snapshot/1", "sglang_version": "0.5.23",
           "lock": "sglang-0.5.23@abc", "gpus": BOX["gpus"], "checkpoint": SCAN,
           "host_facts": BOX, "host_json": None}
    fake = tmp_path / "pyinfra"
    fake.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
host = args[args.index("--limit") + 1]
target = [a.split("=", 1)[1] for a in args if a.startswith("tune_snapshot=")]
if not target:
    open({str(loaded)!r}, "w").close()
    sys.exit(1)
doc = dict({doc!r}, host=host)
if host == "gpu2":
    doc["gpus"] = doc["gpus"][:4]
os.makedirs(os.path.dirname(target[0]), exist_ok=True)  # as the deploy does
open(target[0], "w").write(json.dumps(doc))
""")
    fake.chmod(0o755)
    rc = cli_main(["tune", str(_inventory(tmp_path, {})), str(_tune_file(tmp_path)),
                   "--limit", "gpu1,gpu2", "--pyinfra", str(fake),
                   "--results", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and not loaded.exists(), err
    assert "gpu2: gpu count is 4, gpu1's is 8" in err and "before any load" in err, err


class _Runner:
    """A runner that records each deploy (its op) and answers success, writing the
    snapshot a snapshot run is asked for."""

    def __init__(self, results: Path):
        self.results, self.ops = results, []

    def deploy(self, op: str, *data: str) -> tuple[int, str]:
        self.ops.append(op)
        for item in data:
            if item.startswith("tune_snapshot="):
                Path(item.split("=", 1)[1]).write_text(json.dumps({
                    "schema": "gpuserve.tune-snapshot/1", "host": "gpu2",
                    "sglang_version": "0.5.23", "lock": "sglang-0.5.23@abc",
                    "gpus": BOX["gpus"], "checkpoint": SCAN, "host_facts": BOX,
                    "host_json": None}))
        return 0, ""


@pytest.mark.parametrize("calibrates", [True, False])
def test_only_a_calibrating_host_reads_memory_after_the_incumbents_start(
        tmp_path, calibrates) -> None:
    """The first host's incumbent start calibrates the planner (a read-only snapshot
    run after it); a fleet's other hosts skip that run, whose figure nothing uses."""
    from gpuserve.commands.tune import SERVE, SNAPSHOT, PyinfraExecutor
    from gpuserve.tune.candidates import Candidate
    from gpuserve.tune.space import candidate_profile, load_tune

    spec, _ = load_tune(_tune_file(tmp_path))
    runner = _Runner(tmp_path / "r")
    executor = PyinfraExecutor(runner, spec, tmp_path / "work", "gpu2", tmp_path / "s.json")
    executor.calibrates = calibrates
    executor.measure(Candidate("inc", "incumbent", {}), candidate_profile(spec, {}, "inc"),
                     (1,), True)
    assert runner.ops[0] == SERVE
    assert (SNAPSHOT in runner.ops) is calibrates, runner.ops
