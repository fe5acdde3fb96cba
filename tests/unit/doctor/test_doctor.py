"""Doctor rules: each fires on its bad case and stays silent on the good one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpuserve.cli import main
from gpuserve.doctor.rules import PREDICATES, RULES_PATH, diagnose, load_rules
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.profiles import PROFILES_DIR, load_profile

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
