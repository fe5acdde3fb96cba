"""``gpuserve check INVENTORY``: the deploys' prepare-time checks for every host of a real
pyinfra inventory file (group data and --data applied by pyinfra's own loader), with
every way of reaching a host made to fail, so a connection attempt would show."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import paramiko
import pytest

from gpuserve.cli import main
from tests.cli_fork import run_pyinfra

REPO = Path(__file__).resolve().parents[3]

BAD_BENCH_PROFILE = """\
description: a profile whose bench scenario cannot keep its concurrency busy
sglang_versions: ["0.5.23"]
model:
  path: /models/x
bench:
  scenarios:
    tiny:
      concurrency: 8
      prompts: 2
"""


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """Any attempt to reach a host fails the test loudly; cwd and sys.path are the
    test's own (the loader appends cwd to sys.path, as pyinfra's CLI does)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"gpuserve check tried to connect: {args!r:.200}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")


def fleet(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    """An inventory file ``inv/fleet.py`` (group ``fleet``) with unreachable addresses."""
    inv = tmp_path / "inv"
    inv.mkdir(exist_ok=True)
    rows = [(name, {"ssh_hostname": "192.0.2.10", **data}) for name, data in hosts.items()]
    path = inv / "fleet.py"
    path.write_text(f"fleet = {rows!r}\n")
    return path


def check(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def line(out: str, host: str, deploy: str) -> str:
    return next(ln for ln in out.splitlines() if ln.split()[:2] == [host, deploy])


def test_good_and_bad_bench_host_exit_1_naming_file_and_field(tmp_path, capsys) -> None:
    bad = tmp_path / "badbench.yaml"
    bad.write_text(BAD_BENCH_PROFILE)
    inv = fleet(tmp_path, {"gpu1": {"profile": "glm5-nvfp4-tp8"},
                           "gpu2": {"profile": str(bad)}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1, out + err
    ok = line(out, "gpu1", "serve")
    assert " ok " in ok and "profile glm5-nvfp4-tp8" in ok and "2 bench scenarios" in ok
    assert "lock candidates sglang-0.5.23-cu13-py3" in ok
    assert "listens on 127.0.0.1:30000" in ok
    fail = line(out, "gpu2", "serve")
    assert " FAIL " in fail
    assert f"{bad}:9: bench.scenarios.tiny.prompts: 2 prompts cannot keep 8" in fail
    assert "# 2 hosts, 2 checks, 1 failed; no host was connected to" in out
    assert "not checked without the host (serve): driver, Python and glibc" in out
    assert "checkpoint memory fit" in out
    assert "Traceback" not in out + err


def test_bad_host_data_fails_that_host_and_deploy_only(tmp_path, capsys) -> None:
    inv = fleet(tmp_path, {
        "gpu1": {"profile": "glm5-nvfp4-tp8"},
        "gpu2": {"profile": "glm5-nvfp4-tp8", "nvidia_driver_branch": 575,
                 "health_timeout": -1},
    })
    rc, out, _ = check(capsys, str(inv))
    assert rc == 1
    assert " ok " in line(out, "gpu1", "serve") and " ok " in line(out, "gpu1", "host")
    assert "driver branch 580 (open), CUDA 13.0" in line(out, "gpu1", "host")
    assert f"{inv}: health_timeout: must be a finite number" in line(out, "gpu2", "serve")
    assert f"{inv}: cuda_lane: CUDA 13.0 needs driver >= 580.65.06" in line(out, "gpu2", "host")
    assert "not checked without the host (host): CPU vendor and ACPI tables" in out


def test_missing_profile_names_the_key(tmp_path, capsys) -> None:
    inv = fleet(tmp_path, {"gpu1": {}})
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1
    assert f"{inv}: profile: required" in line(out, "gpu1", "serve")


def test_data_override_applies_like_pyinfra(tmp_path, capsys) -> None:
    inv = fleet(tmp_path, {"gpu1": {"profile": "no-such-profile"},
                           "gpu2": {"profile": "no-such-profile"}})
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1 and "no-such-profile" in line(out, "gpu1", "serve")
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve", "--data",
                       "profile=glm5-nvfp4-tp8")
    assert rc == 0, out
    # values parsed like pyinfra's --data (0 is the integer, not the string)
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve", "--data",
                       "profile=glm5-nvfp4-tp8", "--data", "health_timeout=0")
    assert rc == 1
    assert f"{inv}: health_timeout: must be a finite number of seconds in (0, 86400], got 0" \
        in line(out, "gpu2", "serve")


def test_group_data_next_to_the_inventory_and_from_group_data_flag(tmp_path, capsys) -> None:
    inv = fleet(tmp_path, {"gpu1": {}, "gpu2": {"sglang_user": "svc"}})
    (tmp_path / "inv" / "group_data").mkdir()
    # the file's group (fleet): every host gets the profile; all: root as service user
    (tmp_path / "inv" / "group_data" / "fleet.py").write_text('profile = "glm5-nvfp4-tp8"\n')
    (tmp_path / "inv" / "group_data" / "all.py").write_text('sglang_user = "root"\n')
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1
    assert "sglang_user: root cannot run the server" in line(out, "gpu1", "serve")
    assert " ok " in line(out, "gpu2", "serve")  # host data wins over group data
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "all.py").write_text('sglang_user = "sglang"\nlisten_address = "8.8.8.8"\n')
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve", "--group-data", str(extra))
    assert rc == 1
    assert "listen_address" in line(out, "gpu2", "serve")
    assert "8.8.8.8" in line(out, "gpu2", "serve")


def test_json_shape(tmp_path, capsys) -> None:
    bad = tmp_path / "badbench.yaml"
    bad.write_text(BAD_BENCH_PROFILE)
    inv = fleet(tmp_path, {"gpu1": {"profile": "glm5-nvfp4-tp8"},
                           "gpu2": {"profile": str(bad)}})
    rc, out, _ = check(capsys, str(inv), "--json")
    assert rc == 1
    doc = json.loads(out)
    assert doc["inventory"] == str(inv) and doc["ok"] is False
    assert doc["deploys"] == ["serve", "host"]
    assert set(doc["not_checked"]) == {"serve", "host"}
    results = {(r["host"], r["deploy"]): r for r in doc["results"]}
    assert set(results) == {(h, d) for h in ("gpu1", "gpu2") for d in ("serve", "host")}
    good = results["gpu1", "serve"]
    assert good["ok"] is True and good["error"] is None
    d = good["details"]
    assert d["profile"] == "glm5-nvfp4-tp8" and d["sglang_version"] == "0.5.23"
    assert d["bench_scenarios"] == ["single", "batch"] and d["listen"] == "127.0.0.1:30000"
    assert {c["lock"] for c in d["lock_candidates"]} == {
        "sglang-0.5.23-cu13-py311", "sglang-0.5.23-cu13-py312"}
    assert all(c["ok"] for c in d["lock_candidates"])
    failed = results["gpu2", "serve"]
    assert failed["ok"] is False and "bench.scenarios.tiny.prompts" in failed["error"]
    assert results["gpu2", "host"]["details"]["cuda_lane"] == "13.0"


def test_other_lock_candidates_are_planned_and_their_problems_warned(tmp_path, capsys) -> None:
    # no sglang_versions: every catalog, so an R570 host (driver < 580) would get the
    # CUDA 12 lock of 0.5.10.post1, which has no PCIe-IPC all-reduce; its plan is run too
    prof = tmp_path / "anyversion.yaml"
    prof.write_text("model:\n  path: /models/x\ncommunication:\n  pcie_ipc_allreduce: true\n")
    inv = fleet(tmp_path, {"gpu1": {"profile": str(prof)}})
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve", "--json")
    assert rc == 0, out  # the newest lock renders: a host with a 580 driver is served
    result = json.loads(out)["results"][0]
    verdicts = {c["lock"]: c for c in result["details"]["lock_candidates"]}
    assert verdicts["sglang-0.5.23-cu13-py311"]["ok"] is True
    old = verdicts["sglang-0.5.10.post1-cu12-py311"]
    assert old["ok"] is False
    assert f"{prof}:4: communication.pcie_ipc_allreduce: SGLang 0.5.10.post1 has no" \
        in old["problem"]
    assert any(w.startswith("a host that picks lock sglang-0.5.10.post1-cu12-py311 "
                            "(Python 3.11, driver >= 570") for w in result["warnings"])
    # 0.5.19 needs the same driver as 0.5.23: no host would pick it over 0.5.23
    assert not any("0.5.19" in name for name in verdicts)
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve")
    assert "warn  a host that picks lock sglang-0.5.10.post1-cu12-py312" in out
    assert "lock candidates sglang-0.5.23-cu13-py312, sglang-0.5.23-cu13-py311 (" in out


def test_shipped_gpu_inventory_passes(monkeypatch, tmp_path, capsys) -> None:
    # the example names ~/.ssh/id_ed25519: check wants it there, private to its owner
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "id_ed25519").write_text("key\n")
    (tmp_path / "home" / ".ssh" / "id_ed25519").chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(REPO)
    rc, out, err = check(capsys, "inventory/gpu.py")
    assert rc == 0, out + err
    assert " ok " in line(out, "gpu1", "serve") and " ok " in line(out, "gpu1", "host")
    assert "profile glm5-nvfp4-tp8" in line(out, "gpu1", "serve")
    assert "weights /models/GLM-5-NVFP4 (local: must be on the host)" in line(out, "gpu1",
                                                                             "serve")


def test_lab_inventory_without_a_running_lab_is_a_clear_error(monkeypatch, tmp_path,
                                                              capsys) -> None:
    monkeypatch.setenv("GPUSERVE_LAB_HOME", str(tmp_path / "nolab"))
    monkeypatch.setenv("GPUSERVE_LAB_NAME", "checktest")
    rc, out, err = check(capsys, str(REPO / "inventory" / "lab.py"))
    assert rc == 2 and out == ""
    assert "inventory/lab.py: could not be loaded: LabNotRunning: lab instance " \
           "'checktest' is not running: run `python -m lab up`" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["nope.py"], "nope.py: no such inventory file"),
    (["INV", "--data", "profile"], "--data: profile: must be KEY=VALUE"),
    (["INV", "--group-data", "nowhere"], "nowhere: --group-data: no such file"),
])
def test_bad_usage_exits_2(tmp_path, capsys, argv, message) -> None:
    inv = fleet(tmp_path, {"gpu1": {"profile": "glm5-nvfp4-tp8"}})
    rc, out, err = check(capsys, *[str(inv) if a == "INV" else a for a in argv])
    assert rc == 2 and out == ""
    assert message in err


def test_unknown_deploy_is_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["check", "x.py", "--deploy", "kernel"])
    assert e.value.code == 2


def test_broken_inventory_file_names_it(tmp_path, capsys) -> None:
    inv = tmp_path / "broken.py"
    inv.write_text("gpu = [('gpu1', {})]\nraise ValueError('half-edited')\n")
    rc, _, err = check(capsys, str(inv))
    assert rc == 2
    assert f"{inv}: could not be loaded: ValueError: half-edited" in err


def test_same_message_as_the_serve_deploy_through_pyinfra(tmp_path, capsys) -> None:
    """The deploy (real pyinfra CLI, an @fake host) and the check print the same line."""
    bad = tmp_path / "badbench.yaml"
    bad.write_text(BAD_BENCH_PROFILE)
    inv = tmp_path / "fakeinv.py"
    inv.write_text(f"fakeinv = [('@fake/gpu1', {{'fake_delay': 0, 'profile': {str(bad)!r}}})]\n")
    deploy = run_pyinfra(["-y", str(inv), "deploy/serve.py"], REPO, timeout=120)
    expected = f"{bad}:9: bench.scenarios.tiny.prompts: 2 prompts cannot keep 8 requests"
    assert deploy.returncode != 0 and expected in deploy.stdout + deploy.stderr
    rc, out, _ = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1 and expected in line(out, "@fake/gpu1", "serve")


def test_multi_node_group_is_checked_without_connecting(tmp_path, capsys) -> None:
    """A two-node profile on the group ``fleet``: both hosts pass with their rank; a
    duplicate private address fails the host whose address repeats, naming the field."""
    two = REPO / "tests/fixtures/profiles/two-nodes.yaml"
    nodes = {"sglang_nodes_group": "fleet", "profile": str(two)}
    inv = fleet(tmp_path, {"gpu1": {**nodes, "private_address": "10.0.0.21"},
                           "gpu2": {**nodes, "private_address": "10.0.0.22"}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 0, out + err
    assert " ok " in line(out, "gpu1", "serve") and " ok " in line(out, "gpu2", "serve")
    (tmp_path / "dup").mkdir()
    inv = fleet(tmp_path / "dup", {"gpu1": {**nodes, "private_address": "10.0.0.21"},
                                   "gpu2": {**nodes, "private_address": "10.0.0.21"}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1, out + err
    fail = line(out, "gpu2", "serve")
    assert " FAIL " in fail and "private_address (host gpu2)" in fail
    assert "also host gpu1's" in fail


def test_interpreter_choice_reported_for_the_named_distribution(tmp_path, capsys) -> None:
    """Ubuntu 22.04's recorded answers (python3 3.10.12, python3.11 3.11.0~rc1): a
    managed CPython 3.12 and the py312 lock; Debian 13 with sglang_python=system is
    refused naming the key that fixes it."""
    inv = fleet(tmp_path, {
        "jammy": {"profile": "glm5-nvfp4-tp8", "host_distribution": "ubuntu2204"},
        "trixie": {"profile": "glm5-nvfp4-tp8", "host_distribution": "debian13",
                   "sglang_python": "system"},
        "other": {"profile": "glm5-nvfp4-tp8", "host_distribution": "centos7"}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve", "--json")
    assert rc == 1, out + err
    results = {r["host"]: r for r in json.loads(out)["results"]}
    chosen = results["jammy"]["details"]["interpreter"]
    assert (chosen["kind"], chosen["python"], chosen["lock"]) == (
        "managed", "3.12", "sglang-0.5.23-cu13-py312")
    assert len(chosen["sha256"]) == 64 and chosen["sha256"] in chosen["reason"]
    assert "3.11.0~rc1-1~22.04 (universe) is a pre-release" in chosen["reason"]
    assert "sglang_python=managed" in results["trixie"]["error"]
    assert "host_distribution: 'centos7' is not one of debian12, debian13" in (
        results["other"]["error"])


def test_debian13_host_check_names_the_branch_its_repository_has(tmp_path, capsys) -> None:
    inv = fleet(tmp_path, {"trixie": {"profile": "glm5-nvfp4-tp8",
                                      "host_distribution": "debian13"},
                           "trixie590": {"profile": "glm5-nvfp4-tp8",
                                         "host_distribution": "debian13",
                                         "nvidia_driver_branch": 590}})
    rc, out, err = check(capsys, str(inv), "--deploy", "host")
    assert rc == 1, out + err
    assert "nvidia_driver_branch: driver branch 580 cannot be installed on debian13" in (
        line(out, "trixie", "host"))
    assert " ok " in line(out, "trixie590", "host")


def test_a_hub_id_in_model_path_is_refused_before_connecting(tmp_path, capsys) -> None:
    """The offline server cannot load a bare Hub id: check says so (file, line, field)
    with the fix, by the serve deploy's own prepare code (plan.check_offline_model)."""
    mine = tmp_path / "dsv3.yaml"
    mine.write_text(f"extends: {REPO}/profiles/deepseek-v3-fp8-h200-tp8.yaml\n"
                    "model:\n  hf: null\n  path: deepseek-ai/DeepSeek-V3\n")
    inv = fleet(tmp_path, {"gpu1": {"profile": str(mine)}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1, out + err
    bad = line(out, "gpu1", "serve")
    assert f"{mine}:4: model.path: 'deepseek-ai/DeepSeek-V3' is a Hub id" in bad
    assert "model.hf: deepseek-ai/DeepSeek-V3@<40-hex commit>" in bad


def test_a_newcomer_profile_is_one_extends_and_one_line(tmp_path, capsys) -> None:
    """The shape docs/weights.md shows: a shipped profile, and the checkpoint pinned."""
    mine = tmp_path / "glm5-hub.yaml"
    mine.write_text(f"extends: {REPO}/profiles/glm5-nvfp4-tp8.yaml\n"
                    "model: {path: null, hf: nvidia/GLM-5-NVFP4@"
                    "dc54ff55a7e9e71b85db953d8bc22eca894b44c6}\n")
    inv = fleet(tmp_path, {"gpu1": {"profile": str(mine)}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 0, out + err
    ok = line(out, "gpu1", "serve")
    assert "profile glm5-hub" in ok
    assert "weights nvidia/GLM-5-NVFP4@dc54ff55a7e9e71b85db953d8bc22eca894b44c6 (the deploy " \
           "fetches and verifies them)" in ok
