"""lab/gate_tools: the stand-in measuring tools print the recorded outputs in formats the
product's parsers read, follow the box and NCCL_P2P_DISABLE, and hang or slow down on
their switches (run with the guest's /etc/gpuserve-lab paths moved into tmp_path)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gpuserve.measure import gate_runs as gr
from gpuserve.measure import gates
from gpuserve.parsers.nccl_tests import parse_nccl_tests
from gpuserve.parsers.p2p_bandwidth import parse_p2p_bandwidth
from lab import gate_tools

BOXES = Path(__file__).resolve().parents[3] / "lab/nvidia_repo/boxes"


def _tool(tmp_path: Path, name: str) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    script = gate_tools.standin_script().replace("/etc/gpuserve-lab", str(etc))
    path = tmp_path / name
    path.write_text(script.replace("@TOOL@", name))
    path.chmod(0o755)
    return path


def _run(tool: Path, env: dict | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), "-g", "8"], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def test_archives_are_byte_identical_and_published_with_their_digests(tmp_path):
    assert gate_tools.archives() == gate_tools.archives()
    gate_tools.publish(tmp_path)
    first = (tmp_path / "gates/nccl-tests-lab.tar.gz").stat().st_mtime_ns
    gate_tools.publish(tmp_path)  # unchanged inputs: nothing rewritten
    assert (tmp_path / "gates/nccl-tests-lab.tar.gz").stat().st_mtime_ns == first
    digest = gate_tools.archive_sha256(tmp_path, "nccl-tests-lab.tar.gz")
    src = gates.load_sources(overrides={"nccl-tests": {"url": "http://m/x", "sha256": digest}})
    src["nccl-tests"].check_archive((tmp_path / "gates/nccl-tests-lab.tar.gz").read_bytes())
    assert gate_tools.archive_sha256(tmp_path / "nowhere", "nccl-tests-lab.tar.gz") is None


def test_all_reduce_follows_box_and_p2p_switch(tmp_path):
    tool = _tool(tmp_path, "all_reduce_perf")
    (tmp_path / "etc/box").write_text("rtxpro6000-baremetal\n")
    on = parse_nccl_tests(_run(tool).stdout)
    off = parse_nccl_tests(_run(tool, {"NCCL_P2P_DISABLE": "1"}).stdout)
    assert gates.busbw_at(on, 2147483648).value == 38.37
    assert gates.busbw_at(off, 2147483648).value == 25.81
    (tmp_path / "etc/box").write_text("rtxpro6000-kvm\n")
    assert gates.busbw_at(parse_nccl_tests(_run(tool).stdout), 2147483648).value == 25.81
    # the reference box with its P2P clique: P2P on as on bare metal, off with the switch
    (tmp_path / "etc/box").write_text("rtxpro6000-kvm-p2p\n")
    assert gates.busbw_at(parse_nccl_tests(_run(tool).stdout), 2147483648).value == 38.37
    off = _run(tool, {"NCCL_P2P_DISABLE": "1"}).stdout
    assert gates.busbw_at(parse_nccl_tests(off), 2147483648).value == 25.81
    (tmp_path / "etc/box").write_text("h200-nvlink\n")
    assert gates.busbw_at(parse_nccl_tests(_run(tool).stdout), 4294967296).value > 470


def test_p2p_matrix_follows_the_box(tmp_path):
    tool = _tool(tmp_path, "p2pBandwidthLatencyTest")
    (tmp_path / "etc/box").write_text("rtxpro6000-baremetal\n")
    assert "p2p_latency_worst" in gates.p2p_figures(parse_p2p_bandwidth(_run(tool).stdout))
    (tmp_path / "etc/box").write_text("rtxpro6000-kvm\n")
    report = parse_p2p_bandwidth(_run(tool).stdout)
    assert not gates.judge_p2p_matrix(report, True, gates.load_expectations()).passed


def test_hang_switch_only_with_p2p_and_slow_switch(tmp_path):
    tool = _tool(tmp_path, "all_reduce_perf")
    (tmp_path / "etc/box").write_text("rtxpro6000-baremetal\n")
    (tmp_path / "etc/gates-hang").write_text("all_reduce_perf p2p\n")
    r = subprocess.run(["timeout", "2", str(tool)], capture_output=True, text=True)
    assert r.returncode == 124
    assert _run(tool, {"NCCL_P2P_DISABLE": "1"}).returncode == 0
    (tmp_path / "etc/gates-hang").unlink()
    (tmp_path / "etc/gates-slow").write_text("4\n")
    slow = parse_nccl_tests(_run(tool).stdout)
    assert abs(gates.busbw_at(slow, 2147483648).value - 38.37 / 4) < 0.01


def test_ep_collectives_follow_box_and_p2p_switch(tmp_path):
    # all_gather_perf / alltoall_perf (EP hosts): composed in nccl-tests' real layout
    for name, on_bw, off_bw in (("all_gather_perf", 37.3, 24.22),
                                ("alltoall_perf", 28.8, 17.77)):
        tool = _tool(tmp_path, name)
        (tmp_path / "etc/box").write_text("rtxpro6000-baremetal\n")
        on = parse_nccl_tests(_run(tool).stdout)
        assert on.collective == name and len(on.ranks) == 8 and on.ok
        assert gates.busbw_at(on, 2147483648).value == on_bw
        off = parse_nccl_tests(_run(tool, {"NCCL_P2P_DISABLE": "1"}).stdout)
        assert gates.busbw_at(off, 2147483648).value == off_bw
        (tmp_path / "etc/box").write_text("rtxpro6000-kvm\n")
        assert gates.busbw_at(parse_nccl_tests(_run(tool).stdout), 2147483648).value == off_bw


def test_tools_without_a_recording_say_so(tmp_path):
    tool = _tool(tmp_path, "alltoall_perf")
    (tmp_path / "etc/box").write_text("h200-nvlink\n")
    r = _run(tool)
    assert r.returncode == 1 and "no recorded output" in r.stderr
    r = _run(_tool(tmp_path, "broadcast_perf"))
    assert r.returncode == 1 and "no recorded output" in r.stderr


def _hgx_evaluation(tmp_path: Path) -> gr.Evaluation:
    """The stand-in tools on box hgx-h100, run as the host deploy's measurement runs them
    (gpuserve/measure/gate_runs.run_plan) and judged by the product's evaluation with
    the box's facts: eight H100 on NV18 links, driver P2P ok, bare metal."""
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc/box").write_text("hgx-h100\n")
    tools = {name: _tool(tmp_path, name) for name in ("all_reduce_perf",
                                                       "p2pBandwidthLatencyTest")}
    runs = gr.run_plan("/n", "/p", 8, "ok", "none")
    lines: list[str] = []
    for i, run in enumerate(runs):
        r = subprocess.run([str(tools[run.tool]), *run.args], capture_output=True, text=True,
                           env={**os.environ, **run.env}, timeout=20)
        lines += [*r.stdout.splitlines(), f"{gr.MARKER} {i} {r.returncode}"]
    box = json.loads((BOXES / "hgx-h100/box.json").read_text())
    links = [["X" if i == j else "NV18" for j in range(8)] for i in range(8)]
    facts = {"gpus": [{"index": g["index"], "name": g["name"]} for g in box["gpus"]],
             "virtualization": box["virtualization"], "topology": {"links": links, "p2p": "ok"}}
    return gr.evaluate(gr.split_runs(lines, runs, 30), host="lab-gpu",
                       timestamp="2026-12-06T00:00:00Z", facts=facts,
                       driver_p2p="ok", exp=gates.load_expectations(),
                       sources=gates.load_sources())


def test_hgx_box_passes_the_nvlink_gates_and_a_degraded_link_fails_them(tmp_path):
    """hgx-h100 answers with NVLink figures and the 4 GiB row the nvlink4 class reads
    (it used to print the PCIe box's: p2p_bidir_best 28.1 GB/s, no 4 GiB row)."""
    ev = _hgx_evaluation(tmp_path)
    assert ev.topology == "nvlink4" and ev.ready, ev.problems
    assert ev.choice.p2p  # P2P on is far faster than NCCL_P2P_DISABLE=1 over host memory
    status = {v.check: v.status for v in ev.verdicts}
    assert status["all_reduce_busbw@4294967296"] == "pass"
    assert status["p2p_bidir_best"] == "pass"
    (tmp_path / "etc/gates-slow").write_text("4\n")  # a degraded NVLink
    slow = _hgx_evaluation(tmp_path)
    failed = {p.split(":")[0] for p in slow.problems}
    assert {"all_reduce_busbw@4294967296", "p2p_bidir_best"} <= failed, slow.problems
    assert any("187.34 GB/s vs expectation 742 GB/s" in p for p in slow.problems)
