"""Serve deploy, prepare time: host data validation, package pin, profile rendering,
and the real pyinfra CLI refusing a bad profile before any operation runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from roles.service.serve_plan import plan_serve
from roles.sglang import default_package, pinned_version, pip_args

REPO = Path(__file__).resolve().parents[3]
PYINFRA = Path(sys.executable).with_name("pyinfra")


@pytest.mark.parametrize(
    ("req", "version"),
    [("sglang==0.5.23", "0.5.23"), ("sglang==0.5.23+lab", "0.5.23"),
     ("sglang[all]==0.5.19", "0.5.19"), ("SGLang == 0.5.23+cu130.x1", "0.5.23")],
)
def test_pinned_version_strips_local_part(req: str, version: str) -> None:
    assert pinned_version(req, "inv.py") == version


@pytest.mark.parametrize("req", ["sglang", "sglang>=0.5", "vllm==0.5.23", "sglang==", 5])
def test_unpinned_package_is_refused(req) -> None:
    with pytest.raises(InputError) as e:
        pinned_version(req, "inv.py")
    assert (e.value.file, e.value.field) == ("inv.py", "sglang_package")


def test_default_package_from_cuda_lane() -> None:
    assert default_package("12.9", "i") == "sglang==0.5.19"
    assert default_package("13.0", "i") == "sglang==0.5.23"
    for lane in (None, "11.8"):
        with pytest.raises(InputError, match="sglang_package"):
            default_package(lane, "i")


def test_pip_args_air_gapped_mirror() -> None:
    assert pip_args(None, "http://10.0.2.2:8000/wheels/") == (
        "--no-index --find-links http://10.0.2.2:8000/wheels/ --trusted-host 10.0.2.2")
    assert pip_args("https://m/simple", "https://w/") == (
        "--index-url https://m/simple --find-links https://w/")
    assert pip_args(None, None) is None


def no_cuda() -> str | None:
    raise AssertionError("the CUDA fact must not be read when sglang_package is set")


def test_plan_renders_the_lab_profile_for_the_pinned_version() -> None:
    p = plan_serve({"profile": "glm5-nvfp4-tp8", "sglang_package": "sglang==0.5.23+lab"},
                   "inventory/lab.py", no_cuda)
    assert p.version == "0.5.23" and p.venv == "/opt/gpuserve/venv"
    assert "--cuda-graph-max-bs-decode 128" in p.service.unit_text
    assert p.service.served_name == "glm-5" and p.service.port == 30000


def test_plan_uses_the_cuda_lane_when_no_package() -> None:
    p = plan_serve({"profile": "deepseek-v3-fp8-h200-tp8"}, "inv.py", lambda: "12.8")
    assert (p.package, p.version) == ("sglang==0.5.19", "0.5.19")
    p = plan_serve({"profile": "deepseek-v3-fp8-h200-tp8"}, "inv.py", lambda: "13.0")
    assert (p.package, p.version) == ("sglang==0.5.23", "0.5.23")


def _host_json(disable: object) -> list[str]:
    """/etc/gpuserve/host.json as the host deploy writes it (gpuserve.host.nccl_env.host_json)."""
    return json.dumps({"disable_custom_all_reduce": disable, "p2p": "none"}, indent=2).splitlines()


def test_host_without_p2p_adds_disable_custom_all_reduce_once() -> None:
    data = {"profile": "deepseek-v3-fp8-h200-tp8", "sglang_package": "sglang==0.5.23"}
    plain = plan_serve(data, "inv.py", no_cuda)
    assert "--disable-custom-all-reduce" not in plain.service.unit_text
    no_p2p = plan_serve(data, "inv.py", no_cuda, host_record=lambda: _host_json(True))
    assert no_p2p.service.unit_text.count("--disable-custom-all-reduce") == 1
    p2p_ok = plan_serve(data, "inv.py", no_cuda, host_record=lambda: _host_json(False))
    assert "--disable-custom-all-reduce" not in p2p_ok.service.unit_text
    # the GLM-5 profile already disables it: not rendered twice
    glm = plan_serve({"profile": "glm5-nvfp4-tp8", "sglang_package": "sglang==0.5.23"},
                     "inv.py", no_cuda, host_record=lambda: _host_json(True))
    assert glm.service.unit_text.count("--disable-custom-all-reduce") == 1


@pytest.mark.parametrize("lines", [["{not json"], _host_json("yes")])
def test_bad_host_record_names_the_file(lines: list[str]) -> None:
    with pytest.raises(InputError) as e:
        plan_serve({"profile": "deepseek-v3-fp8-h200-tp8", "sglang_package": "sglang==0.5.23"},
                   "inv.py", no_cuda, host_record=lambda: lines)
    assert e.value.file == "/etc/gpuserve/host.json"


def test_profile_not_made_for_the_lane_is_refused() -> None:
    # GLM-5 NVFP4 needs SGLang 0.5.23, which has no CUDA 12 build
    with pytest.raises(InputError) as e:
        plan_serve({"profile": "glm5-nvfp4-tp8"}, "inv.py", lambda: "12.8")
    assert e.value.field == "sglang_versions" and e.value.file.endswith(".yaml")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "profile"),
        ({"profile": 3}, "profile"),
        ({"profile": "glm5-nvfp4-tp8", "sglang_user": "Bad User"}, "sglang_user"),
        ({"profile": "glm5-nvfp4-tp8", "sglang_home": "relative/dir"}, "sglang_home"),
        ({"profile": "glm5-nvfp4-tp8", "health_timeout": "soon"}, "health_timeout"),
        ({"profile": "glm5-nvfp4-tp8", "health_timeout": 0}, "health_timeout"),
        ({"profile": "glm5-nvfp4-tp8", "pip_find_links": ["a"]}, "pip_find_links"),
        ({"profile": "glm5-nvfp4-tp8", "sglang_extra_env": {"A B": "1"}},
         "sglang_extra_env.A B"),
    ],
)
def test_bad_host_data_names_inventory_and_field(data: dict, field: str) -> None:
    data.setdefault("sglang_package", "sglang==0.5.23")
    with pytest.raises(InputError) as e:
        plan_serve(data, "inventory/gpu.py", no_cuda)
    assert (e.value.file, e.value.field) == ("inventory/gpu.py", field)


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [('model:\n  path: "/models/x\\ny"\n', "model.path", 2),
     ('model:\n  path: /m\nextra_args: ["--served-model-name", "a\\tb"]\n', "extra_args", 3)],
)
def test_control_character_in_argv_names_the_profile_field(tmp_path: Path, text: str,
                                                           field: str, line: int) -> None:
    # systemd's ExecStart= cannot carry it: an InputError at prepare time, not a traceback
    profile = tmp_path / "ctl.yaml"
    profile.write_text(text)
    with pytest.raises(InputError) as e:
        plan_serve({"profile": str(profile), "sglang_package": "sglang==0.5.23"}, "inv.py",
                   no_cuda)
    assert (e.value.file, e.value.field, e.value.line) == (str(profile), field, line)
    assert "control character" in e.value.message


BAD_PROFILES = {
    "unknown-flag": ("model:\n  path: /models/x\nextra_args: ['--no-such-flag']\n",
                     "extra_args[0]", "--no-such-flag"),
    "missing-field": ("description: no model\nserver:\n  port: 30000\n", "model.path", ""),
    "wrong-type": ("model:\n  path: /models/x\nserver:\n  port: eighty\n", "server.port", ""),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_cli_refuses_bad_profile_before_any_operation(case: str, tmp_path: Path) -> None:
    text, field, needle = BAD_PROFILES[case]
    profile = tmp_path / f"{case}.yaml"
    profile.write_text(text)
    env = dict(os.environ, PYINFRA_FAKE_DELAY="0")
    proc = subprocess.run(
        [str(PYINFRA), "-y", "@fake", "deploy/serve.py", "--data", f"profile={profile}",
         "--data", "sglang_package=sglang==0.5.23"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"gpuserve: error: {profile}" in out and f": {field}: " in out, out
    assert needle in out
    assert "Beginning operation run" not in out and "Starting operation" not in out
    assert "Traceback" not in out
