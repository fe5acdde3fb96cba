"""Are the host's collectives and GPU-to-GPU paths what the profile assumes? Checked
from the last measuring run (roles/gpu_gates) recorded on this controller.

    pytest tests/host --inventory inventory/gpu.py            # from the recorded run
    pytest tests/host --inventory inventory/gpu.py --measure  # measure again first

The record is the ``gpuserve.measure/1`` file under ``<results_dir>/<host>/``; figures
are judged again against today's expectations (gpuserve/data/gates/expectations.yaml)
or the host's baseline (its first passing record), so a tightened expectation shows here
without a new measurement. Hosts with ``gates: off`` are skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.host import nccl_env
from gpuserve.measure import gate_runs, gates
from gpuserve.measure.results import safe_name
from gpuserve.parsers import nvidia_smi

REPO_ROOT = Path(__file__).resolve().parents[2]


def _results_dir(inventory_host) -> Path:
    path = Path(str(inventory_host.data.get("results_dir", "results"))).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


@pytest.fixture(scope="module")
def measured(inventory_host, request) -> tuple[dict, list[dict]]:
    """(the last record, every record of the host), after a new measurement with
    ``--measure`` (deploy/host.py limited to this host, ``gates_remeasure=True``)."""
    settings = gate_runs.gate_settings(inventory_host.data, inventory_host.source)
    if settings.mode == "off":
        pytest.skip(f"{inventory_host.name}: gates: off")
    if request.config.getoption("--measure"):
        pyinfra = Path(sys.executable).with_name("pyinfra")
        r = subprocess.run([str(pyinfra), "-y", inventory_host.source, "deploy/host.py",
                            "--limit", inventory_host.name, "--data", "gates_remeasure=True"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=7200)
        assert r.returncode == 0, f"measuring run failed:\n{(r.stdout + r.stderr)[-4000:]}"
    host_dir = _results_dir(inventory_host) / safe_name(inventory_host.name)
    records = gates.read_measure_records(host_dir) if host_dir.is_dir() else []
    assert records, (f"{inventory_host.name}: no measuring run recorded in {host_dir}: run "
                     "deploy/host.py, or this suite with --measure")
    return records[-1], records


def _verdict(record: dict, check: str) -> dict | None:
    return next((v for v in record["verdicts"] if v.get("check") == check), None)


def test_all_reduce_busbw_at_the_gate_size_meets_expectation_or_baseline(
        inventory_host, measured):
    record, records = measured
    topology = record["topology_class"]
    assert topology is not None, "the run could not classify the host's topology"
    exp = gates.load_expectations()
    earlier = [r for r in records if r["timestamp"] < record["timestamp"]]
    gpus = (_verdict(record, "gpus_present") or {}).get("expected")
    verdicts = gates.judge_class(exp, topology, record["figures"], records=earlier,
                                 host=record["host"], gpus=gpus)
    busbw = [v for v in verdicts if v.check.startswith("all_reduce_busbw@")]
    assert busbw, f"class {topology} has no all-reduce bandwidth check"
    failed = [f"{v.check}: {v.message}" for v in verdicts if not v.passed]
    assert not failed, (f"{inventory_host.name} ({topology}, record {record['timestamp']}) "
                        "below expectation:\n  " + "\n  ".join(failed))


def test_every_gpu_took_part(gpu_host, measured):
    record, _ = measured
    v = _verdict(record, "gpus_present")
    assert v is not None, "the record has no all-reduce result (no gpus_present verdict)"
    now = len(nvidia_smi.parse_query_gpu(gpu_host.check_output(nvidia_smi.QUERY_COMMAND)))
    assert v["status"] == "pass" and v["measured"] == now, (
        f"{v['message']}; nvidia-smi lists {now} GPUs now")


def test_no_hang_on_the_chosen_path(measured):
    record, _ = measured
    choice = record["choice"]
    assert choice is not None, "no NCCL env was chosen from measurement"
    chosen = "p2p_on" if choice["p2p"] else "p2p_off"
    # all-reduce runs are labelled p2p_on/p2p_off, an EP host's others all_gather:p2p_on ...
    hung = [r for r in record["runs"] if r.get("hang")
            and (r["label"] in (chosen, "p2p_off") or r["label"].endswith(":" + chosen))]
    assert not hung, f"the chosen path hung: {hung}"
    assert choice.get("ready", True), choice["reason"]


def test_p2p_matrix_consistent_with_the_choice_and_the_env_written(gpu_host, inventory_host,
                                                                    measured):
    record, _ = measured
    v = _verdict(record, "p2p_matrix_consistent")
    assert v is not None and v["status"] in ("pass", "skip"), (
        f"P2P matrices vs the measured choice: {v['message'] if v else 'no matrices'}")
    host_doc = gate_runs.read_measured(gpu_host.file(gate_runs.MEASURED_JSON).content_string)
    assert host_doc is not None and host_doc["choice"] == record["choice"], (
        "the host's measured.json is not the last recorded run's choice")
    env = nccl_env.parse_env_file(gpu_host.file(nccl_env.NCCL_ENV_PATH).content_string)
    overrides = nccl_env.validate_overrides(inventory_host.data.get("nccl_env"))
    if "NCCL_P2P_DISABLE" not in overrides:
        assert (env.get("NCCL_P2P_DISABLE") == "1") is (not record["choice"]["p2p"]), env
    doc = json.loads(gpu_host.file(nccl_env.HOST_JSON_PATH).content_string)
    assert doc.get("measured_nccl", {}).get("p2p") is record["choice"]["p2p"]
