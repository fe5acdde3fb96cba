"""Operating the served lab host: ``gpuserve render INVENTORY --limit HOST`` against the
running server's own /proc, ``gpuserve logs``, and deploy/remove.py with the serve
deploy bringing the host back.

Cheap on purpose: it reuses the served host (the serve deploy is a no-op when the host
already serves the lab profile, bench off), one switch, one removal and one serve back,
which leaves the host as the later modules expect it (the lab profile, served); the
module's fixture serves it again should a test stop half-way.
"""

from __future__ import annotations

import re
import shlex

import pytest
from labhelpers import ENV_PATH, UNIT, UNIT_PATH, clean, healthy, no_changes, served_profile

pytestmark = pytest.mark.lab

LAB_PROFILE = "glm5-nvfp4-tp8"
SWITCH_TO = "glm5-nvfp4-tp8-ep8"


def serve(lab, *args: str) -> str:
    r = lab.run_pyinfra("deploy/serve.py", "--data", "bench=off", *args)
    return clean(r.stdout)


def gpuserve(lab, *args: str):
    r = lab.run_tool("gpuserve", *args)
    return r.returncode, clean(r.stdout)


def server_process(lab) -> tuple[int, list[str], dict[str, str]]:
    """The unit's main process: its PID, argv and environment, from /proc."""
    pid = int(lab.ssh(f"systemctl show -p MainPID --value {UNIT}", check=True).stdout)
    assert pid > 0
    argv = lab.ssh(f"cat /proc/{pid}/cmdline", check=True).stdout.split("\0")[:-1]
    environ = lab.ssh(f"cat /proc/{pid}/environ", check=True).stdout.split("\0")
    env = dict(item.split("=", 1) for item in environ if "=" in item)
    return pid, argv, env


def rendered(out: str) -> tuple[list[str], dict[str, str]]:
    """The argv after the launcher and the env a ``gpuserve render`` printed."""
    env_part, _, argv_part = out.partition("# argv\n")
    env = {}
    for line in env_part.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    words = shlex.split(argv_part.replace(" \\\n", " "))
    start = next(i for i, w in enumerate(words) if w.startswith("--") and len(w) > 2)
    return words[start:], env


def assert_render_is_the_running_server(lab, *data: str) -> None:
    rc, out = gpuserve(lab, "render", "inventory/lab.py", "--limit", "lab-gpu", *data)
    assert rc == 0, out
    assert "# host lab-gpu" in out and "host-free" not in out
    args, env = rendered(out)
    _, argv, live_env = server_process(lab)
    first_flag = next(i for i, w in enumerate(argv) if w.startswith("--") and len(w) > 2)
    assert args == argv[first_flag:], (args, argv)
    assert env and all(live_env.get(k) == v for k, v in env.items()), (env, live_env)
    # every variable the unit and its env files give the server is shown
    from_unit = {"PYTHONSAFEPATH", "HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE"}
    assert from_unit <= set(env)
    assert "GPUSERVE_LAB_STANDIN_LOAD_SECONDS" in env  # the lab's sglang_extra_env


@pytest.fixture(scope="module")
def served(lab):
    serve(lab)
    yield
    if not healthy(lab) or served_profile(lab) != LAB_PROFILE:
        serve(lab)  # leave the host as later modules expect it


def test_render_prints_what_the_server_runs(lab, served) -> None:
    assert_render_is_the_running_server(lab)
    rc, out = gpuserve(lab, "render", "--profile", LAB_PROFILE)
    assert rc == 0 and "host-free" in out and "--host 0.0.0.0" in out


def test_render_after_a_switch(lab, served) -> None:
    before, _, _ = server_process(lab)
    serve(lab, "--data", f"profile={SWITCH_TO}")
    after, argv, _ = server_process(lab)
    assert after != before and "--ep-size" in argv
    assert_render_is_the_running_server(lab, "--data", f"profile={SWITCH_TO}")


def test_logs_show_the_last_start_and_its_diagnosis(lab, served) -> None:
    rc, out = gpuserve(lab, "logs", "inventory/lab.py", "--limit", "lab-gpu", "--lines", "30")
    assert rc == 0, out
    head = re.search(r"^# lab-gpu: gpuserve-sglang\.service: last start (\S+): ready$", out,
                     re.M)
    assert head, out
    assert re.search(r"^  KV tokens\s+[\d,]+$", out, re.M), out
    journal = out.split("# journal of gpuserve-sglang.service (last 30 lines)\n", 1)[1]
    assert 0 < len(journal.splitlines()) <= 30
    rc, out = gpuserve(lab, "logs", "inventory/lab.py", "--limit", "no-such-host")
    assert rc == 2 and "unknown host 'no-such-host'" in out and "lab-gpu" in out


def test_remove_then_rerun_then_serve_back(lab, served) -> None:
    before = lab.ssh("ls -la --time-style=full-iso /etc/gpuserve /opt/gpuserve", check=True)
    dry = clean(lab.run_pyinfra("deploy/remove.py", "--dry").stdout)
    assert "lab-gpu: remove: stop and disable gpuserve-sglang.service" in dry
    assert "lab-gpu: remove: remove /opt/gpuserve/venvs/" in dry
    assert lab.ssh("ls -la --time-style=full-iso /etc/gpuserve /opt/gpuserve").stdout \
        == before.stdout and healthy(lab)

    out = clean(lab.run_pyinfra("deploy/remove.py").stdout)
    assert "kept the weights" in out
    left = lab.ssh(f"ls -d {UNIT_PATH} {ENV_PATH} /opt/gpuserve/venvs /opt/gpuserve/bin "
                   "2>/dev/null; systemctl show -p LoadState --value " + UNIT
                   + "; pgrep -f [s]glang.launch_server || true").stdout.split()
    assert left == ["not-found"], left
    assert lab.ssh("test -d /opt/gpuserve/cache").returncode == 0  # the Hub cache stays

    assert no_changes(clean(lab.run_pyinfra("deploy/remove.py").stdout))
    serve(lab)
    assert healthy(lab) and served_profile(lab) == LAB_PROFILE
