"""roles/gpu_gates and its wiring: the host deploy's plan with and without gates, bad
gates host data stopped before any operation, a finished build never rebuilt, and
roles/nccl following a measured choice over the driver's verdict."""

from __future__ import annotations

import json

from gpuserve.measure import gate_runs, gates
from gpuserve.roles import gpu_gates
from tests.unit.host.test_host_deploy_scripts import MIRROR, run
from tests.unit.host.test_host_roles import P2P_OK, plan, runs, uploads

GATE_OPS = ("build tools for the measuring tools (build-essential, cmake, git)",
            "system NCCL (libnccl2, libnccl-dev) for nccl-tests",
            "build nccl-tests 2.19.6 (a0b82b2260cf)", "build cuda-samples 13.0 (3f1c50965017)",
            "measure all-reduce and P2P; choose the NCCL env")


def test_dry_run_plans_the_measuring_stage_last_and_gates_off_removes_it(tmp_path):
    r = run(tmp_path, "deploy/host.py", MIRROR, "--dry")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    positions = [out.rindex(op) for op in GATE_OPS]  # pyinfra's list, after the preview
    assert positions == sorted(positions)
    assert out.index("NCCL env and host.json from the P2P verdict") < positions[0]
    r = run(tmp_path, "deploy/host.py", {**MIRROR, "gates": False}, "--dry")
    assert r.returncode == 0 and not any(op in r.stdout + r.stderr for op in GATE_OPS)


def test_bad_gates_data_stops_before_any_operation(tmp_path):
    data = {**MIRROR, "gates_sources": {"nccl-tests": {"url": "http://m/n.tar.gz",
                                                       "sha256": "not-a-digest"}}}
    r = run(tmp_path, "deploy/host.py", data, "-y")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert (f"{tmp_path / 'fakeinv.py'}: gates_sources.nccl-tests.sha256: must be 64 "
            "lowercase hex digits") in out
    assert "Beginning operation run" not in out and "Traceback" not in out


SETTINGS = gate_runs.gate_settings({}, "inv.py")
NCCL_FOUND = ["system /usr/lib/x86_64-linux-gnu"]
DEST = "/opt/gpuserve/gates/nccl-tests-2.19.6-a0b82b2260cf-system"


def test_build_runs_the_pinned_fetch_and_build_once():
    ops = plan(gpu_gates.build_tool, {"libnccl.so.2": NCCL_FOUND}, tool="nccl-tests",
               settings=SETTINGS)
    (script,) = runs(ops)
    assert "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432" in script
    assert f"dest={DEST}" in script and "NCCL_HOME=" in script
    stamp = f"{DEST}/{gate_runs.STAMP}"
    built = {"libnccl.so.2": NCCL_FOUND,
             f"-- {stamp}": [f"stat 644 root root regular file|{stamp}", f"{'a' * 40}  {stamp}"]}
    assert runs(plan(gpu_gates.build_tool, built, tool="nccl-tests", settings=SETTINGS)) == []


def test_build_without_any_nccl_fails_the_host_naming_what_is_missing():
    ops = plan(gpu_gates.build_tool, {}, tool="nccl-tests", settings=SETTINGS)
    assert [c for _, cmds in ops for c in cmds] == [("function", "report")]


def test_nccl_env_follows_the_measured_choice_over_the_driver_verdict():
    from gpuserve.roles import nccl

    choice = gates.choose_nccl_env("ok", gates.Hang("all_reduce_perf", 30.0),
                                   gates.Measurement(25.8, 2147483648, 35.0)).to_dict()
    measured = json.dumps({"schema": "gpuserve.measured/1", "fingerprint": "f",
                           "choice": choice}, indent=2).splitlines()
    ops = plan(nccl.configure_nccl, {"systemd-detect-virt": ["none"], "topo -p2p": P2P_OK,
                                     gate_runs.MEASURED_JSON: measured})
    files = uploads(ops)
    assert "NCCL_P2P_DISABLE=1" in files["/etc/gpuserve/nccl.env"].splitlines()
    doc = json.loads(files["/etc/gpuserve/host.json"])
    assert doc["p2p"] == "ok" and doc["disable_custom_all_reduce"] is True
    assert doc["measured_nccl"]["reason"].startswith("P2P on hung (all_reduce_perf")


def test_host_plan_takes_the_collectives_from_the_serve_profile():
    from gpuserve.plans.host import plan_host

    def collectives(**data):
        return plan_host({**MIRROR, **data}, "inv.py").gates.collectives

    assert collectives() == ("all_reduce",)
    assert collectives(profile="glm5-nvfp4-tp8") == ("all_reduce",)
    assert collectives(profile="glm5-nvfp4-tp8-ep8") == ("all_reduce", "all_gather",
                                                         "alltoall")
    assert collectives(profile="glm5-nvfp4-tp8-ep8",
                       gates_collectives=["all_reduce"]) == ("all_reduce",)
