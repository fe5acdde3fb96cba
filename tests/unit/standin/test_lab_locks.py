"""The lab's locks: tools/gen_lock.py over the mirror's stand-in wheels, offline.

``lab_locks`` (conftest.py) runs ``lab.locks.publish`` with every proxy pointed at a
closed port, so the tool's resolve and header derivation must work from the local
wheels alone. The locks must load with gpuserve's own loader and pin every wheel the
mirror serves by its sha256, and gpuserve's verification must accept the stand-ins on
the reference box and refuse them on the old-driver box or with the fault switch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import locks as lab_locks_mod
from lab import torch_standin

REPO = Path(__file__).resolve().parents[3]
VERIFY = REPO / "gpuserve" / "data" / "scripts" / "sglang_verify.py"
EXPECTED = {
    "0.5.23+lab": {"torch": "2.14.1+lab", "sglang-kernel": "0.4.10+lab"},
    "0.5.19+lab": {"torch": "2.13.0+lab", "sglang-kernel": "0.4.6.post1+lab"},
}

pytestmark = pytest.mark.skipif(not lab_locks_mod.GEN_LOCK.exists(),
                                reason="tools/gen_lock.py is not there")


def hub_client_versions() -> dict[str, str]:
    """The real huggingface-hub closure the mirror carries: versions of the real lock."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    out = {}
    for wheel, _ in lab_locks_mod.hub_client_wheels():
        name, version, _, _ = parse_wheel_filename(wheel.name)
        out[canonicalize_name(name)] = str(version)
    return out


def _load(path: Path):
    from gpuserve.launch.locks import load_lock

    return load_lock(path)


def test_one_lock_per_sglang_standin_named_like_the_tools(lab_locks):
    names = sorted(p.name for p in lab_locks.glob("*.json"))
    assert names == ["sglang-0.5.19+lab-cu13-py311.json", "sglang-0.5.23+lab-cu13-py311.json"]
    assert lab_locks_mod.lock_name("0.5.23+lab") == "sglang-0.5.23+lab-cu13-py311.json"
    # a PD fleet's lock: the newest stand-in with the Mooncake stand-in (inventory/lab_pd.py)
    pd = lab_locks_mod.pd_locks_dir(lab_locks.parent)
    assert sorted(p.name for p in pd.glob("*.json")) == ["sglang-0.5.23+lab-cu13-py311.json"]
    packages = {p.name: p.version for p in _load(pd / "sglang-0.5.23+lab-cu13-py311.json")
                .packages}
    assert packages["mooncake-transfer-engine"] == "0.3.11.post1+lab"
    assert "mooncake-transfer-engine" not in {
        p.name for p in _load(lab_locks / "sglang-0.5.23+lab-cu13-py311.json").packages}


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_lock_loads_and_pins_every_mirror_wheel_by_hash(lab_locks, standin_mirror, version):
    path = lab_locks / lab_locks_mod.lock_name(version)
    lock = _load(path)
    want = EXPECTED[version]
    assert lock.sglang == version and lock.torch == want["torch"]
    assert (lock.torch_cuda, lock.cuda_major, lock.python) == ("13.0", 13, "3.11")
    assert lock.driver_min == torch_standin.driver_min("13.0") == "580.65.06"
    assert lock.cuda_archs == ("sm_80", "sm_89", "sm_90", "sm_100", "sm_120")
    assert lock.glibc_min == "2.28" and lock.supports(python="3.11", glibc="2.36") is None
    assert lock.external == ()
    versions = {p.name: p.version for p in lock.packages}
    assert versions == {"sglang": version, "nvidia-cuda-runtime": "13.0.96+lab", **want,
                        **hub_client_versions()}
    assert versions["huggingface-hub"] == "1.33.0"  # the real client, as the real lock pins
    wheels = standin_mirror / "wheels"
    for pkg in lock.packages:
        assert not pkg.external and pkg.sha256, pkg
        data = (wheels / pkg.filename).read_bytes()
        assert pkg.sha256 == hashlib.sha256(data).hexdigest() and pkg.size == len(data)
        assert f"{pkg.name}=={pkg.version} --hash=sha256:{pkg.sha256}" in lock.requirements_text()
    assert lock.download_bytes == sum(p.size for p in lock.packages)
    raw = json.loads(path.read_text())
    assert raw["generator"] == "tools/gen_lock.py"
    assert raw["resolved"]["find_links"] == [str(wheels.resolve())]
    assert "common_ops.abi3.so" in raw["cuda_archs_source"]


def test_unchanged_inputs_keep_the_locks_and_a_changed_wheel_regenerates(
        lab_locks, standin_mirror, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"  # a copy: the session's locks stay as generated
    shutil.copytree(standin_mirror / "wheels", mirror / "wheels")
    shutil.copytree(lab_locks, lab_locks_mod.locks_dir(mirror))
    out = lab_locks_mod.locks_dir(mirror)
    calls = []
    monkeypatch.setattr(lab_locks_mod, "generate",
                        lambda wheels, version, out, extra=(): calls.append(
                            version + (" with " + " ".join(extra) if extra else "")) or (
                            out / lab_locks_mod.lock_name(version)).write_text("{}"))
    lab_locks_mod.publish(mirror)  # nothing changed: the tool does not run
    assert calls == [] and (out / lab_locks_mod.lock_name("0.5.23+lab")).read_bytes() == (
        lab_locks / lab_locks_mod.lock_name("0.5.23+lab")).read_bytes()

    (mirror / "wheels" / "zz_extra-1.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    lab_locks_mod.publish(mirror)
    # and the PD fleet's lock of the newest stand-in
    assert sorted(calls) == sorted([*EXPECTED, "0.5.23+lab with mooncake-transfer-engine"])
    assert sorted(p.name for p in out.glob("*.json")) == sorted(
        lab_locks_mod.lock_name(v) for v in EXPECTED)


def test_failing_tool_is_an_error_naming_it(tmp_path):
    """The tool's failure, its exit status and its last words, in one error. The tool is
    run by an interpreter that fails at once (the real one over an empty wheels
    directory fails the same way, after a minute and a half of making its resolver's
    venv: the resolve itself is the lab_locks fixture's)."""
    (tmp_path / "wheels").mkdir()
    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho 'gen_lock: pip could not resolve' >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"tools/gen_lock.py 0\.5\.23\+lab over .* failed "
                       r"\(exit 3\):\ngen_lock: pip could not resolve$"):
        lab_locks_mod.generate(tmp_path / "wheels", "0.5.23+lab", tmp_path / "out",
                               python=str(failing))


def _verification(guest) -> list[str]:
    out = guest.run(VERIFY.read_text())
    return [json.dumps(out)]


def test_verification_of_the_standins_against_the_lab_lock(lab_locks, guest):
    from gpuserve.launch.verify import judge

    lock = _load(lab_locks / lab_locks_mod.lock_name("0.5.23+lab"))
    guest.lab_smi("rtxpro6000-kvm")
    ok = judge(_verification(guest), lock, expect_gpus=8)
    assert ok.ok, ok.problems
    assert ok.summary == "sglang 0.5.23+lab, torch 2.14.1+lab (CUDA 13.0), 8 GPU(s) sm_120"

    guest.lab_smi("h200-nvlink")
    assert judge(_verification(guest), lock, expect_gpus=8).ok

    guest.lab_smi("rtxpro6000-kvm-driver575")
    old = judge(_verification(guest), lock, expect_gpus=8)
    assert not old.ok
    assert any("torch.cuda.is_available() is False" in p for p in old.problems)

    guest.lab_smi("rtxpro6000-kvm")
    guest.fault.write_text("")
    fault = judge(_verification(guest), lock, expect_gpus=8)
    assert not fault.ok
    assert any("torch.cuda.is_available() is False" in p for p in fault.problems)

    guest.fault.unlink()
    other = _load(lab_locks / lab_locks_mod.lock_name("0.5.19+lab"))
    wrong = judge(_verification(guest), other, expect_gpus=8)  # 0.5.23 installed, 0.5.19 lock
    assert not wrong.ok
    assert "sglang is 0.5.23+lab, the lock says 0.5.19+lab" in wrong.problems


def test_lock_installs_hash_checked_from_the_mirror_wheels(lab_locks, standin_mirror, tmp_path,
                                                           offline_env):
    """What the serve deploy runs on the guest, here: a fresh venv, the lock's requirements
    with --require-hashes --no-deps from the wheels only, then pip check; a wheel whose
    bytes differ from the lock is refused. The venv has no pip of its own (ensurepip cost
    6 s CPU): this environment's pip works on it through ``--python``."""
    lock = _load(lab_locks / lab_locks_mod.lock_name("0.5.23+lab"))
    req = tmp_path / "requirements.txt"
    req.write_text(lock.requirements_text())
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    env = {**os.environ, **offline_env, "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    base = [sys.executable, "-m", "pip", "--python", py]

    def pip(*args: str, wheels: Path = standin_mirror / "wheels"):
        return subprocess.run([*base, *args, "--no-index", "--find-links", str(wheels)]
                              if args[0] == "install" else [*base, *args],
                              capture_output=True, text=True, env=env, timeout=300)

    tampered = tmp_path / "tampered"
    shutil.copytree(standin_mirror / "wheels", tampered)
    torch_wheel = tampered / torch_standin.wheel_name("2.14.1+lab")
    torch_wheel.write_bytes(torch_standin.build_wheel_bytes("2.13.0+lab"))
    bad = pip("install", "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(req),
              wheels=tampered)
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr

    done = pip("install", "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(req))
    assert done.returncode == 0, done.stderr
    check = pip("check")
    assert check.returncode == 0, check.stdout + check.stderr
    got = subprocess.run([py, "-c", "import importlib.metadata as m, torch, huggingface_hub; "
                          "print(m.version('sglang'), m.version('sglang-kernel'), "
                          "torch.__version__, torch.version.cuda, huggingface_hub.__version__)"],
                         capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert got.stdout.split() == ["0.5.23+lab", "0.4.10+lab", "2.14.1+lab", "13.0", "1.33.0"]


def test_hub_client_wheels_are_the_real_locks_closure_and_a_rerun_copies_nothing(
        standin_mirror, tmp_path):
    from gpuserve.paths import PACKAGE_DIR

    real = json.loads((PACKAGE_DIR / "data" / "locks" / lab_locks_mod.HUB_CLIENT_LOCK
                       ).read_text())
    by_file = {p["filename"]: p["sha256"] for p in real["packages"]}
    names = lab_locks_mod.publish_hub_client(tmp_path)
    assert "huggingface_hub-1.33.0-py3-none-any.whl" in names
    assert any(n.startswith("hf_xet-") for n in names) and any(n.startswith("httpx-")
                                                              for n in names)
    for name in names:  # every one the real lock's file, byte for byte
        data = (tmp_path / "wheels" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == by_file[name]
    stamps = {n: (tmp_path / "wheels" / n).stat().st_mtime_ns for n in names}
    assert lab_locks_mod.publish_hub_client(tmp_path) == names
    assert stamps == {n: (tmp_path / "wheels" / n).stat().st_mtime_ns for n in names}
