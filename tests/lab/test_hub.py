"""The lab's Hub stand-in (lab/hub) from a container lab host: reachable at the URL the
lab publishes (state ``hub_url``, inventory ``{hub}``), and the real huggingface_hub of a
venv made from the lab's SGLang lock (as the serve deploy makes the SGLang venv: hashes
checked, the mirror's wheels only) downloads, resumes and verifies a checkpoint from it,
directly and through the stand-in's CDN redirect."""

from __future__ import annotations

import json
import shlex

import pytest
from labhelpers import lab_hub

from gpuserve.launch.locks import load_lock
from lab.locks import lock_name, locks_dir

pytestmark = pytest.mark.lab

TINY = "gpuserve-lab/Tiny-Llama-3L"
SHARD1 = "model-00001-of-00003.safetensors"
VENV = "/tmp/gpuserve-hub-venv"
FETCH = r"""
import json, os, huggingface_hub
from huggingface_hub import HfApi, snapshot_download
repo, commit = os.environ["REPO"], os.environ["COMMIT"]
path = snapshot_download(repo, revision=commit, local_dir="/tmp/gpuserve-hub-tiny",
                         allow_patterns=os.environ["PATTERNS"])
check = HfApi().verify_repo_checksums(repo, revision=commit, local_dir=path)
missing = [p for p in check.missing_paths if os.environ["PATTERNS"] == "*"]
print(json.dumps({"version": huggingface_hub.__version__, "files": sorted(os.listdir(path)),
                  "mismatches": check.mismatches, "missing": missing}))
"""


@pytest.fixture(scope="module")
def hub(lab):
    return lab_hub(lab)


@pytest.fixture(scope="module")
def venv(lab):
    """A venv from the lab's SGLang lock, installed as the serve deploy installs one."""
    lock = load_lock(locks_dir(lab.state.mirror_root) / lock_name("0.5.23+lab"))
    assert "huggingface-hub" in {p.name for p in lock.packages}
    req = shlex.quote(lock.requirements_text())
    lab.ssh(f"rm -rf {VENV} && python3 -m venv {VENV} && "
            f"printf '%s' {req} > {VENV}.txt && {VENV}/bin/pip install -q --no-index "
            f"--find-links {lab.mirror_url}wheels/ --trusted-host 10.0.2.2 --require-hashes "
            f"--no-deps --only-binary=:all: -r {VENV}.txt", check=True, timeout=600)
    yield f"{VENV}/bin/python"
    lab.ssh(f"rm -rf {VENV} {VENV}.txt /tmp/gpuserve-hub-tiny /tmp/gpuserve-hub-home")


def fetch(lab, hub, python: str, commit: str, patterns: str = "*") -> tuple[dict, str]:
    """The host's huggingface_hub: snapshot_download + verify_repo_checksums."""
    lab.ssh("rm -rf /tmp/gpuserve-hub-tiny /tmp/gpuserve-hub-home")
    r = lab.ssh(f"HF_ENDPOINT={hub.url} HF_HOME=/tmp/gpuserve-hub-home REPO={TINY} "
                f"COMMIT={commit} PATTERNS={shlex.quote(patterns)} {python} "
                f"-c {shlex.quote(FETCH)}", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_lab_host_reaches_the_hub_stand_in(lab, hub) -> None:
    commit = hub.main_commit(TINY)
    r = lab.ssh(f"curl -sfI {hub.url}/{TINY}/resolve/main/config.json", check=True)
    assert f"x-repo-commit: {commit}" in r.stdout.lower()
    assert hub.url == f"http://10.0.2.2:{lab.mirror_port}/hub"


def test_the_sglang_venvs_hub_client_downloads_resumes_and_verifies(lab, hub, venv) -> None:
    commit = hub.main_commit(TINY)
    hub.reset()
    hub.cut(TINY, SHARD1, after=11_000_000)
    out, err = fetch(lab, hub, venv, commit)
    assert out["version"] == "1.33.0" and out["mismatches"] == [] and out["missing"] == []
    assert SHARD1 in out["files"] and "Trying to resume download" in err
    gets = [(q["range"], q["status"]) for q in hub.stats()["requests"]
            if q["file"] == SHARD1 and q["method"] == "GET"]
    assert gets == [(None, 200), ("bytes=10485760-", 206)]


def test_the_hosts_client_follows_the_hubs_cdn_redirect(lab, hub, venv) -> None:
    hub.reset()
    hub.cdn()
    try:
        out, _ = fetch(lab, hub, venv, hub.main_commit(TINY), patterns="*00003*")
    finally:
        hub.cdn(None)
    assert out["mismatches"] == [] and "model-00003-of-00003.safetensors" in out["files"]
    reqs = [(q["kind"], q["method"], q["status"]) for q in hub.stats()["requests"]
            if q["file"] == "model-00003-of-00003.safetensors"]
    assert reqs == [("resolve", "HEAD", 302), ("cdn", "GET", 200)]
