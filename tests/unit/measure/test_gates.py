"""gpuserve.measure.gates: figures, NCCL env choice, verdicts and records on tool output.

Fixtures are in tests/fixtures/gates/ (SOURCES.md says which are verbatim real output
and which are composed).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from gpuserve.errors import InputError
from gpuserve.host import fabric
from gpuserve.host.hostfacts import HostFacts
from gpuserve.measure import gates
from gpuserve.measure.gates import Hang, Measurement
from gpuserve.measure.results import read_results
from gpuserve.parsers import nvidia_smi
from gpuserve.parsers.nccl_tests import parse_nccl_tests
from gpuserve.parsers.p2p_bandwidth import parse_p2p_bandwidth

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GATES = FIXTURES / "gates"
GIB2 = 2147483648
GIB4 = 4294967296


def text(name: str) -> str:
    return (GATES / name).read_text()


def nccl(name: str):
    return parse_nccl_tests(text(name))


def p2p(name: str):
    return parse_p2p_bandwidth(text(name))


@pytest.fixture(scope="module")
def exp() -> gates.Expectations:
    return gates.load_expectations()


def check(exp: gates.Expectations, cls: str, key: str) -> gates.Check:
    return next(c for c in exp.classes[cls] if c.key == key)


# ---------------------------------------------------------------- figures from real output


def test_busbw_at_fixed_size_not_the_sweep_average():
    # Real tail (nccl-tests#119): the footer's average is below every row it printed.
    result = nccl("nccl_tail_nccltests119.txt")
    bw = gates.busbw_at(result, 133169160)
    assert (bw.out_of_place, bw.in_place, bw.value) == (95.74, 95.94, 95.74)
    assert gates.busbw_at(result, 132120584).value == 95.77
    assert result.avg_busbw == 84.8558 < bw.value
    assert gates.busbw_at(result, GIB2) is None


def test_busbw_and_latency_from_a_gate_run():
    result = nccl("all_reduce_h200x8_gate_composed.txt")
    assert gates.busbw_at(result, GIB4).value == 475.38
    assert result.avg_busbw < 250  # the sweep from 8 B drags the average down
    # 8 B .. 1 KiB: per row the faster half, over rows the slowest.
    assert gates.small_latency_us(result) == 18.7
    assert gates.small_latency_us(result, max_bytes=64) == 17.8
    assert gates.small_latency_us(nccl("nccl_tail_nccltests119.txt")) is None


def test_measurement_from_names_missing_size():
    result = nccl("nccl_tail_nccltests119.txt")
    with pytest.raises(InputError, match=r"no row at 2147483648 bytes .*132120584, 133169160"):
        gates.measurement_from(result, GIB2)
    m = gates.measurement_from(nccl("all_reduce_pro6000x8_p2p_off_composed.txt"), GIB2,
                               {"NCCL_P2P_DISABLE": "1"})
    assert (m.busbw_gbs, m.latency_us, m.env) == (25.81, 35.2, {"NCCL_P2P_DISABLE": "1"})


def test_nccl_version_from_header_and_banner():
    assert gates.nccl_version(text("all_reduce_h200x8_gate_composed.txt")) == "2.30.7"
    # nccl-library=22703 and NCCL's own "NCCL version 2.27.3+cuda13.0" agree.
    mixed = text("nccl_full_mpirun_composed.txt")
    assert gates.nccl_version(mixed) == "2.27.3"
    banner = "\n".join(line for line in mixed.splitlines() if "nccl-library" not in line)
    assert gates.nccl_version(banner) == "2.27.3"
    assert gates.nccl_version(text("nccl_header_nccl1530.txt")) is None


def test_p2p_figures_from_matrices():
    on = gates.p2p_figures(p2p("p2p_bw_pro6000x2_p2p_on_composed.txt"))
    assert on == {"p2p_unidir_best": 54.12, "p2p_unidir_worst": 53.87,
                  "p2p_bidir_best": 108.33, "p2p_latency_worst": 0.43}
    # Real partial output (tinygrad#44): only the P2P=Disabled matrix, so no figures.
    assert gates.p2p_figures(p2p("p2p_bw_tinygrad44.txt")) == {}


# ---------------------------------------------------------------- topology class


def _facts(name: str) -> dict:
    return json.loads((FIXTURES / "hostfacts" / f"{name}.json").read_text())


def test_topology_class_from_facts():
    assert gates.topology_class(_facts("h200-nvlink")) == "nvlink4"
    assert gates.topology_class(_facts("reference-box-kvm")) == "pcie-no-p2p"
    bare = _facts("bare-metal-p2p")
    assert gates.topology_class(bare) == "pcie-p2p"  # no link fields: gen/width unknown
    assert gates.topology_class(HostFacts.from_dict(bare)) == "pcie-p2p"
    for gpu in bare["gpus"]:
        gpu.update(pcie_link_gen_max=5, pcie_link_width_max=16)
    assert gates.topology_class(bare) == "pcie5-x16-p2p"
    bare["gpus"][3]["pcie_link_width_max"] = 8  # one slot at x8: not the Gen5 x16 figure
    assert gates.topology_class(bare) == "pcie-p2p"
    # The measurement overrides the driver's verdict.
    assert gates.topology_class(bare, measured_p2p=False) == "pcie-no-p2p"
    assert gates.topology_class(_facts("reference-box-kvm"), measured_p2p=True) == "pcie-p2p"
    assert gates.topology_class({}) is None


def test_topology_class_nvlink_generation_from_name():
    doc = _facts("h200-nvlink")
    for gpu in doc["gpus"]:
        gpu["name"] = "NVIDIA A100-SXM4-80GB"
    assert gates.topology_class(doc) == "nvlink-other"
    for gpu in doc["gpus"]:
        gpu["name"] = "NVIDIA H800"  # NVLink 4 cut to 400 GB/s: not the 475 GB/s figure
    assert gates.topology_class(doc) == "nvlink-other"


# ---------------------------------------------------------------- NCCL env choice


ON = gates.measurement_from(nccl("all_reduce_pro6000x8_p2p_on_composed.txt"), GIB2)
OFF = gates.measurement_from(nccl("all_reduce_pro6000x8_p2p_off_composed.txt"), GIB2,
                             {"NCCL_P2P_DISABLE": "1"})


def test_choice_p2p_on_when_measured_faster():
    choice = gates.choose_nccl_env("ok", ON, OFF)
    assert choice.p2p and choice.env == {} and choice.sglang_flags == []
    assert "38.37 vs 25.81 GB/s" in choice.reason
    assert choice.numbers["gain"] == pytest.approx(38.37 / 25.81 - 1, abs=1e-4)
    assert choice.to_dict()["numbers"]["p2p_off"]["busbw_gbs"] == 25.81


def test_choice_hang_keeps_p2p_off():
    choice = gates.choose_nccl_env("ok", Hang("all_reduce_perf", 300), OFF)
    assert not choice.p2p and choice.env == {"NCCL_P2P_DISABLE": "1"}
    assert choice.sglang_flags == ["--disable-custom-all-reduce"]
    assert "hung (all_reduce_perf, killed after 300 s)" in choice.reason
    assert choice.numbers["p2p_on"] == {"hang": True, "tool": "all_reduce_perf",
                                        "timeout_s": 300}
    # The hung run's output: a header, no rows, no "concluded" footer.
    hung = nccl("all_reduce_pro6000x8_hang_composed.txt")
    assert hung.rows == [] and not hung.concluded
    verdict = gates.judge_hang(Hang("all_reduce_perf", 300))
    assert verdict.status == "fail" and "300 s" in verdict.message


def test_choice_slower_or_marginal_p2p_stays_off():
    slower = gates.choose_nccl_env("ok", OFF, ON)  # swapped: "P2P on" is the slow one
    assert not slower.p2p and "not faster by 10%" in slower.reason
    marginal = Measurement(OFF.busbw_gbs * 1.05, GIB2, OFF.latency_us)
    assert not gates.choose_nccl_env("ok", marginal, OFF).p2p
    assert gates.choose_nccl_env("ok", marginal, OFF, margin=0.04).p2p
    worse_latency = Measurement(ON.busbw_gbs, GIB2, latency_us=50.0)
    choice = gates.choose_nccl_env("ok", worse_latency, OFF)
    assert not choice.p2p and "latency (50 vs 35.2 us)" in choice.reason


def test_choice_driver_verdict_and_unmeasured():
    assert not gates.choose_nccl_env("none", None, OFF).p2p
    assert "verdict is partial" in gates.choose_nccl_env("partial", None, OFF).reason
    unmeasured = gates.choose_nccl_env("ok", None, OFF)
    assert not unmeasured.p2p and "not measured" in unmeasured.reason


def test_choice_when_p2p_off_hangs():
    only_on = gates.choose_nccl_env("ok", ON, Hang("all_reduce_perf", 300, OFF.env))
    assert only_on.p2p and only_on.ready
    both = gates.choose_nccl_env("ok", Hang("all_reduce_perf", 300), Hang("all_reduce_perf", 300))
    assert not both.p2p and not both.ready and "no working collective path" in both.reason
    with pytest.raises(ValueError, match="different sizes"):
        gates.choose_nccl_env("ok", Measurement(40.0, GIB4), OFF)


# ---------------------------------------------------------------- verdicts


def test_judge_nvlink_expectation(exp):
    c = check(exp, "nvlink4", "all_reduce_busbw@4294967296")
    measured = gates.busbw_at(nccl("all_reduce_h200x8_gate_composed.txt"), GIB4).value
    verdict = gates.judge(c, measured, gpus=8)
    assert verdict.status == "pass" and verdict.expected == 475 and verdict.reference == \
        "expectation"
    assert verdict.limit == pytest.approx(399.0)
    low = gates.judge(c, 380.0, gpus=8)
    assert low.status == "fail" and "380 GB/s vs expectation 475 GB/s" in low.message
    assert "below the limit" in low.message and "nccl-tests/issues/272" in low.source
    assert gates.judge(c, 380.0, gpus=4).status == "skip"  # published for 8 GPUs
    assert gates.judge(c, None, gpus=8).status == "missing"


def test_judge_pcie_p2p_expectation(exp):
    c = check(exp, "pcie5-x16-p2p", "all_reduce_busbw@2147483648")
    assert gates.judge(c, ON.busbw_gbs, gpus=8).status == "pass"
    assert gates.judge(c, OFF.busbw_gbs, gpus=8).status == "fail"  # P2P-off figure
    lat = check(exp, "pcie5-x16-p2p", "p2p_latency_worst")
    figures = gates.p2p_figures(p2p("p2p_bw_pro6000x2_p2p_on_composed.txt"))
    assert gates.judge(lat, figures["p2p_latency_worst"]).passed
    staged = gates.p2p_figures(p2p("p2p_bw_pro6000x2_can_but_staged_composed.txt"))
    v = gates.judge(lat, staged["p2p_latency_worst"])
    assert v.status == "fail" and "above the limit" in v.message and v.limit == 0.9


def test_judge_baseline_mode(exp):
    c = check(exp, "pcie-no-p2p", "all_reduce_busbw@2147483648")
    first = gates.judge(c, OFF.busbw_gbs)
    assert first.status == "baseline" and first.passed and first.expected is None
    again = gates.judge(c, 20.0, baseline=OFF.busbw_gbs)
    assert again.status == "pass" and again.reference == "baseline"
    fallen = gates.judge(c, 17.0, baseline=OFF.busbw_gbs)  # below 70% of 25.81
    assert fallen.status == "fail" and fallen.limit == pytest.approx(25.81 * 0.7)
    floor = gates.judge(c, 8.0)
    assert floor.status == "fail" and floor.reference == "floor" and floor.limit == 10


def test_judge_gpus_present():
    full = gates.judge_gpus(nccl("all_reduce_pro6000x8_p2p_on_composed.txt"), 8)
    assert full.passed and full.measured == 8
    short = gates.judge_gpus(nccl("all_reduce_pro6000x7_missing_gpu_composed.txt"), 8)
    assert short.status == "fail" and "7 of the host's 8 GPUs" in short.message
    # Real header (nccl#1530), as quoted with rank lines 2-7 left out: 2 ranks seen.
    quoted = gates.judge_gpus(nccl("nccl_header_nccl1530.txt"), 8)
    assert quoted.status == "fail" and quoted.measured == 2
    assert gates.judge_gpus(nccl("nccl_tail_nccltests119.txt"), 8).status == "missing"


def test_judge_p2p_matrix_consistency(exp):
    working = p2p("p2p_bw_pro6000x2_p2p_on_composed.txt")
    assert gates.judge_p2p_matrix(working, True, exp).status == "pass"
    stale = gates.judge_p2p_matrix(working, False, exp)
    assert stale.status == "fail" and "stale" in stale.message
    # "CAN Access Peer" but Enabled == Disabled: the P2P path is the staged copy.
    staged = p2p("p2p_bw_pro6000x2_can_but_staged_composed.txt")
    assert staged.peer_access["0->1"] is True
    broken = gates.judge_p2p_matrix(staged, True, exp)
    assert broken.status == "fail" and "only 0 of 2 GPU pairs" in broken.message
    no_p2p = p2p("p2p_bw_full_composed.txt")
    assert gates.judge_p2p_matrix(no_p2p, False, exp).status == "pass"
    assert gates.judge_p2p_matrix(p2p("p2p_bw_tinygrad44.txt"), True, exp).status == "missing"
    # Old layout without latency tables' GPU/CPU split still has the single GPU table.
    old = parse_p2p_bandwidth((FIXTURES / "gpuhost" / "p2p_bw_old_layout_composed.txt")
                              .read_text())
    assert gates.judge_p2p_matrix(old, True, exp).status == "pass"


# ---------------------------------------------------------------- records


def _record(host: str, stamp: str, busbw: float) -> dict:
    choice = gates.choose_nccl_env("none", None, OFF)
    c = gates.load_expectations().classes["pcie-no-p2p"][0]
    return gates.measure_record(
        gates.RecordHeader(host, stamp, "pcie-no-p2p", gates.load_sources(),
                           gates.nccl_version(text("all_reduce_pro6000x8_p2p_off_composed.txt"))),
        runs=[{"tool": "all_reduce_perf", "argv": ["-b", "1G", "-e", "2G", "-g", "8"],
               "env": OFF.env, "gpus": 8, "sizes": [1073741824, GIB2],
               "figures": {c.key: busbw}, "hang": None}],
        figures={c.key: busbw}, choice=choice, verdicts=[gates.judge(c, busbw)],
    )


def test_record_round_trip_and_baseline(tmp_path):
    first = gates.write_measure_record(tmp_path, _record("gpu1", "2026-12-01T01:00:00Z", 25.81))
    second = gates.write_measure_record(tmp_path, _record("gpu1", "2026-12-01T02:00:00Z", 21.0))
    same_second = gates.write_measure_record(tmp_path,
                                             _record("gpu1", "2026-12-01T02:00:00Z", 21.0))
    assert first.name == "20261201T010000Z-measure-gates.json"
    assert second.name == "20261201T020000Z-measure-gates.json"
    assert same_second.name == "20261201T020000Z-measure-gates-2.json"
    records = gates.read_measure_records(tmp_path / "gpu1")
    assert [r["figures"]["all_reduce_busbw@2147483648"] for r in records] == [25.81, 21.0, 21.0]
    doc = records[0]
    assert doc["tools"]["nccl-tests"]["commit"] == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"
    assert doc["nccl_version"] == "2.30.7"
    assert doc["choice"]["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert doc["verdicts"][0]["status"] == "baseline"
    key = "all_reduce_busbw@2147483648"
    assert gates.baseline_for(records, "gpu1", "pcie-no-p2p", key) == 25.81
    assert gates.baseline_for(records, "gpu2", "pcie-no-p2p", key) is None
    assert gates.baseline_for(records, "gpu1", "pcie-p2p", key) is None
    # results.py's readers skip measure records (another gpuserve schema) and say why.
    skipped: list[str] = []
    assert read_results(tmp_path, skipped) == []
    assert any("gpuserve.measure/1" in s for s in skipped)


def test_record_validation_names_field(tmp_path):
    doc = _record("gpu1", "2026-12-01T01:00:00Z", 25.81)
    with pytest.raises(InputError, match="figures"):
        gates.validate_measure_record({**doc, "figures": {"busbw": 1.0}}, "x.json")
    with pytest.raises(InputError, match="topology_class: unknown class 'nvlink9'"):
        gates.validate_measure_record({**doc, "topology_class": "nvlink9"}, "x.json")
    with pytest.raises(InputError, match="x.json: schema"):
        gates.validate_measure_record({**doc, "schema": "gpuserve.result/2"}, "x.json")


def test_a_failed_first_run_is_no_baseline(tmp_path):
    c = gates.load_expectations().classes["pcie-no-p2p"][0]
    below_floor = _record("gpu1", "2026-12-01T01:00:00Z", 8.0)
    below_floor["verdicts"] = [gates.judge(c, 8.0).to_dict()]
    assert below_floor["verdicts"][0]["status"] == "fail"
    later = _record("gpu1", "2026-12-01T02:00:00Z", 24.0)
    assert gates.baseline_for([later, below_floor], "gpu1", "pcie-no-p2p", c.key) == 24.0


def test_judge_class_end_to_end(exp, tmp_path):
    run = nccl("all_reduce_pro6000x8_p2p_off_composed.txt")
    checks = exp.classes["pcie-no-p2p"]
    figures = gates.gate_figures(checks, run)
    assert figures == {"all_reduce_busbw@2147483648": 25.81, "all_reduce_latency@1024": 35.2}
    first = gates.judge_class(exp, "pcie-no-p2p", figures, host="gpu1", gpus=8)
    assert [v.status for v in first] == ["baseline", "baseline"]
    gates.write_measure_record(tmp_path, _record("gpu1", "2026-12-01T01:00:00Z", 25.81))
    records = gates.read_measure_records(tmp_path / "gpu1")
    slower = {**figures, "all_reduce_busbw@2147483648": 15.0}
    later = gates.judge_class(exp, "pcie-no-p2p", slower, records=records, host="gpu1")
    assert later[0].status == "fail" and later[0].expected == 25.81
    assert later[1].status == "baseline"  # the first record has no latency figure
    # An NVLink class needs the P2P matrix too: without it that check is "missing".
    h200 = gates.gate_figures(exp.classes["nvlink4"], nccl("all_reduce_h200x8_gate_composed.txt"))
    statuses = {v.check: v.status
                for v in gates.judge_class(exp, "nvlink4", h200, host="h200a", gpus=8)}
    assert statuses == {"all_reduce_busbw@4294967296": "pass", "p2p_bidir_best": "missing",
                        "all_reduce_latency@1024": "baseline"}


# --------------------------------------------------------------------------------------
# gpuserve/data/gates: the shipped pins and expectations load, and bad data is refused with an error
# naming the file and the field.


def test_shipped_sources_are_pinned():
    sources = gates.load_sources()
    nccl, samples = sources["nccl-tests"], sources["cuda-samples"]
    # The commit the reference notes built (gpu-gates.md: NVIDIA/nccl-tests@a0b82b2260cf).
    assert nccl.commit == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432" and nccl.tag == "v2.19.6"
    assert samples.commit == "3f1c50965017932fc81e6d94a3fc9e04c105b312" and samples.tag == "v13.0"
    assert {"all_reduce_perf", "all_gather_perf", "alltoall_perf"} <= set(nccl.binaries)
    assert samples.binaries == ("p2pBandwidthLatencyTest",)
    notes = " ".join(nccl.build["notes"])
    assert "libnccl.so -> libnccl.so.2" in notes and "cannot find -lcudadevrt" in notes
    assert samples.build["subdir"] == "Samples/5_Domain_Specific/p2pBandwidthLatencyTest"


def test_commit_check_after_checkout():
    nccl = gates.load_sources()["nccl-tests"]
    nccl.check_commit("a0b82b2260cf5152b9f8c061bbf7eaf0ba096432\n")
    with pytest.raises(InputError, match=r"tools.nccl-tests.commit: checkout is at '5bcd45d"):
        nccl.check_commit("5bcd45d2ee8365e37895e118c9d11b0ebc15aa69", "/opt/gpuserve/nccl-tests")
    with pytest.raises(InputError, match="no pinned sha256"):
        nccl.check_archive(b"")


def test_mirror_override_keeps_the_pin():
    sources = gates.load_sources(overrides={"nccl-tests": {"url": "http://mirror.lan/nccl-tests.git"}})
    assert sources["nccl-tests"].url == "http://mirror.lan/nccl-tests.git"
    assert sources["nccl-tests"].commit == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"
    assert sources["cuda-samples"].url == "https://github.com/NVIDIA/cuda-samples.git"
    with pytest.raises(InputError, match="gates_sources.nccl: unknown tool"):
        gates.load_sources(overrides={"nccl": {"url": "http://mirror.lan/x.git"}})
    with pytest.raises(InputError, match="may only set 'url'"):
        gates.load_sources(overrides={"nccl-tests": {"commit": "0" * 40}})


def _write(tmp_path: Path, doc: dict, name: str) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _sources_doc() -> dict:
    return yaml.safe_load(gates.SOURCES_PATH.read_text())


def test_archive_sha256_mismatch_is_refused(tmp_path):
    data = b"cuda-samples-13.0.tar.gz bytes"
    doc = _sources_doc()
    doc["tools"]["cuda-samples"].pop("commit")
    doc["tools"]["cuda-samples"]["url"] = "https://example.org/cuda-samples-13.0.tar.gz"
    doc["tools"]["cuda-samples"]["sha256"] = hashlib.sha256(data).hexdigest()
    src = gates.load_sources(_write(tmp_path, doc, "sources.yaml"))["cuda-samples"]
    src.check_archive(data)
    with pytest.raises(InputError, match=r"tools.cuda-samples.sha256: archive sha256 is "):
        src.check_archive(data + b"x", "cuda-samples-13.0.tar.gz")


@pytest.mark.parametrize(("edit", "field", "words"), [
    (lambda d: d["tools"]["nccl-tests"].update(commit="a0b82b2260cf"), "tools.nccl-tests.commit",
     "full 40-hex"),
    (lambda d: d["tools"]["nccl-tests"].pop("commit"), "tools.nccl-tests", "needs a pinned"),
    (lambda d: d["tools"]["cuda-samples"].update(sha256="ABC"), "tools.cuda-samples.sha256",
     "64 lowercase hex"),
    (lambda d: d["tools"]["nccl-tests"].pop("source"), "tools.nccl-tests.source", "where"),
    (lambda d: d["tools"]["nccl-tests"].update(url="github.com/x"), "tools.nccl-tests.url",
     "must be a URL"),
    (lambda d: d.update(schema="v0"), "schema", "gpuserve.gate-sources/1"),
])
def test_bad_sources(tmp_path, edit, field, words):
    doc = _sources_doc()
    edit(doc)
    path = _write(tmp_path, doc, "sources.yaml")
    with pytest.raises(InputError) as info:
        gates.load_sources(path)
    assert f"{path}: {field}: " in str(info.value) and words in str(info.value)


# ---------------------------------------------------------------- expectations


def test_shipped_expectations():
    exp = gates.load_expectations()
    assert set(exp.classes) == set(gates.TOPOLOGY_CLASSES)
    for name, checks in exp.classes.items():
        assert checks, name
        busbw = [c for c in checks if c.metric == "all_reduce_busbw"]
        assert len(busbw) == 1 and busbw[0].size_bytes >= 2**30, name  # a fixed large size
        for c in checks:
            assert c.source.strip() and 0 <= c.tolerance <= 1
            assert (c.expected is None) == c.baseline
    nv = {c.key: c for c in exp.classes["nvlink4"]}
    assert nv["all_reduce_busbw@4294967296"].expected == 475
    pcie = {c.key: c for c in exp.classes["pcie5-x16-p2p"]}
    assert 37 <= pcie["all_reduce_busbw@2147483648"].expected <= 41
    assert pcie["p2p_unidir_best"].expected == 53
    no_p2p = exp.classes["pcie-no-p2p"][0]
    assert no_p2p.baseline and no_p2p.floor == 10 and no_p2p.tolerance == 0.3
    assert exp.p2p_margin == 0.1 and exp.latency_ratio_max == 0.5


def _exp_doc() -> dict:
    return yaml.safe_load(gates.EXPECTATIONS_PATH.read_text())


def _first_check(d: dict) -> dict:
    return d["classes"]["nvlink4"]["checks"][0]


@pytest.mark.parametrize(("edit", "field", "words"), [
    (lambda d: d["classes"].update({"pcie7-x32": copy.deepcopy(d["classes"]["pcie-p2p"])}),
     "classes.pcie7-x32", "unknown topology class"),
    (lambda d: d["classes"].pop("pcie-no-p2p"), "classes", "missing topology class"),
    (lambda d: _first_check(d).update(unit="Gbit/s"), "classes.nvlink4.checks[0].unit",
     "unknown unit 'Gbit/s'"),
    (lambda d: _first_check(d).update(metric="busbw"), "classes.nvlink4.checks[0].metric",
     "unknown metric"),
    (lambda d: _first_check(d).update(tolerance=1.5), "classes.nvlink4.checks[0].tolerance",
     "from 0 to 1"),
    (lambda d: _first_check(d).update(tolerance=-0.1), "classes.nvlink4.checks[0].tolerance",
     "from 0 to 1"),
    (lambda d: _first_check(d).pop("source"), "classes.nvlink4.checks[0].source",
     "needs a source"),
    (lambda d: _first_check(d).update(baseline=True), "classes.nvlink4.checks[0]",
     "not both"),
    (lambda d: _first_check(d).pop("size_bytes"), "classes.nvlink4.checks[0].size_bytes",
     "fixed size"),
    (lambda d: d["choice"].update(p2p_margin=2), "choice.p2p_margin", "from 0 to 1"),
    (lambda d: d["classes"]["nvlink4"]["checks"][2].update(floor=5),
     "classes.nvlink4.checks[2].floor", "only bandwidths have a floor"),
])
def test_bad_expectations(tmp_path, edit, field, words):
    doc = _exp_doc()
    edit(doc)
    path = _write(tmp_path, doc, "expectations.yaml")
    with pytest.raises(InputError) as info:
        gates.load_expectations(path)
    assert f"{path}: {field}: " in str(info.value) and words in str(info.value)


# --------------------------------------------------------------------------------------
# The measured gates on an NVSwitch box: the lab's hgx-h100 (8x H100 SXM, every pair NV18: topo -m
# rows of ThunderKittens#167) is judged against the NVLink 4 figures, not a PCIe baseline.


BOX = Path(__file__).resolve().parents[3] / "lab" / "nvidia_repo" / "boxes" / "hgx-h100"


def _facts_nvswitch() -> dict:
    box = json.loads((BOX / "box.json").read_text())
    links = nvidia_smi.parse_topo_matrix((BOX / "topo-m.txt").read_text()).to_json()["links"]
    gpus = [{k: g[k] for k in ("index", "name", "uuid", "bus_id", "memory_total_mib",
                              "compute_cap")} for g in box["gpus"]]
    return {"virtualization": "none", "gpus": gpus, "topology": {"links": links, "p2p": "ok"}}


def test_hgx_h100_expects_nvlink_bandwidth():
    facts = _facts_nvswitch()
    assert fabric.detect(links=facts["topology"]["links"]).nvswitch
    assert gates.topology_class(facts) == "nvlink4"
    checks = gates.load_expectations().classes["nvlink4"]
    busbw = [c for c in checks if c.metric == "all_reduce_busbw"]
    assert busbw and busbw[0].expected >= 400
