"""gpuserve compare shows the host deploy's measured GPU gates (gpuserve.measure/1
records) side by side: all-reduce busbw at the gate size against its expectation or
baseline, the small-message latency, P2P on/off and why, all-gather/all-to-all on EP
hosts; control characters from records escaped like the other views.

The records are what the measuring stage writes (gate_runs.evaluate of the composed
outputs in tests/fixtures/gates, labelled composed there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.measure import compare as cmp
from gpuserve.measure import gate_runs as gr
from gpuserve.measure import gates
from gpuserve.measure.results import read_results
from tests.unit.measure.test_gate_runs import EP_TEXTS, MATRIX_NONE, OFF, _evaluate

RESULTS = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def _slow(records=()) -> gr.Evaluation:
    """A VM measured before (its baseline), now at half speed (the lab's gates-slow)."""
    import tests.unit.doctor.test_doctor_measured as dm

    return dm._evaluation("none", {"p2p_off": OFF, "matrix": MATRIX_NONE},
                          virtualization="kvm", records=records, slow=2)


def _write(root: Path, record: dict, **changes) -> Path:
    return gates.write_measure_record(root, {**record, **changes})


@pytest.fixture
def results(tmp_path: Path) -> Path:
    ep = _evaluate("ok", EP_TEXTS, collectives=gr.COLLECTIVES)  # bare metal, P2P kept on
    _write(tmp_path, ep.record)
    hung = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_NONE})
    _write(tmp_path, hung.record, host="gpu2", timestamp="2026-12-01T09:00:00Z")
    vm = _evaluate("none", {"p2p_off": OFF, "matrix": MATRIX_NONE}, virtualization="kvm")
    _write(tmp_path, vm.record, host="vm1", timestamp="2026-12-01T08:00:00Z")
    slow = _slow(records=[vm.record])
    _write(tmp_path, slow.record, host="vm1", timestamp="2026-12-01T12:00:00Z")
    return tmp_path


def test_latest_per_host_side_by_side(results: Path):
    measures: list[dict] = []
    assert read_results(results, [], measures) == []
    rows = {r.host: r for r in cmp.gate_view(measures)}
    assert list(rows) == ["gpu1", "gpu2", "vm1"]
    gpu1, gpu2, vm1 = rows["gpu1"], rows["gpu2"], rows["vm1"]
    assert (gpu1.p2p, gpu1.busbw_gbs, gpu1.size_bytes) == (True, 38.37, 2147483648)
    assert (gpu1.p2p_on_gbs, gpu1.p2p_off_gbs, gpu1.latency_us) == (38.37, 25.81, 26.4)
    assert (gpu1.all_gather_gbs, gpu1.alltoall_gbs) == (37.3, 28.8) and gpu1.passed
    assert gpu2.p2p_result == "hung" and gpu2.p2p_on_hung and gpu2.env == {
        "NCCL_P2P_DISABLE": "1"}
    assert gpu2.all_gather_gbs is None and gpu2.passed
    assert vm1.runs == 2 and vm1.busbw_gbs == 12.9 and vm1.busbw_status == "fail"
    assert (vm1.busbw_reference, vm1.busbw_reference_kind) == (25.81, "baseline")
    assert not vm1.passed and "all_reduce_busbw@2147483648" in vm1.failed
    history = cmp.gate_view(measures, history=True)
    assert [(r.host, r.timestamp) for r in history][-2:] == [
        ("vm1", "2026-12-01T08:00:00Z"), ("vm1", "2026-12-01T12:00:00Z")]


def test_text_and_json(results: Path, capsys):
    assert main(["compare", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("measured GPU gates, latest per host")
    line = next(x for x in out.splitlines() if x.startswith("gpu1 "))
    for cell in ("pcie-p2p", " on ", "38.37 @2G", "new baseline", "26.4", "38.37/25.81",
                 "37.30", "28.80", "2.30.7", "pass"):
        assert cell in line, (cell, line)
    gpu2 = next(x for x in out.splitlines() if x.startswith("gpu2 "))
    assert "off (hung)" in gpu2 and "hung/25.81" in gpu2 and "-/" not in gpu2
    vm1 = next(x for x in out.splitlines() if x.startswith("vm1 "))
    assert "12.90 @2G" in vm1 and "FAIL (base 25.81)" in vm1 and "-/12.90" in vm1
    assert vm1.rstrip().endswith("FAIL")
    assert "vm1 2026-12-01T12:00:00Z: all_reduce_busbw@2147483648, all_reduce_latency@1024" \
        in out
    assert main(["compare", str(results), "--json", "--history"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["view"] == "history" and len(doc["gates"]) == 4 and doc["skipped"] == []
    first = doc["gates"][0]
    assert first["host"] == "gpu1" and first["all_gather_busbw_gbs"] == 37.3
    assert first["passed"] is True and first["source"].endswith("-measure-gates.json")


def test_beside_result_records_and_filtered_by_host(results: Path, capsys):
    assert main(["compare", str(RESULTS), str(results)]) == 0
    out = capsys.readouterr().out
    assert out.index("out tok/s") < out.index("measured GPU gates")
    assert main(["compare", str(RESULTS), str(results), "--host", "vm1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["host"] for g in doc["gates"]] == ["vm1"] and "rows" not in doc
    assert main(["compare", str(results), "--host", "gpu9"]) == 2
    assert "--host: no record with host 'gpu9' (known: gpu1, gpu2, vm1)" in \
        capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main(["compare", str(results), "--plot", str(results / "x.png")]) == 2
    assert "no result records to plot" in capsys.readouterr().err


def test_control_characters_from_records_are_escaped(results: Path, capsys):
    rec = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_NONE}).record
    _write(results, rec, host="gpu3\x1b[2J", timestamp="2026-12-01T13:00:00Z",
           nccl_version="2.30.7\r\u202espoof")
    assert main(["compare", str(results)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in ("\x1b", "\r", "\u202e"))
    assert "gpu3\\x1b[2J" in out and "2.30.7\\r\\u202espoof" in out
    header, rule = out.splitlines()[1:3]
    row = next(x for x in out.splitlines() if x.startswith("gpu3"))
    assert row.index("2026-12-01T13") == header.index("when"), "columns stay aligned"
    assert main(["compare", str(results), "--json"]) == 0
    hosts = [g["host"] for g in json.loads(capsys.readouterr().out)["gates"]]
    assert "gpu3\x1b[2J" in hosts, "--json keeps the data unchanged"


def test_a_broken_measure_record_names_its_file(tmp_path: Path, capsys):
    bad = tmp_path / "gpu1" / "x-measure-gates.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"schema": "gpuserve.measure/1", "host": "gpu1",
                               "timestamp": "t", "figures": {"bogus@1": 1}, "runs": [],
                               "verdicts": []}))
    assert main(["compare", str(tmp_path)]) == 2  # nothing usable left
    err = capsys.readouterr().err
    assert "no result records found (1 non-result files skipped)" in err
    skipped: list[str] = []
    assert read_results(tmp_path, skipped, []) == []
    assert "x-measure-gates.json: figures: must map" in skipped[0]
    assert "(not a usable gpuserve.measure/1 record)" in skipped[0]
    # without asking for them, measure records are skipped as before
    skipped = []
    assert read_results(tmp_path, skipped) == [] and "gpuserve.measure/1" in skipped[0]
