"""Doctor rules: each fires on its bad case and stays silent on the good one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpuserve.cli import main
from gpuserve.doctor.rules import PREDICATES, RULES_PATH, diagnose, load_rules
from gpuserve.errors import InputError
from gpuserve.facts.document import document_from_sections
from gpuserve.host.hostfacts import HostFacts, Measured
from gpuserve.launch.lock_choice import HostRuntime, PreflightError
from gpuserve.launch.profiles import PROFILES_DIR, load_profile
from gpuserve.measure import gates
from gpuserve.tune.judge import judge
from gpuserve.tune.snapshot import HostSnapshot
from tests.serve_plans import plan_of

HOSTFACTS = Path(__file__).resolve().parents[2] / "fixtures" / "hostfacts"
REF, BARE, H200 = "reference-box-kvm", "bare-metal-p2p", "h200-nvlink"


def facts_doc(name: str) -> dict:
    return json.loads((HOSTFACTS / f"{name}.json").read_text())


def facts(name: str, edit=None) -> HostFacts:
    doc = copy.deepcopy(facts_doc(name))
    if edit:
        edit(doc)
    return HostFacts.from_dict(doc, f"{name}.json")


def child(tmp_path: Path, parent: str, body: dict):
    """A profile extending a shipped one, with ``body`` merged over it."""
    path = tmp_path / f"child-of-{parent}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(PROFILES_DIR / f"{parent}.yaml"), **body}))
    return load_profile(path)


def fired(profile, host: HostFacts, version: str | None = None) -> set[str]:
    if isinstance(profile, str):
        profile = load_profile(profile)
    return {f.id for f in diagnose(profile, host, version)}


def gpus_set(key, values):
    def edit(doc):
        for gpu, value in zip(doc["gpus"], values, strict=False):
            gpu[key] = value
    return edit


# ---------------------------------------------------------------- metadata


def test_every_rule_has_a_predicate_and_back():
    ids = [r.id for r in load_rules()]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(PREDICATES)


def test_rule_metadata_is_complete():
    for r in load_rules():
        assert r.severity in ("error", "warn", "info")
        assert r.title and r.fix and r.source
    raw = yaml.safe_load(RULES_PATH.read_text())
    assert all("source" in r for r in raw["rules"])


# ---------------------------------------------------------------- shipped profiles


@pytest.mark.parametrize(("profile", "host"), [
    ("glm5-nvfp4-tp8", REF), ("glm5-nvfp4-tp8-ep8", REF),
    ("deepseek-v3-fp8-h200-tp8", H200), ("deepseek-v3-fp8-h200-tp8-dpattn", H200),
    ("qwen3-235b-a22b-fp8-h200-tp8", H200),
])
def test_shipped_profiles_are_clean_on_their_target_box(profile, host):
    findings = diagnose(load_profile(profile), facts(host))
    assert [f for f in findings if f.severity != "info"] == []


def test_eagle3_on_reference_box_is_told_to_beat_the_baseline():
    findings = {f.id: f for f in diagnose(load_profile("glm5-nvfp4-tp8-eagle3"), facts(REF))}
    assert findings["spec-vs-baseline"].severity == "warn"
    assert "54.1" in findings["spec-vs-baseline"].source


# ---------------------------------------------------------------- per rule: bad fires, good silent


def test_profile_render(tmp_path):
    bad = child(tmp_path, "glm5-nvfp4-tp8", {"communication": {"pcie_ipc_allreduce": True},
                                             "sglang_versions": ["0.5.19", "0.5.23"]})
    assert "profile-render" in fired(bad, facts(BARE), "0.5.19")
    assert "profile-render" not in fired(bad, facts(BARE), "0.5.23")


def test_gpu_count():
    four = facts(REF, lambda d: d.update(gpus=d["gpus"][:4]))
    assert "gpu-count" in fired("glm5-nvfp4-tp8", four)
    assert "gpu-count" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_sglang_cuda_lane():
    def cuda12(doc):
        doc["driver"]["version"] = "570.195.03"
        doc["cuda"]["toolkit"] = "12.8"
    assert "sglang-cuda-lane" in fired("deepseek-v3-fp8-h200-tp8", facts(H200, cuda12), "0.5.23")
    # PyPI's 0.5.19 pins torch 2.13.0 built for CUDA 13.0 (sglang-install.md §1): the
    # docs' "CUDA 12 lane" of 0.5.19 is a reinstall from other indexes, not what pip gets
    assert "sglang-cuda-lane" in fired("deepseek-v3-fp8-h200-tp8", facts(H200, cuda12), "0.5.19")
    assert "sglang-cuda-lane" not in fired("deepseek-v3-fp8-h200-tp8", facts(H200), "0.5.23")


def test_blackwell_open_driver():
    def prop(doc):
        doc["driver"]["flavour"] = "proprietary"
    assert "blackwell-open-driver" in fired("glm5-nvfp4-tp8", facts(REF, prop))
    assert "blackwell-open-driver" not in fired("glm5-nvfp4-tp8", facts(REF))
    assert "blackwell-open-driver" not in fired("deepseek-v3-fp8-h200-tp8", facts(H200, prop))


def test_blackwell_driver_branch():
    def old(doc):
        doc["driver"]["version"] = "565.57.01"
    assert "blackwell-driver-branch" in fired("glm5-nvfp4-tp8", facts(REF, old))
    assert "blackwell-driver-branch" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_nvfp4_weights_arch():
    assert "nvfp4-weights-arch" in fired("glm5-nvfp4-tp8", facts(H200))
    assert "nvfp4-weights-arch" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_nvfp4_kv_arch(tmp_path):
    p = child(tmp_path, "deepseek-v3-fp8-h200-tp8", {"memory": {"kv_cache_dtype": "nvfp4"}})
    assert "nvfp4-kv-arch" in fired(p, facts(H200))
    assert "nvfp4-kv-arch" not in fired(p, facts(BARE))


def test_nvfp4_cuda():
    def cuda126(doc):
        doc["cuda"]["toolkit"] = "12.6"
    assert "nvfp4-cuda" in fired("glm5-nvfp4-tp8", facts(REF, cuda126))
    assert "nvfp4-cuda" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_shared_experts_fusion_nvfp4(tmp_path):
    fused = child(tmp_path, "glm5-nvfp4-tp8", {"moe": {"disable_shared_experts_fusion": False}})
    assert "shared-experts-fusion-nvfp4" in fired(fused, facts(REF), "0.5.15")
    assert "shared-experts-fusion-nvfp4" not in fired(fused, facts(REF), "0.5.23")
    assert "shared-experts-fusion-nvfp4" not in fired("glm5-nvfp4-tp8", facts(REF), "0.5.15")


def test_allreduce_fusion_sm120(tmp_path):
    p = child(tmp_path, "glm5-nvfp4-tp8", {"extra_args": ["--enable-flashinfer-allreduce-fusion"]})
    assert "allreduce-fusion-sm120" in fired(p, facts(REF))
    assert "allreduce-fusion-sm120" not in fired(p, facts(H200))
    assert "allreduce-fusion-sm120" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_torch_symm_mem_sm120(tmp_path):
    p = child(tmp_path, "glm5-nvfp4-tp8", {"extra_args": ["--enable-torch-symm-mem"]})
    assert "torch-symm-mem-sm120" in fired(p, facts(REF))
    assert "torch-symm-mem-sm120" not in fired(p, facts(H200))


def test_nccl_algo_tree_cuda_graphs(tmp_path):
    tree = child(tmp_path, "glm5-nvfp4-tp8", {"env": {"NCCL_ALGO": "Tree"}})
    assert "nccl-algo-tree-cuda-graphs" in fired(tree, facts(REF))
    excluded = child(tmp_path, "glm5-nvfp4-tp8", {"env": {"NCCL_ALGO": "^Tree"}})
    assert "nccl-algo-tree-cuda-graphs" not in fired(excluded, facts(REF))
    no_graphs = child(tmp_path, "glm5-nvfp4-tp8", {
        "env": {"NCCL_ALGO": "Tree"},
        "extra_args": ["--cuda-graph-backend-decode", "disabled"]})
    assert "nccl-algo-tree-cuda-graphs" not in fired(no_graphs, facts(REF))


INSIST = "reproducing a report"


def test_the_host_plan_turns_custom_allreduce_and_p2p_off_without_p2p():
    """No profile verdict: on the no-P2P box the host deploy's plan from the same facts
    (roles/nccl) is what keeps custom all-reduce and the P2P transport off."""
    from gpuserve.doctor.rules import Context

    def ctx(host):
        return Context(load_profile("deepseek-v3-fp8-h200-tp8"), facts(host), "0.5.23", None,
                       None, {})

    ref, bare = ctx(REF), ctx(BARE)
    assert ref.custom_all_reduce_off() and ref.effective_env["NCCL_P2P_DISABLE"] == "1"
    assert not bare.custom_all_reduce_off() and "NCCL_P2P_DISABLE" not in bare.effective_env
    assert "NCCL_P2P_DISABLE" not in ref.env  # from the host, not the profile


def test_pcie_ipc_needs_p2p(tmp_path):
    p = child(tmp_path, "glm5-nvfp4-tp8", {"communication": {"pcie_ipc_allreduce": True}})
    assert "pcie-ipc-needs-p2p" in fired(p, facts(REF))
    assert "pcie-ipc-needs-p2p" not in fired(p, facts(BARE))


def test_nccl_p2p_disable_missing(tmp_path):
    on = child(tmp_path, "glm5-nvfp4-tp8", {"env": {"NCCL_P2P_DISABLE": "0"},
                                            "communication": {"insist": INSIST}})
    found = {f.id: f.evidence for f in diagnose(on, facts(REF))}
    assert "overrides the host's nccl.env" in found["nccl-p2p-disable-missing"]
    assert "nccl-p2p-disable-missing" not in fired("glm5-nvfp4-tp8", facts(REF))
    assert "nccl-p2p-disable-missing" not in fired("deepseek-v3-fp8-h200-tp8", facts(REF))


def test_nccl_p2p_disabled_needlessly(tmp_path):
    off = child(tmp_path, "glm5-nvfp4-tp8", {"env": {"NCCL_P2P_DISABLE": "1"},
                                             "communication": {"insist": INSIST}})
    assert "nccl-p2p-disabled-needlessly" in fired(off, facts(BARE))
    # the shipped profile leaves the transport to the host: silent on both boxes
    assert "nccl-p2p-disabled-needlessly" not in fired("glm5-nvfp4-tp8", facts(BARE))
    assert "nccl-p2p-disabled-needlessly" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_vm_without_p2p():
    assert "vm-without-p2p" in fired("glm5-nvfp4-tp8", facts(REF))
    assert "vm-without-p2p" not in fired("glm5-nvfp4-tp8", facts(BARE))


def test_iommu_p2p_bare_metal():
    def no_pt(doc):
        doc["kernel"]["cmdline"] = "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro amd_iommu=on"
    assert "iommu-p2p-bare-metal" in fired("glm5-nvfp4-tp8", facts(BARE, no_pt))
    assert "iommu-p2p-bare-metal" not in fired("glm5-nvfp4-tp8", facts(BARE))
    assert "iommu-p2p-bare-metal" not in fired("deepseek-v3-fp8-h200-tp8", facts(H200, no_pt))


def test_memory_plan():
    # DeepSeek-V3 FP8 (~79 GiB of weights per GPU at TP8) does not leave KV room on 96 GB
    findings = {f.id: f for f in diagnose(load_profile("deepseek-v3-fp8-h200-tp8"), facts(REF))}
    assert findings["memory-plan"].severity == "error"
    assert "refused" in findings["memory-plan"].evidence
    assert "memory-plan" not in fired("deepseek-v3-fp8-h200-tp8", facts(H200))
    assert "memory-plan" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_ep_memory(tmp_path):
    auto = child(tmp_path, "qwen3-235b-a22b-fp8-h200-tp8",
                 {"memory": {"mem_fraction_static": "auto"}})
    assert "ep-memory" in fired(auto, facts(H200))
    low = child(tmp_path, "glm5-nvfp4-tp8-ep8", {"memory": {"mem_fraction_static": 0.78}})
    findings = {f.id: f for f in diagnose(low, facts(REF))}
    assert "ep-memory" in findings and "0.78" in findings["ep-memory"].evidence
    assert "21.7" in findings["ep-memory"].source
    assert "ep-memory" not in fired("glm5-nvfp4-tp8-ep8", facts(REF))


def test_a2a_forces_ep(tmp_path):
    p = child(tmp_path, "glm5-nvfp4-tp8-ep8", {"parallel": {"ep": 4}})
    assert "a2a-forces-ep" in fired(p, facts(REF))
    assert "a2a-forces-ep" not in fired("glm5-nvfp4-tp8-ep8", facts(REF))


def test_decode_graph_bs_dsa(tmp_path):
    default_bs = child(tmp_path, "glm5-nvfp4-tp8", {"memory": {"cuda_graph_max_bs": None}})
    assert "decode-graph-bs-dsa" in fired(default_bs, facts(REF))  # SGLang picks 512
    big = child(tmp_path, "glm5-nvfp4-tp8", {"memory": {"cuda_graph_max_bs": 512}})
    assert "decode-graph-bs-dsa" in fired(big, facts(REF))
    assert "decode-graph-bs-dsa" not in fired("glm5-nvfp4-tp8", facts(REF))
    # MLA without the DSA indexer, on the same cards: not this rule
    assert "decode-graph-bs-dsa" not in fired("deepseek-v3-fp8-h200-tp8", facts(REF))


def test_dsa_backend_sm120(tmp_path):
    p = child(tmp_path, "glm5-nvfp4-tp8", {"attention": {"dsa_decode_backend": "trtllm"}})
    assert "dsa-backend-sm120" in fired(p, facts(REF))
    assert "dsa-backend-sm120" not in fired(p, facts(H200))
    assert "dsa-backend-sm120" not in fired("glm5-nvfp4-tp8", facts(REF))
    # backends unset and a BF16 KV cache: SGLang's default would not be the SM12x one
    bf16 = child(tmp_path, "glm5-nvfp4-tp8", {
        "attention": {"dsa_prefill_backend": None, "dsa_decode_backend": None},
        "memory": {"kv_cache_dtype": "bf16"}})
    assert "dsa-backend-sm120" in fired(bf16, facts(REF))
    fp8 = child(tmp_path, "glm5-nvfp4-tp8", {
        "attention": {"dsa_prefill_backend": None, "dsa_decode_backend": None}})
    assert "dsa-backend-sm120" not in fired(fp8, facts(REF))


def test_ep_pcie_no_win():
    assert "ep-pcie-no-win" in fired("glm5-nvfp4-tp8-ep8", facts(REF))
    assert "ep-pcie-no-win" not in fired("qwen3-235b-a22b-fp8-h200-tp8", facts(H200))
    assert "ep-pcie-no-win" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_dp_attention_graph_bs(tmp_path):
    p = child(tmp_path, "deepseek-v3-fp8-h200-tp8-dpattn", {"memory": {"cuda_graph_max_bs": None}})
    assert "dp-attention-graph-bs" in fired(p, facts(H200))
    assert "dp-attention-graph-bs" not in fired("deepseek-v3-fp8-h200-tp8-dpattn", facts(H200))


def test_spec_running_cap(tmp_path):
    p = child(tmp_path, "glm5-nvfp4-tp8-eagle3", {"memory": {"max_running_requests": None}})
    assert "spec-running-cap" in fired(p, facts(REF))
    assert "spec-running-cap" not in fired("glm5-nvfp4-tp8-eagle3", facts(REF))


def test_spec_vs_baseline():
    assert "spec-vs-baseline" in fired("glm5-nvfp4-tp8-eagle3", facts(REF))
    assert "spec-vs-baseline" not in fired("glm5-nvfp4-tp8-eagle3", facts(H200))
    assert "spec-vs-baseline" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_memory_unbalanced(tmp_path):
    busy = facts(REF, gpus_set("memory_used_mib", [500] * 7 + [30000]))
    findings = {f.id: f for f in diagnose(load_profile("glm5-nvfp4-tp8"), busy)}
    assert findings["memory-unbalanced"].severity == "error"
    assert "busy GPUs: 7" in findings["memory-unbalanced"].evidence
    even = facts(REF, gpus_set("memory_used_mib", [500] * 8))
    assert "memory-unbalanced" not in fired("glm5-nvfp4-tp8", even)
    off = child(tmp_path, "glm5-nvfp4-tp8",
                {"env": {"SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0"}})
    assert "memory-unbalanced" not in fired(off, busy)


def test_nouveau_loaded():
    def nouveau(doc):
        doc["kernel"]["nouveau_loaded"] = True
    assert "nouveau-loaded" in fired("glm5-nvfp4-tp8", facts(REF, nouveau))
    assert "nouveau-loaded" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_persistence_mode():
    off = facts(REF, gpus_set("persistence_mode", ["Enabled", "Disabled"]))
    assert "persistence-mode" in fired("glm5-nvfp4-tp8", off)
    assert "persistence-mode" not in fired("glm5-nvfp4-tp8", facts(REF))


def test_unknown_facts_fire_nothing_host_specific():
    bare = HostFacts.from_dict({}, "empty.json")
    ids = fired("glm5-nvfp4-tp8", bare)
    assert ids == set()


# ---------------------------------------------------------------- CLI


def test_cli_table_and_json_without_errors_exit_0(capsys):
    ref = str(HOSTFACTS / f"{REF}.json")
    h200 = str(HOSTFACTS / f"{H200}.json")
    assert main(["doctor", "--profile", "glm5-nvfp4-tp8", "--facts", ref]) == 0
    table = capsys.readouterr().out
    assert "vm-without-p2p" in table and "saw:" in table and "source:" in table

    # warnings only (NVFP4 on Hopper): still exit 0
    assert main(["doctor", "--profile", "glm5-nvfp4-tp8", "--facts", h200, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    assert {f["id"] for f in data["findings"]} >= {"nvfp4-weights-arch"}
    assert set(data["findings"][0]) == {"id", "severity", "title", "evidence", "fix", "source"}


def test_cli_exits_1_on_error_findings(tmp_path, capsys):
    doc = facts_doc(REF)
    doc["driver"]["flavour"] = "proprietary"
    path = tmp_path / "prop.json"
    path.write_text(json.dumps(doc))
    assert main(["doctor", "--profile", "glm5-nvfp4-tp8", "--facts", str(path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert data["findings"][0]["id"] == "blackwell-open-driver"


def test_cli_bad_facts_is_input_error(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('{"gpus": [{"index": 0, "compute_cap": 12}]}')
    assert main(["doctor", "--profile", "glm5-nvfp4-tp8", "--facts", str(path)]) == 2
    assert "gpus[0].compute_cap" in capsys.readouterr().err


def test_cli_unknown_explicit_version_is_bad_input(capsys):
    ref = str(HOSTFACTS / f"{REF}.json")
    assert main(["doctor", "--profile", "glm5-nvfp4-tp8", "--facts", ref,
                 "--sglang-version", "0.4"]) == 2
    assert "--sglang-version: sglang_version: no flag catalog" in capsys.readouterr().err


def test_vm_allreduce_container_alternative():
    rule = "vm-allreduce-container-alternative"
    assert rule in fired("glm5-nvfp4-tp8", facts(REF))  # tp8, no EP, KVM without P2P
    assert rule not in fired("glm5-nvfp4-tp8", facts(BARE))
    assert rule not in fired("glm5-nvfp4-tp8-ep8", facts(REF))  # all-to-all, not all-reduce

    def in_lxc(doc):
        doc["virtualization"] = "lxc"  # a container: the host's own P2P, no guest

    assert rule not in fired("glm5-nvfp4-tp8", facts(REF, in_lxc))

    def measured(doc):
        doc["measured"] = {"state": "measured", "p2p": False, "p2p_result": "not_measured",
                           "all_reduce_busbw_gbs": 25.81, "all_reduce_size_bytes": 2147483648,
                           "record": "results/gpu1/20261203T154119Z-measure-gates.json"}

    found = {f.id: f for f in diagnose(load_profile("glm5-nvfp4-tp8"), facts(REF, measured))}
    assert "all-reduce busbw 25.81 GB/s at 2147483648 bytes" in found[rule].evidence
    assert "LXC container" in found[rule].fix


# --------------------------------------------------------------------------------------
# deepep-needs-nvlink: DeepEP on a box without NVLink or working P2P is a doctor error naming the
# host's verdict, and the serve preflight and the tuner's judge act on it.


REPO = Path(__file__).resolve().parents[3]
HOSTFACTS_DEAD_ENDS = REPO / "tests/fixtures/hostfacts"
BOX = json.loads((HOSTFACTS_DEAD_ENDS / "reference-box-kvm.json").read_text())
DEEPEP = REPO / "tests/fixtures/profiles/doctor-deepep-ep8.yaml"
DEEPEP_H200 = REPO / "tests/fixtures/profiles/doctor-deepep-h200.yaml"
RULE = "deepep-needs-nvlink"


def findings(profile, facts: dict) -> dict:
    return {f.id: f for f in diagnose(load_profile(str(profile)), HostFacts.from_dict(facts))}


def test_doctor_cli_exits_non_zero_with_the_error_on_the_reference_box(capsys):
    rc = main(["doctor", "--profile", str(DEEPEP), "--facts",
               str(HOSTFACTS_DEAD_ENDS / "reference-box-kvm.json")])
    out = capsys.readouterr().out
    assert rc == 1
    line = next(x for x in out.splitlines() if RULE in x)
    assert line.startswith("ERROR")
    # the host's verdicts: the links topo -m reported, the VM, the driver's P2P verdict
    assert "joined by PHB, no NVLink in a kvm guest" in out
    assert "topo -p2p verdict none" in out


def test_the_measured_verdict_is_named_when_the_host_was_measured():
    facts = copy.deepcopy(BOX)
    facts["measured"] = {"p2p": False, "p2p_result": "not_measured", "driver_p2p": "none",
                         "record": "/etc/gpuserve/measured.json"}
    f = findings(DEEPEP, facts)[RULE]
    assert f.severity == "error"
    assert "measured P2P: P2P was not measured (driver verdict none, or a VM)" in f.evidence
    assert "/etc/gpuserve/measured.json" in f.evidence
    # P2P measured working: DeepEP's peer access is there, no error
    facts["measured"].update(p2p=True, p2p_result="ok")
    assert RULE not in findings(DEEPEP, facts)


def test_nvlink_box_and_other_backends_stay_silent():
    h200 = json.loads((HOSTFACTS_DEAD_ENDS / "h200-nvlink.json").read_text())
    assert RULE not in findings(DEEPEP_H200, h200)
    # the same DeepEP profile on the PCIe box: the error, so the rule reads the facts
    assert RULE in findings(DEEPEP_H200, BOX)
    # the shipped EP8 profile (flashinfer all-to-all) is not DeepEP
    assert RULE not in findings("glm5-nvfp4-tp8-ep8", BOX)
    # links unknown (no topo -m): an unknown fact never fires
    unknown = copy.deepcopy(BOX)
    unknown["topology"]["links"] = None
    assert RULE not in findings(DEEPEP, unknown)


def runtime(home):
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8,
                       gpu_list=tuple(BOX["gpus"]))


def test_serve_preflight_refuses_it_before_any_change():
    with pytest.raises(PreflightError, match=f"doctor error {RULE}: moe.a2a_backend deepep"):
        plan_of({"profile": str(DEEPEP)}, "inv.py", runtime, host_facts=lambda: BOX)


def test_tuner_judge_prunes_it():
    snapshot = HostSnapshot(host="gpu1", sglang_version="0.5.23", lock="l", gpus=BOX["gpus"],
                            checkpoint=None, host_facts=BOX, host_json=None)
    verdict = judge(load_profile(str(DEEPEP)), None, snapshot, calibration_gib=None,
                    comm=None, peak_batch=1)
    assert verdict.pruned is not None and verdict.pruned.startswith(f"doctor {RULE}: ")
    assert "fix: set moe.a2a_backend flashinfer" in verdict.pruned


# --------------------------------------------------------------------------------------
# Doctor rules ep-experts-divisible and tp-heads-divisible (gpuserve/doctor/rules.py).
#
# Violating profiles are fixtures (tests/fixtures/profiles/doctor-*.yaml, each says which assert of
# SGLang it trips); the shipped profiles must pass on every shipped facts file.


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HOSTFACTS_DIVISIBILITY = sorted((FIXTURES / "hostfacts").glob("*.json"))
H200_DIVISIBILITY = FIXTURES / "hostfacts" / "h200-nvlink.json"
RULES = {"ep-experts-divisible", "tp-heads-divisible"}


def findings_divisibility(profile: Path, facts: Path = H200_DIVISIBILITY) -> dict[str, str]:
    host = HostFacts.from_dict(json.loads(facts.read_text()), facts.name)
    return {f.id: f.evidence for f in diagnose(load_profile(profile), host) if f.id in RULES}


def test_redundant_experts_not_dividing_ep_is_an_error():
    found = findings_divisibility(FIXTURES / "profiles" / "doctor-ep-experts-redundant.yaml")
    assert set(found) == {"ep-experts-divisible"}
    assert "256 routed experts + 4 redundant = 260" in found["ep-experts-divisible"]
    assert "ep 8 leaves 4 over" in found["ep-experts-divisible"]


def test_heads_not_dividing_tp_is_an_error():
    found = findings_divisibility(FIXTURES / "profiles" / "doctor-tp-heads-llama70b-tp6.yaml")
    assert set(found) == {"tp-heads-divisible"}
    evidence = found["tp-heads-divisible"]
    # the planner's own words (gpuserve.memory.planner.heads_problems): one check
    assert "num_attention_heads 64 do not split over 6 ranks (64 % 6 = 4)" in evidence
    assert "num_key_value_heads 8 do not split over 6 ranks (8 % 6 = 2)" in evidence


def test_attention_dp_shards_heads_over_attention_tp_only():
    # tp 8 / attention_dp 2 = 4 attention ranks: 64 heads and 4 KV heads both fit.
    assert findings_divisibility(FIXTURES / "profiles" / "doctor-tp-heads-attn-dp.yaml") == {}


def test_cli_exits_nonzero_with_evidence(capsys):
    rc = main(["doctor", "--profile",
               str(FIXTURES / "profiles" / "doctor-ep-experts-redundant.yaml"),
               "--facts", str(H200_DIVISIBILITY)])
    out = capsys.readouterr().out
    assert rc != 0
    assert "ep-experts-divisible" in out and "fused_moe_triton/layer.py" in out


@pytest.mark.parametrize("facts", HOSTFACTS_DIVISIBILITY, ids=lambda p: p.stem)
@pytest.mark.parametrize("profile", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_profiles_divide_evenly(profile, facts):
    assert findings_divisibility(profile, facts) == {}


# --------------------------------------------------------------------------------------
# The fabric-not-ready rule: an NVSwitch host whose GPUs' fabric registration is not done (CUDA
# error 802) gets the Fabric Manager fix; PCIe hosts (every field N/A) and registered ones get
# nothing. States as nvidia-smi prints them (tests/fixtures/gpuhost).


HOSTFACTS_FABRIC = Path(__file__).resolve().parents[2] / "fixtures" / "hostfacts"
PROFILE = "qwen3-235b-a22b-fp8-h200-tp8"


def _facts(states: list[tuple[str, str]] | None) -> HostFacts:
    doc = copy.deepcopy(json.loads((HOSTFACTS_FABRIC / "h200-nvlink.json").read_text()))
    if states is not None:
        doc["fabric"] = [{"bus_id": g["bus_id"], "state": s, "status": st}
                         for g, (s, st) in zip(doc["gpus"], states, strict=False)]
    return HostFacts.from_dict(doc, "h200-nvlink.json")


def _finding(states):
    found = [f for f in diagnose(load_profile(PROFILE), _facts(states))
             if f.id == "fabric-not-ready"]
    return found[0] if found else None


def test_in_progress_fabric_maps_802_to_fabric_manager():
    finding = _finding([("In Progress", "N/A")] * 8)
    assert finding is not None and finding.severity == "error"
    text = json.dumps(finding.to_dict())
    assert "802" in text and "nvidia-fabricmanager" in text and "In Progress" in text


def test_completed_with_error_status_fires():
    finding = _finding([("Completed", "Success")] * 7 + [("Completed",
                                                          "Insufficient Resources")])
    assert finding is not None and "Insufficient Resources" in json.dumps(finding.to_dict())


def test_registered_pcie_and_unknown_are_silent():
    assert _finding([("Completed", "Success")] * 8) is None
    assert _finding([("N/A", "N/A")] * 8) is None
    assert _finding(None) is None


def test_document_carries_the_fabric_query():
    lines = ["00000000:1B:00.0, In Progress, N/A", "00000000:43:00.0, Completed, Success"]
    doc = document_from_sections({"fabric": lines})
    assert doc["fabric"] == [
        {"bus_id": "00000000:1B:00.0", "state": "In Progress", "status": "N/A"},
        {"bus_id": "00000000:43:00.0", "state": "Completed", "status": "Success"}]
    assert document_from_sections({})["fabric"] is None


# --------------------------------------------------------------------------------------
# Doctor rule allreduce-without-measured-p2p and the optional host-facts ``measured`` section.
#
# The driver's P2P verdict can read OK while the P2P transport hangs (RTX PRO 6000: rtx6kpro#15,
# nccl#1999), so the rule reads what the measuring run found.


FIXTURES_MEASURED = Path(__file__).resolve().parents[2] / "fixtures"
BARE_MEASURED = FIXTURES_MEASURED / "hostfacts" / "bare-metal-p2p.json"
RULE_MEASURED = "allreduce-without-measured-p2p"
GIB2 = 2147483648


def _run(name: str, env: dict | None = None) -> gates.Measurement:
    from gpuserve.parsers.nccl_tests import parse_nccl_tests

    result = parse_nccl_tests((FIXTURES_MEASURED / "gates" / name).read_text())
    return gates.measurement_from(result, GIB2, env)


def facts_with(measured: dict | None) -> HostFacts:
    doc = json.loads(BARE_MEASURED.read_text())
    if measured is not None:
        doc["measured"] = measured
    return HostFacts.from_dict(doc, BARE_MEASURED.name)


def child_measured(tmp_path: Path, body: dict):
    path = tmp_path / "child.yaml"
    path.write_text(yaml.safe_dump({"extends": str(PROFILES_DIR / "glm5-nvfp4-tp8.yaml"),
                                    **body}))
    return load_profile(path)


def fired_measured(profile, facts: HostFacts) -> dict[str, str]:
    return {f.id: f.evidence for f in diagnose(profile, facts) if f.id == RULE_MEASURED}


def _section(on) -> dict:
    off = _run("all_reduce_pro6000x8_p2p_off_composed.txt", {"NCCL_P2P_DISABLE": "1"})
    choice = gates.choose_nccl_env("ok", on, off)
    key = gates.figure_key("all_reduce_busbw", GIB2)
    doc = {"choice": choice.to_dict(),
           "figures": {key: (off if not choice.p2p else on).busbw_gbs}}
    return gates.measured_section(doc, "results/gpu1/20261201T010000Z-measure-gates.json")


def test_hang_measured_with_custom_allreduce_is_an_error(tmp_path):
    # The driver says P2P OK (bare-metal-p2p facts) but P2P hung when measured.
    section = _section(gates.Hang("all_reduce_perf", 300))
    assert section["p2p"] is False and section["p2p_hang"] is True
    profile = child_measured(tmp_path, {"communication": {"disable_custom_all_reduce": False}})
    # the measured choice turns custom all-reduce off itself (host.json): nothing to say
    assert section["disable_custom_all_reduce"] is True
    assert fired_measured(profile, facts_with(section)) == {}
    # a section that does not say what the host chose (written by hand): the rule fires
    section = {k: v for k, v in section.items() if k not in ("disable_custom_all_reduce",
                                                               "env")}
    found = fired_measured(profile, facts_with(section))
    assert "custom all-reduce" in found[RULE_MEASURED] and "P2P hung" in found[RULE_MEASURED]
    assert "25.81 GB/s" in found[RULE_MEASURED] and "measure-gates.json" in found[RULE_MEASURED]
    severity = {f.id: f.severity for f in diagnose(profile, facts_with(section))}[RULE_MEASURED]
    assert severity == "error"


def test_pcie_ipc_without_measured_p2p(tmp_path):
    slower = _section(_run("all_reduce_pro6000x8_p2p_off_composed.txt"))  # not faster
    assert slower["p2p"] is False and slower["p2p_hang"] is False
    profile = child_measured(tmp_path, {"communication": {"pcie_ipc_allreduce": True}})
    found = fired_measured(profile, facts_with(slower))
    assert found[RULE_MEASURED].startswith("PCIe-IPC all-reduce with tp 8")
    assert "not measured working and faster" in found[RULE_MEASURED]


def test_silent_when_measured_p2p_works_or_unknown(tmp_path):
    working = _section(_run("all_reduce_pro6000x8_p2p_on_composed.txt"))
    assert working["p2p"] is True
    custom = child_measured(tmp_path, {"communication": {"disable_custom_all_reduce": False}})
    assert fired_measured(custom, facts_with(working)) == {}
    assert fired_measured(custom, facts_with(None)) == {}  # no measuring run yet: unknown
    assert fired_measured(custom, facts_with({"p2p": None})) == {}
    off = child_measured(tmp_path, {"communication": {"disable_custom_all_reduce": True,
                                             "insist": "reproducing a report"}})
    hung = _section(gates.Hang("all_reduce_perf", 300))
    assert fired_measured(off, facts_with(hung)) == {}  # nothing needs P2P


@pytest.mark.parametrize("profile", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_profiles_on_shipped_facts_stay_silent(profile):
    for facts in sorted((FIXTURES_MEASURED / "hostfacts").glob("*.json")):
        host = HostFacts.from_dict(json.loads(facts.read_text()), facts.name)
        assert fired_measured(load_profile(profile), host) == {}


def test_measured_section_is_optional_and_checked():
    doc = json.loads(BARE_MEASURED.read_text())
    facts = HostFacts.from_dict(doc)
    assert facts.measured is None and "measured" not in facts.to_dict()
    with_m = facts_with({"p2p": False, "p2p_hang": True, "all_reduce_busbw_gbs": 25,
                         "record": "r.json"})
    assert with_m.measured == Measured(False, True, 25.0, "r.json")
    assert HostFacts.from_dict(with_m.to_dict()) == with_m
    bad = copy.deepcopy(doc)
    bad["measured"] = {"p2p": "yes"}
    with pytest.raises(InputError, match=r"x.json: measured.p2p: must be true/false"):
        HostFacts.from_dict(bad, "x.json")


# ----------------------------------------------------------------------------- the document
# measured.json as the measuring stage writes it (gate_runs.measured_json from an
# evaluation of the composed fixtures), read by the document in the same command.

FIX_GATES = FIXTURES_MEASURED / "gates"
OFF_TXT = "all_reduce_pro6000x8_p2p_off_composed.txt"


def _evaluation(driver_p2p: str, texts: dict, virtualization: str = "none", records=(),
                slow: float = 1.0):
    from gpuserve.measure import gate_runs as gr

    runs = gr.run_plan("/n", "/p", 8, driver_p2p, virtualization)
    lines: list[str] = []
    for i, run in enumerate(runs):
        name = texts[run.label]
        if name is None:
            lines += (FIX_GATES / "all_reduce_pro6000x8_hang_composed.txt").read_text() \
                .splitlines()
            lines.append(f"{gr.MARKER} {i} 124")
            continue
        text = (FIX_GATES / name).read_text()
        lines += (_slowed(text, slow) if run.tool == "all_reduce_perf" else text).splitlines()
        lines.append(f"{gr.MARKER} {i} 0")
    links = [["X" if i == j else "NODE" for j in range(8)] for i in range(8)]
    facts = {"gpus": [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
                      for i in range(8)], "virtualization": virtualization,
             "topology": {"links": links, "p2p": driver_p2p}}
    return gr.evaluate(gr.split_runs(lines, runs, 30), host="gpu1",
                       timestamp="2026-12-01T10:00:00Z", facts=facts,
                       driver_p2p=driver_p2p, exp=gates.load_expectations(),
                       sources=gates.load_sources(), records=records)


def _slowed(text: str, factor: float) -> str:
    """The lab's gates-slow switch in Python: times x factor, algbw and busbw / factor."""
    if factor == 1:
        return text
    out = []
    for line in text.splitlines():
        f = line.split()
        if f and f[0].isdigit() and len(f) >= 13:
            for i in (5, 9):
                f[i] = f"{float(f[i]) * factor:.1f}"
            for i in (6, 7, 10, 11):
                f[i] = f"{float(f[i]) / factor:.2f}"
            line = "  ".join(f)
        out.append(line)
    return "\n".join(out)


def _document(measured_text: str | None, facts: Path = BARE_MEASURED) -> dict:
    """The host-facts document as gathered: the fixture's sections plus measured.json."""
    from gpuserve.facts.document import _measured

    doc = json.loads(facts.read_text())
    doc["measured"] = _measured([] if measured_text is None else measured_text.splitlines())
    return doc


def test_document_reads_measured_json_in_the_same_command():
    from gpuserve.facts.document import HostFactsDocument, document_from_sections
    from gpuserve.measure import gate_runs as gr
    from gpuserve.parsers.sections import marker

    script = HostFactsDocument().command().get_raw_value()
    assert marker("measured") in script and gr.MEASURED_JSON in script
    ev = _evaluation("ok", {"p2p_on": None, "p2p_off": OFF_TXT,
                            "matrix": "p2p_bw_full_composed.txt"})
    text = gr.measured_json(ev, "fp1")
    doc = document_from_sections({"measured": text.splitlines()})
    m = doc["measured"]
    assert m["state"] == "measured" and m["p2p"] is False and m["p2p_result"] == "hung"
    assert m["env"] == {"NCCL_P2P_DISABLE": "1"} and m["disable_custom_all_reduce"] is True
    assert m["driver_p2p"] == "ok" and m["topology_class"] == "pcie-no-p2p"
    assert m["all_reduce_busbw_gbs"] == 25.81 and m["all_reduce_size_bytes"] == GIB2
    assert m["all_reduce_status"] == "baseline" and m["record"] == gr.MEASURED_JSON
    facts = HostFacts.from_dict(_document(text), "doc.json")
    assert facts.measured.p2p_result == "hung" and facts.measured.ready is True
    assert HostFacts.from_dict(facts.to_dict()) == facts
    # not gathered (an older document), absent, unreadable, not ours
    assert document_from_sections({})["measured"] is None
    assert document_from_sections({"measured": []})["measured"] == {"state": "none"}
    assert document_from_sections({"measured": ["##gpuserve-unreadable##"]})[
        "measured"] is None
    assert document_from_sections({"measured": ['{"schema": "other"}']})["measured"] is None
    assert document_from_sections({"measured": ["{not json"]})["measured"] is None


def test_measured_hang_names_the_chosen_env_and_is_an_error(tmp_path):
    from gpuserve.measure import gate_runs as gr

    ev = _evaluation("ok", {"p2p_on": None, "p2p_off": OFF_TXT,
                            "matrix": "p2p_bw_full_composed.txt"})
    facts = HostFacts.from_dict(_document(gr.measured_json(ev, "fp1")))
    ipc = child_measured(tmp_path, {"communication": {"pcie_ipc_allreduce": True}})
    findings = {f.id: f for f in diagnose(ipc, facts)}
    evidence = findings[RULE_MEASURED].evidence
    assert findings[RULE_MEASURED].severity == "error"
    assert "P2P hung in the measuring run" in evidence and "25.81 GB/s" in evidence
    assert "NCCL env chosen: NCCL_P2P_DISABLE=1" in evidence
    assert gr.MEASURED_JSON in evidence
    # custom all-reduce alone is silent: the measured choice turns it off (host.json)
    custom = child_measured(tmp_path, {"communication": {"disable_custom_all_reduce": False}})
    assert RULE_MEASURED not in {f.id for f in diagnose(custom, facts)}
    # the driver reads ok, the profile disables P2P: measured right, not "needless"
    no_p2p = child_measured(tmp_path, {"env": {"NCCL_P2P_DISABLE": "1"},
                              "communication": {"insist": "reproducing a report"}})
    ids = {f.id for f in diagnose(no_p2p, facts)}
    assert "nccl-p2p-disabled-needlessly" not in ids
    assert "nccl-p2p-disabled-needlessly" in {
        f.id for f in diagnose(no_p2p, HostFacts.from_dict(_document(None)))}


def test_slower_p2p_says_so_with_both_figures(tmp_path):
    from gpuserve.measure import gate_runs as gr

    ev = _evaluation("ok", {"p2p_on": OFF_TXT, "p2p_off": OFF_TXT,
                            "matrix": "p2p_bw_full_composed.txt"})
    facts = HostFacts.from_dict(_document(gr.measured_json(ev, "fp1")))
    assert facts.measured.p2p_result == "slower"
    ipc = child_measured(tmp_path, {"communication": {"pcie_ipc_allreduce": True}})
    evidence = {f.id: f.evidence for f in diagnose(ipc, facts)}[RULE_MEASURED]
    assert evidence.startswith("PCIe-IPC all-reduce with tp 8")
    assert "not measured working and faster" in evidence


def test_below_expectation_is_a_warning_with_the_numbers(tmp_path):
    from gpuserve.measure import gate_runs as gr

    texts = {"p2p_off": OFF_TXT, "matrix": "p2p_bw_full_composed.txt"}
    first = _evaluation("none", texts, virtualization="kvm")
    slow = _evaluation("none", texts, virtualization="kvm", records=[first.record], slow=2)
    assert not slow.ready
    facts = HostFacts.from_dict(_document(gr.measured_json(slow, "fp2"),
                                          FIXTURES_MEASURED / "hostfacts"
                                          / "reference-box-kvm.json"))
    m = facts.measured
    assert m.all_reduce_status == "fail" and m.all_reduce_busbw_gbs == 12.9
    assert m.all_reduce_expected_gbs == 25.81 and m.all_reduce_limit_gbs == pytest.approx(
        18.067)
    profile = load_profile(PROFILES_DIR / "glm5-nvfp4-tp8.yaml")
    found = {f.id: f for f in diagnose(profile, facts)}["measured-below-expectation"]
    assert found.severity == "warn"
    assert "all_reduce_busbw@2147483648: 12.9 GB/s vs baseline 25.81 GB/s" in found.evidence
    assert "below the limit" in found.evidence and "all_reduce_latency@1024" in found.evidence
    assert "class pcie-no-p2p, NCCL env NCCL_P2P_DISABLE=1" in found.evidence
    # the same host measured as before: nothing to say
    ok = HostFacts.from_dict(_document(gr.measured_json(first, "fp1"),
                                       FIXTURES_MEASURED / "hostfacts" / "reference-box-kvm.json"))
    assert "measured-below-expectation" not in {f.id for f in diagnose(profile, ok)}


def test_a_host_not_ready_is_below_expectation_too():
    from gpuserve.measure import gate_runs as gr

    ev = _evaluation("none", {"p2p_off": "all_reduce_pro6000x7_missing_gpu_composed.txt",
                              "matrix": "p2p_bw_full_composed.txt"}, virtualization="kvm")
    facts = HostFacts.from_dict(_document(gr.measured_json(ev, "fp1"),
                                          FIXTURES_MEASURED / "hostfacts"
                                          / "reference-box-kvm.json"))
    profile = load_profile(PROFILES_DIR / "glm5-nvfp4-tp8.yaml")
    found = {f.id: f.evidence for f in diagnose(profile, facts)}
    assert "gpus_present: 7 of the host's 8 GPUs took part" in found[
        "measured-below-expectation"]


def test_no_measurement_or_a_stale_one_is_said():
    profile = load_profile(PROFILES_DIR / "glm5-nvfp4-tp8.yaml")
    none = HostFacts.from_dict(_document(None))
    found = {f.id: f for f in diagnose(profile, none)}["gates-not-measured"]
    assert found.severity == "info"
    assert "no measured.json on a host with 8 GPUs" in found.evidence
    assert "driver's P2P verdict (ok)" in found.evidence
    # a document without the section (older, or written by hand) says nothing
    assert "gates-not-measured" not in {f.id for f in diagnose(profile, facts_with(None))}
    # measured under verdict none (the box was a VM then), the driver says ok now
    stale = facts_with({"state": "measured", "p2p": False, "driver_p2p": "none",
                        "record": "/etc/gpuserve/measured.json"})
    evidence = {f.id: f.evidence for f in diagnose(profile, stale)}["gates-not-measured"]
    assert "measured under driver P2P verdict none, the driver now reports ok" in evidence
    current = facts_with({"state": "measured", "p2p": False, "driver_p2p": "ok"})
    assert "gates-not-measured" not in {f.id for f in diagnose(profile, current)}


def test_measured_section_fields_are_checked():
    for bad, field in (({"state": "maybe"}, "measured.state"),
                       ({"p2p_result": "fast"}, "measured.p2p_result"),
                       ({"env": {"A": 1}}, "measured.env"),
                       ({"problems": "x"}, "measured.problems"),
                       ({"failed": [{"check": "x"}]}, r"measured.failed\[0\]")):
        doc = json.loads(BARE_MEASURED.read_text())
        doc["measured"] = bad
        with pytest.raises(InputError, match=f"x.json: {field}"):
            HostFacts.from_dict(doc, "x.json")
