"""gpuserve/data/scripts/sglang_bench.py run for real on this machine: start a client in
the background, poll its status, read its result line, stop a stuck one, mark a pass.

The "venv python" is a small fake client that checks what the real one is given (the
module, HF_HUB_OFFLINE, the API key in OPENAI_API_KEY and never in argv), prints tqdm-like
progress and appends a JSON line with Infinity the way SGLang's client does.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import time

import pytest

from gpuserve.launch.bench import parse_status
from gpuserve.paths import SCRIPTS_DIR

SCRIPT = SCRIPTS_DIR / "sglang_bench.py"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="drops privileges: needs root")

FAKE_CLIENT = """#!{python}
import json, os, sys, time
assert sys.argv[1:3] == ["-m", "sglang.benchmark.serving"], sys.argv
assert os.environ["HF_HUB_OFFLINE"] == "1"
assert os.environ.get("OPENAI_API_KEY") == "sk-secret-1", os.environ.get("OPENAI_API_KEY")
assert not any("sk-secret" in a for a in sys.argv)
args = sys.argv[3:]
out = args[args.index("--output-file") + 1]
n = int(args[args.index("--num-prompts") + 1])
if "--hang" in args:
    time.sleep(60)
for i in range(1, n + 1):
    sys.stderr.write("\\r%3d%%|#| %d/%d [00:01<00:00, 3.00it/s]" % (100 * i // n, i, n))
    sys.stderr.flush()
print("============ Serving Benchmark Result ============")
with open(out, "a") as f:
    f.write(json.dumps({{"request_rate": float("inf"), "output_throughput": 42.5,
                        "completed": n, "server_info": {{"api_key": "sk-secret-1"}}}}) + "\\n")
"""


def bench(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=True,
                          capture_output=True, text=True, timeout=30).stdout


@pytest.fixture
def setup(tmp_path):
    client = tmp_path / "python"
    client.write_text(FAKE_CLIENT.format(python=sys.executable))
    client.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text('api-key: "sk-secret-1"\n')
    config.chmod(0o600)
    return client, config


def wait_done(run_dir, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = parse_status(bench("status", "--run-dir", str(run_dir)))
        if status.state != "running":
            return status
        time.sleep(0.1)
    raise AssertionError("still running")


def start(tmp_path, client, config, *extra):
    run_dir = tmp_path / "runs" / "r1"
    (tmp_path / "runs").mkdir(exist_ok=True)
    argv = ["--num-prompts", "4", "--output-file", str(run_dir / "result.jsonl"), *extra]
    out = json.loads(bench("start", "--run-dir", str(run_dir), "--user", getpass.getuser(),
                           "--python", str(client), "--config", str(config),
                           "--argv-json", json.dumps(argv)))
    assert out["started"]
    return run_dir


def test_runs_in_the_background_and_reports_the_line_without_server_info(tmp_path, setup):
    run_dir = start(tmp_path, *setup)
    status = wait_done(run_dir)
    assert status.state == "done" and status.rc == 0, status.tail
    assert (status.done, status.total) == (4, 4)
    line = json.loads(status.line)
    assert line["output_throughput"] == 42.5 and line["request_rate"] == float("inf")
    assert "server_info" not in line
    assert "sk-secret" not in json.dumps(status.__dict__)
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert "Serving Benchmark Result" in "\n".join(status.tail)


def test_a_second_start_in_the_same_directory_is_refused(tmp_path, setup):
    start(tmp_path, *setup)
    with pytest.raises(subprocess.CalledProcessError):
        start(tmp_path, *setup)


def test_stop_ends_a_stuck_client(tmp_path, setup):
    run_dir = start(tmp_path, *setup, "--hang")
    time.sleep(0.5)
    assert parse_status(bench("status", "--run-dir", str(run_dir))).state == "running"
    bench("stop", "--run-dir", str(run_dir))
    status = wait_done(run_dir, 10)
    assert status.state == "failed"


def test_mark(tmp_path):
    mark = tmp_path / "bench" / "last-pass.json"
    bench("mark", "--file", str(mark), "--fingerprint", "sha256:abc", "--profile", "p")
    assert json.loads(mark.read_text())["fingerprint"] == "sha256:abc"
