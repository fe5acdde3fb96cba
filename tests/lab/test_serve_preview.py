"""The serve deploy's preview on the served lab host: ``pyinfra ... deploy/serve.py --dry
--diff`` shows what a switch would change (the env file's diff with the changed flags,
the restart and why) and changes nothing on the host; on a no-op it shows no diff.

Reuses the host the serve modules leave (glm5-nvfp4-tp8 with secrets); alone, its
fixture deploys that first (a no-op rerun after them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from labhelpers import ENV_PATH, UNIT, UNIT_PATH, clean, served_profile

pytestmark = pytest.mark.lab

# the same secrets as test_serve.py, so its configuration is the one served here
HF_TOKEN = "hf_labTokenNeverOnArgv0123"
API_KEY = "sk-lab-key-never-on-argv-4567"


def serve(lab, data: Path, *args: str) -> tuple[int, str]:
    r = lab.run_pyinfra("deploy/serve.py", *args, "--group-data", str(data), check=False)
    return r.returncode, clean(r.stdout)


def live(lab) -> tuple[str, str, str]:
    """The unit's and env file's hashes and the server's PID."""
    out = lab.ssh(f"sha256sum {UNIT_PATH} {ENV_PATH}; systemctl show -p MainPID --value {UNIT}",
                  check=True).stdout.split()
    return out[0], out[2], out[4]


@pytest.fixture(scope="module")
def served(lab, tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("group_data")
    (data / "all.py").write_text(f"hf_token = {HF_TOKEN!r}\nsglang_api_key = {API_KEY!r}\n")
    rc, out = serve(lab, data)
    assert rc == 0, out[-6000:]
    assert served_profile(lab) == "glm5-nvfp4-tp8"
    return data


def test_dry_diff_of_a_switch_shows_the_flags_and_the_restart_and_changes_nothing(
        lab, served) -> None:
    before = live(lab)
    rc, out = serve(lab, served, "--dry", "--diff", "--data", "profile=glm5-nvfp4-tp8-ep8")
    assert rc == 0, out[-6000:]
    assert "lab-gpu: preview: changes (nothing on the host was changed)" in out, out[-6000:]
    assert f"lab-gpu: preview: diff of {ENV_PATH}:" in out
    added = [line for line in out.splitlines() if line.strip().startswith("+GPUSERVE_SGLANG")]
    assert added and "--ep-size 8" in added[0] and "--mem-fraction-static 0.92" in added[0]
    assert re.search(r"lab-gpu: preview: server: restart: .*sglang\.env would change", out)
    assert "lab-gpu: preview: operation: systemctl " in out and "restart" in out
    assert HF_TOKEN not in out and API_KEY not in out
    assert "Beginning operation run" not in out
    assert live(lab) == before  # unit, env file and server PID unchanged
    assert served_profile(lab) == "glm5-nvfp4-tp8"


def test_dry_diff_of_a_no_op_shows_no_diff(lab, served) -> None:
    rc, out = serve(lab, served, "--dry", "--diff")
    assert rc == 0, out[-6000:]
    assert "lab-gpu: preview: no changes (nothing on the host was changed)" in out, out[-6000:]
    assert "preview: diff of" not in out and "\n    +" not in out
    assert "lab-gpu: preview: server: no restart" in out
