"""The SGLang unit's least privilege: exposure rated by systemd itself, the read-only
working directory, the per-host escape hatch, and the listen address chosen safely."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from systemd_words import server_argv

from gpuserve.errors import InputError
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.serve.render import HARDENING, validate_hardening_off
from gpuserve.serve.service import listen_host, with_host
from tests.serve_plans import plan_of, service_plan_of

REPO = Path(__file__).resolve().parents[3]
PROFILES = sorted(p.stem for p in (REPO / "profiles").glob("*.yaml"))
KEY = "sk-hardening-test-key-0123456789"
ANALYZE = shutil.which("systemd-analyze")


def r580(home: str) -> HostRuntime:
    """An 8-GPU R580 host with Debian 12's Python (as tests/unit/serve/test_serve_plan)."""
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


def directives(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def exposure(unit_text: str, tmp_path: Path) -> tuple[float, str]:
    path = tmp_path / "gpuserve-sglang.service"
    path.write_text(unit_text)
    out = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(path)],
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", text)
    assert level, text
    return float(level.group(1)), text


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("key", [None, KEY], ids=["no-key", "api-key"])
def test_exposure_of_the_shipped_profiles_is_at_most_4(profile: str, key: str | None,
                                                        tmp_path: Path) -> None:
    data = {"profile": profile, "sglang_api_key": key}
    plan = plan_of(data, "inv.py", r580)
    level, report = exposure(plan.service.unit_text, tmp_path)
    assert level <= 4.0, report  # it was 6.3 (MEDIUM) before the hardening


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here")
def test_the_escape_hatch_really_removes_a_directive(tmp_path: Path) -> None:
    base = plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", r580).service.unit_text
    off = plan_of({"profile": "glm5-nvfp4-tp8", "unit_hardening_off": ["SystemCallFilter"]},
                     "inv.py", r580)
    assert exposure(off.service.unit_text, tmp_path)[0] > exposure(base, tmp_path)[0]
    assert any("SystemCallFilter" in w for w in off.preflight.warnings)


def test_code_runs_only_from_the_venv() -> None:
    plan = plan_of({"profile": "glm5-nvfp4-tp8", "sglang_api_key": KEY}, "inv.py", r580)
    d = directives(plan.service.unit_text)
    # the cwd is read-only to the service (ProtectSystem=strict, not in ReadWritePaths) and
    # never on sys.path; HOME and the caches stay writable
    assert d["WorkingDirectory"] == ["/"]
    assert "PYTHONSAFEPATH=1" in d["Environment"]
    assert d["ReadWritePaths"] == [f"{plan.home}/cache"]
    assert f"HOME={plan.home}/cache" in d["Environment"]
    assert d["ProtectSystem"] == ["strict"] and d["UMask"] == ["0077"]
    # the wrapper and the server are the venv's python; every lock's Python has
    # PYTHONSAFEPATH (3.11+)
    words = server_argv(plan.service.unit_text, plan.service.env_text)
    assert words[0] == f"{plan.venv}/bin/python" and f"{plan.venv}/bin/python" in words[4:]
    assert tuple(int(x) for x in plan.lock.python.split(".")) >= (3, 11)


def test_every_switchable_directive_is_set_and_can_be_switched_off() -> None:
    base = directives(plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", r580)
                      .service.unit_text)
    assert base["CapabilityBoundingSet"] == [""] and base["DevicePolicy"] == ["closed"]
    assert "char-nvidia-uvm rw" in base["DeviceAllow"]
    assert base["SystemCallFilter"] == ["@system-service pidfd_getfd"]
    for name in HARDENING:
        assert name in base, name
        off = directives(plan_of({"profile": "glm5-nvfp4-tp8", "unit_hardening_off": [name]},
                                    "inv.py", r580).service.unit_text)
        assert name not in off, name
        assert len(off) == len(base) - 1 - {"DevicePolicy": 1, "SystemCallFilter": 1}.get(
            name, 0), name  # DeviceAllow / SystemCallErrorNumber go with them


@pytest.mark.parametrize("value", ["SystemCallFilter", ["NoSuchThing"], [1], {"a": 1}])
def test_unit_hardening_off_is_validated(value: object) -> None:
    with pytest.raises(InputError) as e:
        validate_hardening_off(value, "inv.py")
    assert (e.value.file, e.value.field) == ("inv.py", "unit_hardening_off")


# -- listen address ------------------------------------------------------------------

def served_on(**data) -> str:
    plan = plan_of({"profile": "glm5-nvfp4-tp8", **data}, "inventory/gpu.py", r580)
    args = server_argv(plan.service.unit_text, plan.service.env_text)
    if "--config" in args:  # the secrets file comes last (with an API key)
        args = args[:args.index("--config")]
    assert args[-2] == "--host" and args.count("--host") == 1
    assert args[-1] == plan.service.host
    return plan.service.host


def test_without_an_api_key_the_server_listens_on_loopback_only() -> None:
    assert served_on() == "127.0.0.1"
    assert served_on(listen_address="127.0.0.1") == "127.0.0.1"


def test_with_an_api_key_the_profile_host_applies() -> None:
    assert served_on(sglang_api_key=KEY) == "0.0.0.0"
    assert served_on(sglang_api_key=KEY, listen_address="::") == "::"


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "8.8.8.8", "2001:db8::1"])
def test_every_interface_or_a_public_address_without_a_key_is_refused(address: str) -> None:
    with pytest.raises(InputError) as e:
        served_on(listen_address=address)
    assert (e.value.file, e.value.field) == ("inventory/gpu.py", "listen_address")
    assert "sglang_api_key" in e.value.message


@pytest.mark.parametrize("address", ["10.0.0.21", "192.168.1.5", "fd00::5"])
def test_a_private_address_without_a_key_is_allowed_with_a_warning(address: str) -> None:
    host, warnings = listen_host("0.0.0.0", address, False, "p.yaml", "inv.py")
    assert host == address and "private address" in warnings[0]
    assert "sglang_api_key" in warnings[0]
    # ... and the deploy serves on it: its checks reach the server where it listens
    # (gpuserve/data/scripts/sglang_probe.server_host; tests/unit/serve/
    # test_listen_private.py)
    assert served_on(listen_address=address) == address


@pytest.mark.parametrize("address", ["localhost", "10.0.0.300", 7, "0.0.0.0\n--x"])
def test_listen_address_must_be_an_ip(address: object) -> None:
    with pytest.raises(InputError) as e:
        served_on(listen_address=address)
    assert e.value.field == "listen_address"


def test_a_profile_host_without_a_key_is_reported() -> None:
    host, warnings = listen_host("0.0.0.0", None, False, "p.yaml", "inv.py")
    assert host == "127.0.0.1" and "server.host 0.0.0.0" in warnings[0]
    assert listen_host("0.0.0.0", None, False, "p.yaml", "inv.py", quiet=True) == (
        "127.0.0.1", [])


def test_the_chosen_host_wins_over_any_spelling_in_the_args() -> None:
    # argparse keeps the last value, abbreviations included (--hos is --host)
    assert with_host(["--host", "0.0.0.0", "--hos", "0.0.0.0", "--port", "1"],
                     "127.0.0.1")[-2:] == ["--host", "127.0.0.1"]
    plan = service_plan_of(args=["--model-path", "/m", "--host=0.0.0.0"], env={},
                        venv="/v", user="sglang", state_dir="/c", bin_dir="/b",
                        profile_name="p", profile_source="p.yaml", sglang_version="0.5.23",
                        model_path="/m", port=30000, served_name="m", extra_env={},
                        hf_token=None, api_key=None, data_source="inv.py")
    argv = server_argv(plan.unit_text, plan.env_text)
    assert "--host=0.0.0.0" not in argv and plan.host == "127.0.0.1"
    assert argv[-2:] == ["--host", "127.0.0.1"]


def test_the_redacting_wrapper_runs_the_server_safe_path(tmp_path: Path) -> None:
    """A module planted in the working directory is not imported by ``python -m``."""
    import os
    import sys

    wrapper = REPO / "gpuserve" / "data" / "scripts" / "sglang_redact.py"
    (tmp_path / "planted.py").write_text("print('PLANTED CODE RAN')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    out = subprocess.run([sys.executable, str(wrapper), str(tmp_path / "none.yaml"), "--",
                          sys.executable, "-m", "planted"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert "PLANTED CODE RAN" not in out.stdout
    assert "No module named planted" in out.stdout and out.returncode != 0
    # without the wrapper's setting, the same command would have run it
    plain = subprocess.run([sys.executable, "-m", "planted"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert "PLANTED CODE RAN" in plain.stdout
