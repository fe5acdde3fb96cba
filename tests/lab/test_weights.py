"""Weights from the lab's Hub stand-in (lab/hub) onto the container host, end to end:
the real pyinfra CLI runs deploy/serve.py with ``model.hf`` profiles, the controller and
the host use the product's Hub client (hub_client.py), the stand-in's counters show what
crossed the wire.

Order (module-scoped, one host): a profile that cannot fit is refused from the remote
headers before any download and any host change; a models directory too small is
refused before the download; the first deploy of one that fits downloads (one shard's
transfer cut in the middle and resumed, another served corrupted once and fetched
again), verifies, seals and serves it; a rerun downloads nothing and makes no Hub
request at all. And ``gpuserve plan --hf`` against the stand-in plans the 80-shard GLM-5
checkpoint from its headers exactly as from its files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from labhelpers import healthy, lab_hub

from gpuserve.launch.hf_source import HfSource
from gpuserve.memory.remote import Where, read_remote

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
TINY = "gpuserve-lab/Tiny-Llama-3L"
BIG = "gpuserve-lab/Llama-3.1-70B"
GLM = "gpuserve-lab/GLM-5-NVFP4"
SHARD1 = "model-00001-of-00003.safetensors"
SHARD2 = "model-00002-of-00003.safetensors"
HF_TOKEN = "hf_labWeightsTokenNeverOnArgv0123"
UNIT = "gpuserve-sglang.service"
MODELS = "/opt/gpuserve/models"
TINY_MODELS = "/srv/tiny-disk/models"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CHUNK = 10 * 1024 * 1024  # a cut past the first 10 MiB (resumed from where it stopped)


@pytest.fixture(scope="module")
def hub(lab):
    # the memory fit needs the host's GPUs: on a fresh lab host, the host deploy first
    # (in the full tier test_container_host.py has run it already)
    if lab.ssh("nvidia-smi -L").returncode != 0:
        lab.run_pyinfra("deploy/host.py")
    return lab_hub(lab)


@pytest.fixture(scope="module")
def profiles(hub, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("weights-profiles")
    tiny, big = hub.main_commit(TINY), hub.main_commit(BIG)
    (d / "tiny-hf.yaml").write_text(
        "description: the lab Hub's small checkpoint, fetched by the deploy\n"
        f"model:\n  hf: {TINY}@{tiny}\nparallel:\n  tp: 1\n")
    (d / "big-hf-tp1.yaml").write_text(
        "description: Llama-3.1-70B BF16 on one lab GPU, cannot fit\n"
        f"model:\n  hf: {BIG}@{big}\nparallel:\n  tp: 1\n")
    return {"tiny": d / "tiny-hf.yaml", "big": d / "big-hf-tp1.yaml"}


@pytest.fixture(scope="module")
def group_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("weights-group-data")
    (d / "all.py").write_text(f"hf_token = {HF_TOKEN!r}\n")
    return d


def serve(lab, hub, profile: Path, group_data: Path, *data: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/serve.py", "--data", f"profile={profile}",
                        "--data", f"hf_endpoint={hub.url}",
                        "--data", f"hf_plan_endpoint={hub.local_url}",
                        *[a for kv in data for a in ("--data", kv)],
                        "--group-data", str(group_data), check=False)
    return r.returncode, ANSI.sub("", r.stdout)


def fingerprint(lab) -> str:
    return lab.ssh("ls -la --time-style=full-iso /etc/systemd/system /etc/gpuserve "
                   f"/opt/gpuserve {MODELS} 2>&1; systemctl show -p InvocationID {UNIT}",
                   check=True).stdout


def shard_stats(hub, repo: str) -> dict[str, dict]:
    return {k.rsplit("/", 1)[1]: v for k, v in hub.stats()["files"].items()
            if k.startswith(repo + "/") and k.endswith(".safetensors")}


def test_a_profile_that_cannot_fit_is_refused_from_the_headers(lab, hub, profiles,
                                                               group_data):
    hub.reset()
    before = fingerprint(lab)
    rc, out = serve(lab, hub, profiles["big"], group_data)
    assert rc != 0
    assert "profile big-hf-tp1 does not fit" in out
    assert f"GiB/GPU from the checkpoint (hf:{BIG}@" in out, out[-4000:]
    assert "nothing on the host was changed" in out
    stats = shard_stats(hub, BIG)
    stats.pop("model.safetensors", None)  # the client's HEAD that finds none
    assert len(stats) == 30  # every shard's header was read ...
    assert all(s["get_full"] == 0 for s in stats.values())  # ... and no shard fetched
    assert all(s["bytes"] <= 100_001 * max(s["get_ranged"], 1) for s in stats.values())
    assert fingerprint(lab) == before
    assert HF_TOKEN not in out


def test_a_disk_too_small_is_refused_before_the_download(lab, hub, profiles, group_data):
    lab.ssh("mkdir -p /srv/tiny-disk && (mountpoint -q /srv/tiny-disk || "
            "mount -t tmpfs -o size=4m tmpfs /srv/tiny-disk)", check=True)
    hub.reset()
    before = fingerprint(lab)
    rc, out = serve(lab, hub, profiles["tiny"], group_data, f"models_dir={TINY_MODELS}")
    assert rc != 0
    assert f"disk: {TINY_MODELS} has" in out and "nothing was downloaded" in out
    assert all(s["get_full"] == 0 for s in shard_stats(hub, TINY).values())
    assert fingerprint(lab) == before
    assert lab.ssh(f"test -e {TINY_MODELS}").returncode != 0
    lab.ssh("umount /srv/tiny-disk", check=False)


def test_a_refusing_endpoint_is_one_error_line_in_a_dry_run(lab, hub, profiles,
                                                            group_data):
    """``pyinfra --dry`` with a controller endpoint that refuses connections: one
    ``gpuserve: error:`` line naming the key and what to do, no traceback, no change."""
    before = fingerprint(lab)
    r = lab.run_pyinfra("deploy/serve.py", "--dry", "--data", f"profile={profiles['big']}",
                        "--data", f"hf_endpoint={hub.url}",
                        "--data", "hf_plan_endpoint=http://127.0.0.1:9",
                        "--group-data", str(group_data), check=False)
    out = ANSI.sub("", r.stdout)
    assert r.returncode != 0 and "Traceback" not in out and HF_TOKEN not in out
    assert "gpuserve: error:" in out and "hf_plan_endpoint" in out
    assert "refused the connection" in out and f"{BIG}@" in out
    assert fingerprint(lab) == before


@pytest.fixture(scope="module")
def first_deploy(lab, hub, profiles, group_data):
    hub.reset()
    # Each fault acts on the file's next GETs: the first is the controller's header read
    # (bytes 0-100000: the cut lies beyond it, the corrupted bytes are data, not header),
    # the second the host's download.
    hub.cut(TINY, SHARD2, after=CHUNK + 2000, times=2)  # past the client's first 10 MiB
    hub.corrupt(TINY, SHARD1, offset=4096, times=2)
    rc, out = serve(lab, hub, profiles["tiny"], group_data)
    return rc, out, hub.stats()


def test_first_deploy_downloads_verifies_and_serves(lab, hub, first_deploy):
    rc, out, stats = first_deploy
    assert rc == 0, out[-3000:]
    commit = hub.main_commit(TINY)
    target = f"{MODELS}/gpuserve-lab--Tiny-Llama-3L/{commit}"
    assert re.search(rf"weights: {TINY}@{commit[:12]} verified \(\d+ files", out)
    assert f"fetched again after a hash mismatch: {SHARD1}" in out
    for line in re.findall(r"weights: gpuserve-lab/Tiny-Llama-3L: [\d.]+ GiB of .*", out):
        assert re.search(r"GiB of [\d.]+ GiB \(\d+%\), [\d.]+ MiB/s", line)
    files = {k.rsplit("/", 1)[1]: v for k, v in stats["files"].items()}
    assert files[SHARD2]["get_ranged"] >= 1  # the cut transfer resumed with a Range
    assert files[SHARD1]["get_full"] == 2  # corrupted once, fetched again
    assert healthy(lab)
    marker = json.loads(lab.ssh(f"cat {target}/.gpuserve-complete.json", check=True).stdout)
    assert marker["commit"] == commit and marker["refetched"] == [SHARD1]
    assert lab.ssh(f"test -e {target}.partial").returncode != 0
    owner = lab.ssh(f"stat -c '%U %a' {target}/{SHARD1}", check=True).stdout.split()
    assert owner == ["sglang", "444"]
    unit = lab.ssh(f"systemctl cat {UNIT}; cat /etc/gpuserve/sglang.env", check=True).stdout
    assert "HF_HUB_OFFLINE=1" in unit and f"--model-path {target}" in unit
    token = lab.ssh("stat -c '%U %a' /opt/gpuserve/cache/hf-token", check=True).stdout.split()
    assert token == ["sglang", "600"]
    assert HF_TOKEN not in out
    journal = lab.ssh("journalctl --no-pager -o cat -n 2000; ps -eo args", check=True).stdout
    assert HF_TOKEN not in journal


def test_rerun_downloads_nothing_and_asks_the_hub_nothing(lab, hub, profiles, group_data,
                                                          first_deploy):
    hub.reset()
    rc, out = serve(lab, hub, profiles["tiny"], group_data)
    assert rc == 0, out[-3000:]
    assert hub.stats()["requests"] == []
    assert "Model weights" not in out or "fetch gpuserve-lab" not in out


def test_a_floating_branch_is_recorded_and_a_move_refused_unless_asked(
        lab, hub, group_data, first_deploy, tmp_path):
    """``@main`` with allow_floating_revision: resolved once and recorded on the host
    (its commit is already there: nothing fetched); after the branch moves, refused with
    both commits and no change; with hf_revision_update=true the new commit is fetched."""
    first, later = hub.repos()[TINY]["commits"][:2]
    assert hub.main_commit(TINY) == first
    floating = tmp_path / "tiny-main.yaml"
    floating.write_text(f"model:\n  hf: {TINY}@main\n  allow_floating_revision: true\n"
                        "parallel:\n  tp: 1\n")
    ref = f"{MODELS}/gpuserve-lab--Tiny-Llama-3L/refs/main"
    hub.reset()
    rc, out = serve(lab, hub, floating, group_data, "bench=off")
    assert rc == 0, out[-3000:]
    assert lab.ssh(f"cat {ref}", check=True).stdout.strip() == first
    assert all(s["get_full"] == 0 for s in shard_stats(hub, TINY).values())
    hub.move_branch(TINY, later)
    before = fingerprint(lab)
    rc, out = serve(lab, hub, floating, group_data, "bench=off")
    assert rc != 0 and f"now resolves to {later}" in out and first in out
    assert "hf_revision_update=true" in out and fingerprint(lab) == before
    rc, out = serve(lab, hub, floating, group_data, "bench=off", "hf_revision_update=true")
    assert rc == 0, out[-3000:]
    assert lab.ssh(f"cat {ref}", check=True).stdout.strip() == later
    assert lab.ssh(f"test -f {MODELS}/gpuserve-lab--Tiny-Llama-3L/{later}/"
                   ".gpuserve-complete.json").returncode == 0
    hub.move_branch(TINY, first)


def test_plan_hf_reads_headers_only_and_equals_the_files(lab, hub):
    """``gpuserve plan --hf`` against the stand-in: the 80-shard GLM-5 NVFP4 planned
    from its headers equals the plan from the very files the stand-in serves."""
    commit = hub.main_commit(GLM)
    hub.reset()
    args = ["--gpus", "8xRTX-PRO-6000", "--tp", "8", "--json"]
    remote = subprocess.run([sys.executable, "-m", "gpuserve", "plan", "--hf",
                             f"{GLM}@{commit}", "--hf-endpoint", hub.local_url, *args],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert remote.returncode == 0, remote.stderr[-2000:]
    stats = shard_stats(hub, GLM)
    stats.pop("model.safetensors", None)
    assert len(stats) == 80 and all(s["get_full"] == 0 for s in stats.values())
    files = Path(lab.state.mirror_root) / "hub" / GLM / "commits" / commit
    local = subprocess.run([sys.executable, "-m", "gpuserve", "plan", "--model-dir",
                            str(files), *args], capture_output=True, text=True,
                           timeout=300, cwd=REPO)
    assert local.returncode == 0, local.stderr[-2000:]
    r, lo = json.loads(remote.stdout), json.loads(local.stdout)
    assert r["weights"] == lo["weights"] and r["weights_gib"] == lo["weights_gib"] > 0


FAULTS = "/srv/gpuserve-faults"


def _run_on_host(lab, hub, commit: str, *extra: str):
    """The host script as the service user, as the deploy runs it (its status file)."""
    target = f"{FAULTS}/models/gpuserve-lab--Tiny-Llama-3L/{commit}"
    return lab.ssh(f"runuser -u sglang -- python3 /opt/gpuserve/bin/weights_fetch.py run "
                   f"--repo {TINY} --commit {commit} --target {target} --endpoint {hub.url} "
                   f"--status {FAULTS}/status.json {' '.join(extra)}; "
                   f"cat {FAULTS}/status.json", check=False).stdout


def test_a_hostile_mirror_changes_nothing_outside_the_revision_on_the_host(
        lab, hub, first_deploy):
    """On the real host, as the service user: a traversal entry refuses the revision, an
    endless body stops one byte over, a hung fetch is ended by the next start; victims
    beside the models directory and in the service user's home stay untouched."""
    commit = hub.main_commit(TINY)
    lab.ssh(f"rm -rf {FAULTS}; mkdir -p {FAULTS}/models/gpuserve-lab--Tiny-Llama-3L && "
            f"chown -R sglang: {FAULTS} && echo keep > {FAULTS}/victim && "
            "echo keep > /opt/gpuserve/cache/victim", check=True)
    hub.reset()
    hub.control("faults", {"kind": "entries", "repo": TINY, "entries": [
        {"type": "file", "path": "../../victim", "size": 5, "oid": "0" * 40}]})
    doc = json.loads(_run_on_host(lab, hub, commit).strip().splitlines()[-1])
    assert doc["state"] == "failed" and "'../../victim' is not a normalised" in doc["error"]
    hub.control("faults", {"kind": "endless", "repo": TINY, "file": "config.json",
                           "after": 256 << 20})
    doc = json.loads(_run_on_host(lab, hub, commit).strip().splitlines()[-1])
    assert doc["state"] == "failed" and "sent more than the" in doc["error"]
    used = int(lab.ssh(f"du -sb {FAULTS}/models", check=True).stdout.split()[0])
    total = read_remote(HfSource(TINY, commit), Where("p", "model.hf", "i", "hf_endpoint",
                                                      hub.local_url), None,
                        headers=False).total_bytes
    assert used <= total + (1 << 20)  # the listed bytes, not the endless body
    # a fetch hung in its listing is ended by the next start, which finishes the job
    hub.control("faults", {"kind": "hang", "repo": TINY, "seconds": 90})
    run = f"{FAULTS}/run"
    start = (f"python3 /opt/gpuserve/bin/weights_fetch.py start --run-dir {run} --user "
             f"sglang --python python3 --hung-after {{}} -- run --repo {TINY} --commit "
             f"{commit} --target {FAULTS}/models/gpuserve-lab--Tiny-Llama-3L/{commit} "
             f"--endpoint {hub.url}")
    first = json.loads(lab.ssh(start.format(300), check=True).stdout)
    lab.ssh("sleep 4", check=True)
    second = json.loads(lab.ssh(start.format(2), check=True).stdout)
    assert first["started"] and second["started"] and second["pid"] != first["pid"]
    assert lab.ssh(f"kill -0 {first['pid']}").returncode != 0
    doc = {}
    for _ in range(60):
        doc = json.loads(lab.ssh(f"python3 /opt/gpuserve/bin/weights_fetch.py status "
                                 f"--run-dir {run}", check=True).stdout)
        if doc.get("state") in ("done", "failed"):
            break
        lab.ssh("sleep 1", check=True)
    assert doc.get("state") == "done", doc
    victims = lab.ssh(f"cat {FAULTS}/victim /opt/gpuserve/cache/victim", check=True).stdout
    assert victims.split() == ["keep", "keep"]
    lab.ssh(f"rm -rf {FAULTS} /opt/gpuserve/cache/victim", check=True)
