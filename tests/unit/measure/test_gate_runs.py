"""gpuserve.measure.gate_runs: settings, NCCL location, build and measure scripts, the
choice from real-format outputs (tests/fixtures/gates, labelled composed there)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.host import nccl_env
from gpuserve.measure import gate_runs as gr
from gpuserve.measure import gates

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "gates"
PRO = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def _facts(p2p: str, virtualization: str = "none", name: str = PRO) -> dict:
    links = [["X" if i == j else "NODE" for j in range(8)] for i in range(8)]
    return {"gpus": [{"index": i, "name": name} for i in range(8)],
            "virtualization": virtualization, "topology": {"links": links, "p2p": p2p}}


def _outcomes(runs: list[gr.RunSpec], texts: dict[str, str | None],
              timeout: float = 30) -> list[gr.RunOutcome]:
    """Output as the measure script prints it; ``None`` = the run hung (status 124)."""
    lines: list[str] = []
    for i, run in enumerate(runs):
        text = texts[run.label]
        if text is None:
            lines += (FIX / "all_reduce_pro6000x8_hang_composed.txt").read_text().splitlines()
            lines.append(f"{gr.MARKER} {i} 124")
        else:
            lines += (FIX / text).read_text().splitlines()
            lines.append(f"{gr.MARKER} {i} 0")
    return gr.split_runs(lines, runs, timeout)


def _evaluate(driver_p2p: str, texts: dict[str, str | None], virtualization: str = "none",
              records=(), collectives=gr.ALL_REDUCE_ONLY) -> gr.Evaluation:
    runs = gr.run_plan("/g/n/bin", "/g/p/bin", 8, driver_p2p, virtualization, collectives)
    return gr.evaluate(_outcomes(runs, texts), host="gpu1", timestamp="2026-12-01T10:00:00Z",
                       facts=_facts(driver_p2p, virtualization),
                       driver_p2p=driver_p2p, exp=gates.load_expectations(),
                       sources=gates.load_sources(), records=records)


ON = "all_reduce_pro6000x8_p2p_on_composed.txt"
OFF = "all_reduce_pro6000x8_p2p_off_composed.txt"
MATRIX_ON = "p2p_bw_pro6000x2_p2p_on_composed.txt"
MATRIX_NONE = "p2p_bw_full_composed.txt"


# ----------------------------------------------------------------------------- settings


def test_settings_yaml_booleans_and_defaults():
    assert gr.gate_settings({"gates": True}, "inv.py").mode == "on"
    assert gr.gate_settings({"gates": False}, "inv.py").mode == "off"
    s = gr.gate_settings({}, "inv.py")
    assert (s.mode, s.timeout_s, s.remeasure) == ("auto", 600.0, False)
    assert s.sources["nccl-tests"].commit == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"


@pytest.mark.parametrize("data, field", [
    ({"gates": "sometimes"}, "gates"),
    ({"gates_timeout": 0}, "gates_timeout"),
    ({"gates_timeout": True}, "gates_timeout"),
    ({"gates_remeasure": "yes"}, "gates_remeasure"),
    ({"gates_sources": {"nccl-tests": {"url": "http://m/x.tgz", "sha256": "abc"}}},
     "gates_sources.nccl-tests.sha256"),
    ({"gates_sources": ["x"]}, "gates_sources"),
])
def test_bad_host_data_names_inventory_and_key(data, field):
    with pytest.raises(InputError) as e:
        gr.gate_settings(data, "inventory/gpu.py")
    assert str(e.value).startswith(f"inventory/gpu.py: {field}:")


def test_archive_override_replaces_the_pin_with_another_pin():
    s = gr.gate_settings({"gates_sources": {"cuda-samples": {
        "url": "http://10.0.2.2:1/gates/c.tar.gz", "sha256": "a" * 64}}}, "inv.py")
    src = s.sources["cuda-samples"]
    assert (src.sha256, src.commit, src.url) == ("a" * 64, None, "http://10.0.2.2:1/gates/c.tar.gz")
    assert s.sources["nccl-tests"].commit is not None  # the other tool keeps its pin


# ----------------------------------------------------------------------------- NCCL, build


def test_nccl_location_prefers_what_the_command_printed():
    venv = gr.parse_nccl_location(
        ["venv /opt/gpuserve/venvs/0.5.23-abc/lib/python3.11/site-packages/nvidia/nccl"])
    assert venv == gr.NcclLib(
        "venv", "/opt/gpuserve/venvs/0.5.23-abc/lib/python3.11/site-packages/nvidia/nccl/include",
        "/opt/gpuserve/venvs/0.5.23-abc/lib/python3.11/site-packages/nvidia/nccl/lib")
    assert venv.key.startswith("venv-") and venv.key != gr.NcclLib("venv", "i", "/other").key
    system = gr.parse_nccl_location(["system /usr/lib/x86_64-linux-gnu"])
    assert (system.include, system.key) == ("/usr/include", "system")
    assert gr.parse_nccl_location([]) is None
    assert gr.parse_nccl_location(["venv relative/path"]) is None


def test_nccl_location_command_finds_system_nccl_in_a_fake_root(tmp_path):
    # the command's paths are absolute; run it with them rewritten into tmp_path
    cmd = gr.NCCL_LOCATION_COMMAND.replace("/usr/", f"{tmp_path}/usr/").replace(
        "/etc/", f"{tmp_path}/etc/")
    assert subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout == ""
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "usr/lib/x86_64-linux-gnu/libnccl.so.2").write_text("x")
    (tmp_path / "usr/include").mkdir(parents=True)
    (tmp_path / "usr/include/nccl.h").write_text("x")
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout
    assert out.strip() == f"system {tmp_path}/usr/lib/x86_64-linux-gnu"
    venv = tmp_path / "venv"
    nccl = venv / "lib/python3.11/site-packages/nvidia/nccl"
    (nccl / "lib").mkdir(parents=True)
    (nccl / "include").mkdir()
    (nccl / "lib/libnccl.so.2").write_text("x")
    (nccl / "include/nccl.h").write_text("x")
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/systemd/system/gpuserve-sglang.service").write_text(
        f"[Service]\nExecStart={venv}/bin/python3 -m sglang.launch_server --port 30000\n")
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout
    assert out.strip() == f"venv {nccl}", "the venv the unit runs comes first"


def test_gencode_only_the_hosts_architectures():
    assert gr.gencode(["12.0", "12.0", "9.0"]) == (
        "-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_120,code=sm_120")
    assert gr.gencode([None, "unknown"]) == ""


def test_tool_dir_names_version_pin_and_nccl():
    src = gates.load_sources()["nccl-tests"]
    assert gr.tool_dir("/opt/gpuserve/gates", src, gr.NcclLib("system", "/i", "/l")) == \
        "/opt/gpuserve/gates/nccl-tests-2.19.6-a0b82b2260cf-system"
    p2p = gates.load_sources()["cuda-samples"]
    assert gr.tool_dir("/r", p2p) == "/r/cuda-samples-13.0-3f1c50965017"


def test_build_script_needs_nccl_for_nccl_tests():
    with pytest.raises(ValueError, match="NCCL"):
        gr.build_script(gates.load_sources()["nccl-tests"], "/d", "/usr/local/cuda", None, "")


def test_git_pin_is_checked_after_checkout():
    text = gr.build_script(gates.load_sources()["cuda-samples"], "/d", "/usr/local/cuda",
                           None, "")
    assert "git -C src fetch -q --depth 1 https://github.com/NVIDIA/cuda-samples.git " \
        "3f1c50965017932fc81e6d94a3fc9e04c105b312" in text
    assert 'if [ "$head" != 3f1c50965017932fc81e6d94a3fc9e04c105b312 ]' in text
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc" in text


needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in ("make", "curl", "tar")),
                                 reason="needs make, curl and tar")


def _lab_sources(tmp_path: Path, sha: str | None = None) -> dict[str, gates.ToolSource]:
    from lab import gate_tools

    gate_tools.publish(tmp_path / "mirror")
    name = "nccl-tests-lab.tar.gz"
    digest = sha or gate_tools.archive_sha256(tmp_path / "mirror", name)
    return gates.load_sources(overrides={"nccl-tests": {
        "url": f"file://{tmp_path}/mirror/gates/{name}", "sha256": digest}})


def _fake_nccl(tmp_path: Path) -> gr.NcclLib:
    (tmp_path / "nccl/include").mkdir(parents=True)
    (tmp_path / "nccl/lib").mkdir()
    (tmp_path / "nccl/include/nccl.h").write_text("")
    (tmp_path / "nccl/lib/libnccl.so.2").write_text("")
    return gr.NcclLib("system", str(tmp_path / "nccl/include"), str(tmp_path / "nccl/lib"))


@needs_tools
def test_archive_with_another_sha256_is_refused_before_unpacking(tmp_path):
    src = _lab_sources(tmp_path, sha="0" * 64)["nccl-tests"]
    dest = tmp_path / "gates/nccl-tests"
    r = subprocess.run(["sh", "-c", gr.build_script(src, str(dest), "/usr/local/cuda",
                                                     _fake_nccl(tmp_path), "")],
                       capture_output=True, text=True)
    assert r.returncode == 3
    assert f"pinned {'0' * 64} (tools.nccl-tests.sha256)" in r.stderr
    assert not dest.exists() and not Path(f"{dest}.new").exists()


@needs_tools
def test_build_installs_binaries_and_stamp_with_nccl_fix(tmp_path):
    src = _lab_sources(tmp_path)["nccl-tests"]
    nccl = _fake_nccl(tmp_path)
    dest = tmp_path / "gates/nccl-tests"
    r = subprocess.run(["sh", "-c", gr.build_script(src, str(dest), "/usr/local/cuda", nccl,
                                                     gr.gencode(["12.0"]))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (dest / "bin").iterdir()) == [
        "all_gather_perf", "all_reduce_perf", "alltoall_perf"]
    assert json.loads((dest / gr.STAMP).read_text())["sha256"] == src.sha256
    # the stand-in Makefile fails like the real link without libnccl.so: fix 1 made it
    assert "ln -s libnccl.so.2 ncclhome/lib/libnccl.so" in gr.build_script(
        src, str(dest), "/usr/local/cuda", nccl, "")


# ----------------------------------------------------------------------------- runs


def test_run_plan_measures_p2p_only_where_the_driver_reports_it():
    def labels(p2p, virt):
        return [r.label for r in gr.run_plan("/n", "/p", 8, p2p, virt)]

    assert labels("ok", "none") == ["p2p_on", "p2p_off", "matrix"]
    # a guest whose GPUs the hypervisor put in a P2P clique: measured like bare metal
    assert labels("ok", "kvm") == ["p2p_on", "p2p_off", "matrix"]
    assert labels("none", "kvm") == ["p2p_off", "matrix"]
    assert labels("none", "none") == ["p2p_off", "matrix"]
    off = gr.run_plan("/n", "/p", 8, "ok", "none")[1]
    assert off.env == {"NCCL_P2P_DISABLE": "1"} and off.args[:2] == ("-g", "8")
    assert off.args[4:6] == ("-e", "4G")


def test_measure_script_times_out_a_hang_and_reports_every_run(tmp_path):
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\necho \"fine P2P=${NCCL_P2P_DISABLE:-on} $*\"\n")
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\necho started\nexec sleep 30\n")
    for p in (ok, hang):
        p.chmod(0o755)
    runs = [gr.RunSpec("t", str(hang), (), {}, "p2p_on"),
            gr.RunSpec("t", str(ok), ("-g", "2"), {"NCCL_P2P_DISABLE": "1"}, "p2p_off")]
    out = subprocess.run(["sh", "-c", gr.measure_script(runs, 1, "/nowhere")],
                         capture_output=True, text=True, timeout=60).stdout
    first, second = gr.split_runs(out.splitlines(), runs, 1)
    assert first.hung and first.status == 124 and first.text == "started"
    assert first.summary()["hang"] == {"timeout_s": 1}
    assert not second.hung and second.status == 0 and second.text == "fine P2P=1 -g 2"


def test_split_runs_missing_marker_is_no_status():
    runs = [gr.RunSpec("t", "/x", (), {}, "p2p_off")]
    (outcome,) = gr.split_runs(["half a line"], runs, 5)
    assert outcome.status is None and not outcome.hung


# ----------------------------------------------------------------------------- evaluate


def test_bare_metal_measured_faster_with_p2p_keeps_p2p_on():
    ev = _evaluate("ok", {"p2p_on": ON, "p2p_off": OFF, "matrix": MATRIX_ON})
    assert ev.choice.p2p and ev.choice.env == {} and not ev.choice.disable_custom_all_reduce
    assert ev.topology == "pcie-p2p" and ev.ready, ev.problems
    assert ev.figures["all_reduce_busbw@2147483648"] == 38.37  # lower half at 2 GiB
    assert ev.record["schema"] == "gpuserve.measure/1"
    assert ev.record["nccl_version"] == "2.30.7"
    assert [r["label"] for r in ev.record["runs"]] == ["p2p_on", "p2p_off", "matrix"]


def test_p2p_hang_is_reported_with_its_timeout_and_keeps_p2p_off():
    ev = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_NONE})
    assert not ev.choice.p2p and ev.choice.env == {"NCCL_P2P_DISABLE": "1"}
    assert ev.choice.disable_custom_all_reduce
    assert "P2P on hung (all_reduce_perf, killed after 30 s)" in ev.choice.reason
    assert "gates: all_reduce_perf (NCCL defaults) hung: killed after 30 s" in ev.lines
    assert ev.topology == "pcie-no-p2p"
    assert ev.ready, ev.problems  # a P2P hang is a result: the SHM path works
    assert ev.record["runs"][0]["hang"] == {"timeout_s": 30}


def test_working_p2p_copies_do_not_fail_a_host_whose_nccl_p2p_path_hung():
    ev = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_ON})
    assert not ev.choice.p2p and ev.ready, ev.problems
    matrix = next(v for v in ev.verdicts if v.check == "p2p_matrix_consistent")
    assert matrix.status == "skip" and "kept off" in matrix.message
    # P2P kept on must be real P2P: a staged "P2P" path fails
    ev = _evaluate("ok", {"p2p_on": ON, "p2p_off": OFF,
                          "matrix": "p2p_bw_pro6000x2_can_but_staged_composed.txt"})
    assert ev.choice.p2p and not ev.ready
    assert any(p.startswith("p2p_matrix_consistent: P2P expected but only 0 of 2")
               for p in ev.problems), ev.problems


def test_matrix_hang_overrules_a_faster_p2p_all_reduce():
    ev = _evaluate("ok", {"p2p_on": ON, "p2p_off": OFF, "matrix": None})
    assert not ev.choice.p2p
    assert "p2pBandwidthLatencyTest hung (killed after 30 s)" in ev.choice.reason


def test_vm_without_p2p_measures_p2p_off_only_and_sets_a_baseline():
    ev = _evaluate("none", {"p2p_off": OFF, "matrix": MATRIX_NONE}, virtualization="kvm")
    assert not ev.choice.p2p and "P2P not measured" in ev.choice.reason
    assert ev.topology == "pcie-no-p2p" and ev.ready, ev.problems
    statuses = {v.check: v.status for v in ev.verdicts}
    assert statuses["all_reduce_busbw@2147483648"] == "baseline"
    assert statuses["p2p_matrix_consistent"] == "pass"
    # the next run gates against this one (70 % of 25.81 GB/s)
    again = _evaluate("none", {"p2p_off": OFF, "matrix": MATRIX_NONE}, virtualization="kvm",
                      records=[ev.record])
    assert {v.check: v.status for v in again.verdicts}["all_reduce_busbw@2147483648"] == "pass"


def test_missing_gpu_and_both_paths_hung_make_the_host_not_ready():
    ev = _evaluate("none", {"p2p_off": "all_reduce_pro6000x7_missing_gpu_composed.txt",
                            "matrix": MATRIX_NONE}, virtualization="kvm")
    assert any(p.startswith("gpus_present: 7 of the host's 8 GPUs") for p in ev.problems)
    ev = _evaluate("ok", {"p2p_on": None, "p2p_off": None, "matrix": MATRIX_NONE})
    assert not ev.ready and "no working collective path" in " ".join(ev.problems)


# ----------------------------------------------------------------------------- host files


def test_measured_json_round_trip_and_nccl_plan_follows_it():
    ev = _evaluate("ok", {"p2p_on": None, "p2p_off": OFF, "matrix": MATRIX_NONE})
    text = gr.measured_json(ev, "fp1")
    assert text == gr.measured_json(ev, "fp1"), "no timestamp: the same bytes again"
    doc = gr.read_measured(text)
    plan = nccl_env.plan_nccl("none", "ok", {}, 8, measured=doc["choice"])
    assert plan.env == {"NCCL_P2P_DISABLE": "1"} and plan.disable_custom_all_reduce
    host_doc = json.loads(nccl_env.host_json(plan))
    assert host_doc["p2p"] == "ok", "the driver's verdict stays beside the measured choice"
    assert host_doc["measured_nccl"]["p2p"] is False
    assert nccl_env.sglang_flags_for_host(nccl_env.host_json(plan).splitlines()) == [
        "--disable-custom-all-reduce"]
    # a measurement taken under another driver verdict is stale: the verdict rules
    stale = nccl_env.plan_nccl("kvm", "none", {}, 8, measured={**doc["choice"], "numbers": {
        **doc["choice"]["numbers"], "driver_p2p": "ok"}})
    assert stale.measured is None and "measure again" in stale.summary
    moved = dict(doc["choice"], p2p=True, env={}, disable_custom_all_reduce=False)
    assert nccl_env.plan_nccl("kvm", "none", {}, 8, measured=moved).env == {
        "NCCL_P2P_DISABLE": "1"}, "a P2P-on measurement never outlives a verdict of none"
    # without a measurement the driver's verdict rules, as before
    assert nccl_env.plan_nccl("none", "ok", {}, 8).env == {}
    # host data still has the last word
    kept = nccl_env.plan_nccl("none", "ok", {"NCCL_P2P_DISABLE": ""}, 8, measured=doc["choice"])
    assert kept.env == {} and not kept.disable_custom_all_reduce


def test_read_measured_refuses_foreign_documents():
    assert gr.read_measured(None) is None and gr.read_measured("  ") is None
    with pytest.raises(InputError, match="schema"):
        gr.read_measured('{"schema": "other"}')
    with pytest.raises(InputError, match="choice"):
        gr.read_measured('{"schema": "gpuserve.measured/1", "choice": {"p2p": "yes"}}')


def test_fingerprint_changes_with_what_the_measurement_depends_on():
    src = gates.load_sources()
    nccl = gr.NcclLib("system", "/usr/include", "/usr/lib/x86_64-linux-gnu")
    def fp(uuids=("GPU-a", "GPU-b"), driver="580.126.20", exp="exp", lib=nccl, **host):
        return gr.fingerprint(src, lib, gr.MeasuredOn(uuids, driver, **host), 600, exp)

    base = fp()
    assert base == fp(uuids=("GPU-b", "GPU-a"))
    assert base != fp(lib=None)
    assert base != fp(uuids=("GPU-a",))
    assert base != fp(driver="590.48.01")
    assert base != fp(exp="exp2")
    assert base != fp(driver_p2p="ok")


def test_gate_size_is_the_classes_busbw_size_and_stamp_names_the_pin():
    exp = gates.load_expectations()
    assert gr.gate_size(exp, "nvlink4") == 4294967296
    assert gr.gate_size(exp, "pcie-no-p2p") == 2147483648
    assert gr.gate_size(exp, None) == 2147483648  # unknown topology: the PCIe size
    src = gates.load_sources()["nccl-tests"]
    stamp = json.loads(gr.stamp_text(src, gr.NcclLib("venv", "/v/include", "/v/lib")))
    assert stamp["commit"] == src.commit and stamp["nccl"] == {"origin": "venv", "lib": "/v/lib"}


# ----------------------------------------------------------------------------- EP hosts

AG_ON = "all_gather_pro6000x8_p2p_on_composed.txt"
AG_OFF = "all_gather_pro6000x8_p2p_off_composed.txt"
A2A_ON = "alltoall_pro6000x8_p2p_on_composed.txt"
A2A_OFF = "alltoall_pro6000x8_p2p_off_composed.txt"
EP_TEXTS = {"p2p_on": ON, "p2p_off": OFF, "all_gather:p2p_on": AG_ON,
            "all_gather:p2p_off": AG_OFF, "alltoall:p2p_on": A2A_ON,
            "alltoall:p2p_off": A2A_OFF, "matrix": MATRIX_ON}


def test_collectives_default_from_the_hosts_profile(tmp_path):
    assert gr.gate_settings({}, "inv.py").collectives == ("all_reduce",)
    ep = gr.gate_settings({}, "inv.py", profile_ref="glm5-nvfp4-tp8-ep8")
    assert ep.collectives == ("all_reduce", "all_gather", "alltoall")
    assert gr.gate_settings({}, "inv.py", profile_ref="glm5-nvfp4-tp8").collectives == (
        "all_reduce",)
    # an a2a backend makes SGLang run EP whatever parallel.ep says (doctor a2a-forces-ep)
    a2a = tmp_path / "a2a.yaml"
    a2a.write_text("extends: " + str(Path(__file__).resolve().parents[3]
                                     / "profiles/glm5-nvfp4-tp8.yaml")
                   + "\nmoe:\n  a2a_backend: flashinfer\n")
    assert gr.gate_settings({}, "inv.py", profile_ref=str(a2a)).collectives[-1] == "alltoall"
    # a profile that does not load leaves all-reduce (the serve deploy refuses it)
    for ref in ("no-such-profile", "../../etc/shadow", 3, ""):
        assert gr.gate_settings({}, "inv.py", profile_ref=ref).collectives == ("all_reduce",)
    # host data says it outright, in run order; gates: off loads no profile
    assert gr.gate_settings({"gates_collectives": ["alltoall", "all_reduce"]}, "inv.py",
                            profile_ref="glm5-nvfp4-tp8").collectives == (
        "all_reduce", "alltoall")
    assert gr.gate_settings({"gates_collectives": ["all_reduce"]}, "inv.py",
                            profile_ref="glm5-nvfp4-tp8-ep8").collectives == ("all_reduce",)
    assert gr.gate_settings({"gates": "off"}, "inv.py",
                            profile_ref="glm5-nvfp4-tp8-ep8").collectives == ("all_reduce",)


@pytest.mark.parametrize("value, message", [
    ("all_gather", "must be a list"),
    (["all_gather"], "must include all_reduce"),
    (["all_reduce", "broadcast"], "unknown collective 'broadcast'"),
])
def test_bad_collectives_name_inventory_and_key(value, message):
    with pytest.raises(InputError, match=f"^inv.py: gates_collectives: .*{message}"):
        gr.gate_settings({"gates_collectives": value}, "inv.py")


def test_ep_run_plan_runs_all_gather_and_alltoall_in_the_same_envs():
    def labels(p2p, virt):
        runs = gr.run_plan("/n", "/p", 8, p2p, virt, gr.COLLECTIVES)
        return [(r.label, r.binary) for r in runs]

    assert labels("ok", "none") == [
        ("p2p_on", "/n/all_reduce_perf"), ("p2p_off", "/n/all_reduce_perf"),
        ("all_gather:p2p_on", "/n/all_gather_perf"), ("all_gather:p2p_off", "/n/all_gather_perf"),
        ("alltoall:p2p_on", "/n/alltoall_perf"), ("alltoall:p2p_off", "/n/alltoall_perf"),
        ("matrix", "/p/p2pBandwidthLatencyTest")]
    assert [label for label, _ in labels("none", "kvm")] == [
        "p2p_off", "all_gather:p2p_off", "alltoall:p2p_off", "matrix"]
    # the same sweep and env as all-reduce
    runs = gr.run_plan("/n", "/p", 8, "ok", "none", gr.COLLECTIVES)
    assert runs[3].args == runs[1].args and runs[3].env == {"NCCL_P2P_DISABLE": "1"}


def test_ep_collectives_are_recorded_under_the_chosen_env_and_not_gated():
    ev = _evaluate("ok", EP_TEXTS, collectives=gr.COLLECTIVES)
    assert ev.choice.p2p and ev.ready, ev.problems
    f = ev.figures
    assert f["all_gather_busbw@2147483648"] == 37.3 and f["alltoall_busbw@2147483648"] == 28.8
    assert f["all_gather_latency@1024"] == 20.5 and f["alltoall_latency@1024"] == 23.6
    assert f["all_reduce_busbw@2147483648"] == 38.37
    assert not any(v.check.startswith(("all_gather", "alltoall")) for v in ev.verdicts), \
        "no expectation names them: recorded, not judged"
    assert [r["label"] for r in ev.record["runs"]] == [
        "p2p_on", "p2p_off", "all_gather:p2p_on", "all_gather:p2p_off", "alltoall:p2p_on",
        "alltoall:p2p_off", "matrix"]
    gates.validate_measure_record(ev.record, "r.json")
    off = _evaluate("none", {k: v for k, v in EP_TEXTS.items() if "p2p_on" not in k},
                    virtualization="kvm", collectives=gr.COLLECTIVES)
    assert off.figures["alltoall_busbw@2147483648"] == 17.77 and off.ready, off.problems


def test_an_ep_collective_hanging_with_p2p_keeps_p2p_off():
    ev = _evaluate("ok", {**EP_TEXTS, "alltoall:p2p_on": None}, collectives=gr.COLLECTIVES)
    assert not ev.choice.p2p and ev.choice.env == {"NCCL_P2P_DISABLE": "1"}
    assert ev.choice.reason.startswith("alltoall_perf hung with P2P on (killed after 30 s)")
    assert ev.ready, ev.problems  # P2P off works for every collective
    assert ev.figures["alltoall_busbw@2147483648"] == 17.77
    # hanging on the chosen path: EP would hang there too
    ev = _evaluate("ok", {**EP_TEXTS, "p2p_on": OFF, "all_gather:p2p_off": None},
                   collectives=gr.COLLECTIVES)
    assert not ev.choice.p2p and not ev.ready
    assert "all_gather_perf (NCCL_P2P_DISABLE=1, the chosen path) hung: killed after 30 s" \
        in ev.problems


def test_busbw_near_reads_the_bytes_all_gather_really_moved():
    # on 7 GPUs the 2 GiB step moves 7 x 76695844 x 4 = 2147483632 bytes (all_gather.cu)
    text = (FIX / AG_OFF).read_text().replace("2147483648      67108864",
                                              "2147483632      76695844")
    from gpuserve.parsers.nccl_tests import parse_nccl_tests

    result = parse_nccl_tests(text)
    assert gates.busbw_at(result, 2147483648) is None
    assert gates.busbw_near(result, 2147483648).size_bytes == 2147483632
    assert gates.collective_figures("all_gather", result, 2147483648) == {
        "all_gather_busbw@2147483648": 24.22, "all_gather_latency@1024": 29.1}


def test_fingerprint_counts_the_collectives_but_all_reduce_alone_changes_nothing():
    src, nccl = gates.load_sources(), gr.NcclLib("system", "/usr/include", "/usr/lib")
    args = (src, nccl, gr.MeasuredOn(("GPU-a",), "580.126.20", "ok", "none"), 600, "exp")
    assert gr.fingerprint(*args) == gr.fingerprint(*args, ("all_reduce",))
    assert gr.fingerprint(*args) != gr.fingerprint(*args, gr.COLLECTIVES)


def test_build_reports_its_phases_in_order():
    """The progress line of a detached build (roles/gpu_gates) names the script's last
    phase line."""
    text = gr.build_script(gates.load_sources()["cuda-samples"], "/d", "/usr/local/cuda",
                           None, "")
    phases = [line for line in text.splitlines() if gr.BUILD_PHASE in line]
    assert [p.split(gr.BUILD_PHASE)[1].rstrip("'") for p in phases] == [
        "fetching and checking the pinned source", "compiling", "installing into /d"]
    lines = [gr.BUILD_PHASE + "fetching and checking the pinned source",
             gr.BUILD_PHASE + "compiling"]
    assert gr.build_progress(lines, 41.6) == "compiling, 42 s"
    assert gr.build_progress([], 3) == "starting, 3 s"
