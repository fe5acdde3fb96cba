"""``gpuserve render INVENTORY --limit HOST``'s launch: built from the serve plan itself
(argv, env file, unit), the host's nccl.env and host.json, secrets masked."""

from __future__ import annotations

import json
import shlex

from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.redact import REDACTED
from gpuserve.serve.launch_view import launch_view, unit_environment, view_of
from tests.serve_plans import plan_of

TOKEN = "hf_renderTokenNeverShown0123"
KEY = "sk-render-key-never-shown-4567"
NCCL_ENV = ("# Managed by gpuserve (roles/nccl)\n# NCCL_P2P_DISABLE: no P2P\n"
            "NCCL_P2P_DISABLE=1\n")
HOST_JSON = json.dumps({"p2p": "NS", "disable_custom_all_reduce": True,
                        "nccl_env": {"NCCL_P2P_DISABLE": "1"}})


def runtime(home: str) -> HostRuntime:
    return HostRuntime(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


def plan(**data):
    return plan_of({"profile": "glm5-nvfp4-tp8", **data}, "inventory/gpu.py", runtime,
                      host_record=lambda: HOST_JSON.splitlines())


def test_the_argv_is_the_plans_own_with_host_flags_and_bind_address() -> None:
    p = plan()
    view = launch_view(p.service, host="gpu1", sglang_version=p.version, lock=p.lock.name,
                       nccl_env_text=NCCL_ENV)
    assert view.launcher == (f"{p.venv}/bin/python", "-m", "sglang.launch_server")
    args = list(view.args)
    assert args[-2:] == ["--host", "127.0.0.1"]  # the deploy's bind, not the profile's
    assert "--disable-custom-all-reduce" in args  # host.json: no P2P
    # the env file's arguments are exactly these words
    assert shlex.split(p.service.env_text.split("GPUSERVE_SGLANG_ARGS=", 1)[1]
                       .strip().strip('"').replace('\\"', '"')) == args


def test_env_follows_systemds_order_and_masks_secrets() -> None:
    p = plan(hf_token=TOKEN, sglang_api_key=KEY, sglang_extra_env={"NCCL_P2P_DISABLE": "0"})
    view = launch_view(p.service, host="gpu1", sglang_version=p.version, lock=p.lock.name,
                       nccl_env_text=NCCL_ENV)
    files = [where for _, _, where in view.env]
    assert files.index("/etc/gpuserve/nccl.env") < files.index("/etc/gpuserve/sglang.env")
    env = view.effective_env()
    assert env["PYTHONSAFEPATH"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["NCCL_P2P_DISABLE"] == "0"  # the profile's file is read last and wins
    assert env["HF_TOKEN"] == REDACTED
    text = json.dumps(view.to_dict())
    assert TOKEN not in text and KEY not in text
    # the secrets wrapper runs the server; its arguments still start at the first flag
    assert view.launcher[-2:] == ("-m", "sglang.launch_server")
    assert "sglang_redact.py" in view.launcher[1]
    assert view.args[-2:] == ("--config", "/etc/gpuserve/sglang-secrets.yaml")


def test_unit_environment_reads_the_rendered_unit() -> None:
    p = plan()
    assert ("HOME", "/opt/gpuserve/cache") in unit_environment(p.service.unit_text)


def test_document_round_trip() -> None:
    p = plan()
    view = launch_view(p.service, host="gpu1", sglang_version=p.version, lock=p.lock.name,
                       nccl_env_text=None)
    assert view_of(json.loads(json.dumps(view.to_dict())), "x") == view
