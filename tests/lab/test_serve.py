"""End to end on the lab host: the real pyinfra CLI serves a profile, testinfra checks it.

Order matters (module-scoped, one deploy): a bad profile is refused before the host is
touched, then the deploy with secrets, then the checks over SSH, then a rerun that must
report no changes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from labhelpers import host_provisioned

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
UNIT = "gpuserve-sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/gpuserve/sglang.env"
CONFIG_PATH = "/etc/gpuserve/sglang-secrets.yaml"
HF_TOKEN = "hf_labTokenNeverOnArgv0123"
API_KEY = "sk-lab-key-never-on-argv-4567"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def serve(lab, *args: str, group_data: Path | None = None) -> tuple[int, str]:
    extra = [*args, *(["--group-data", str(group_data)] if group_data else [])]
    r = lab.run_pyinfra("deploy/serve.py", *extra, check=False)
    return r.returncode, ANSI.sub("", r.stdout)


@pytest.fixture(scope="module")
def vm(lab):
    return lab.testinfra_host()


@pytest.fixture(scope="module")
def secrets_data(tmp_path_factory) -> Path:
    """Secrets as group data (a file), so they are not even on the controller's argv."""
    d = tmp_path_factory.mktemp("group_data")
    (d / "all.py").write_text(f"hf_token = {HF_TOKEN!r}\nsglang_api_key = {API_KEY!r}\n")
    return d


def fingerprint(lab) -> str:
    return lab.ssh(
        "ls -la --time-style=full-iso /etc/systemd/system /etc/gpuserve /opt/gpuserve "
        f"2>&1; systemctl show -p InvocationID,ActiveState {UNIT}", check=True).stdout


@pytest.fixture(scope="module")
def first_run(lab, secrets_data, tmp_path_factory):
    host_provisioned(lab)  # the records' context names the GPUs the host deploy found
    # 1. An unknown flag in the profile: refused at prepare, the host is not touched.
    bad = tmp_path_factory.mktemp("profiles") / "bad-flag.yaml"
    bad.write_text("extends: " + str(REPO / "profiles/glm5-nvfp4-tp8.yaml") +
                   "\nextra_args: ['--no-such-flag', '1']\n")
    before = fingerprint(lab)
    rc, out = serve(lab, "--data", f"profile={bad}", group_data=secrets_data)
    refused = (rc, out, before == fingerprint(lab))
    # 2. The real deploy.
    rc, out = serve(lab, group_data=secrets_data)
    return refused, rc, out


def test_bad_profile_refused_before_the_host_changes(first_run) -> None:
    (rc, out, unchanged), _, _ = first_run
    assert rc != 0, out
    assert "bad-flag.yaml" in out and "extra_args[0]" in out and "--no-such-flag" in out
    assert "Beginning operation run" not in out
    assert unchanged


def test_deploy_succeeds_with_a_smoke_line(first_run) -> None:
    _, rc, out = first_run
    assert rc == 0, out[-6000:]
    assert re.search(r"lab-gpu: health: ", out), out[-4000:]
    m = re.search(r"lab-gpu: smoke: (\d+) tokens in ([\d.]+) s = ([\d.]+) tok/s "
                  r"\(glm-5, profile glm5-nvfp4-tp8\)", out)
    assert m, out[-4000:]
    assert int(m.group(1)) > 0 and float(m.group(3)) > 0


BENCH_LINE = re.compile(r"lab-gpu: bench: (single|batch) c(\d+) (\d+)/(\d+): ([\d,.]+) out tok/s")


def test_first_deploy_records_single_stream_and_batch_throughput(lab, first_run) -> None:
    """SGLang's own client (the stand-in's, with the real argument set and JSON keys)
    ran both default scenarios over HTTP; each is a record on the controller."""
    _, rc, out = first_run
    assert rc == 0, out[-6000:]
    found = {m.group(1): m for m in BENCH_LINE.finditer(out)}
    assert set(found) == {"single", "batch"}, out[-6000:]
    assert found["single"].group(2) == "1" and found["batch"].group(2) == "64"
    single = float(found["single"].group(5).replace(",", ""))
    batch = float(found["batch"].group(5).replace(",", ""))
    assert 0 < single < batch, (single, batch)
    assert re.search(r"lab-gpu: bench: (single|batch) \(c\d+, \d+ prompts\): \d+/\d+ "
                     r"requests, \d+ s", out), "no progress line"
    # this deploy's two records are the newest (the docs' make demo, run earlier on the
    # same host, recorded its own first; names start with the UTC time)
    records = sorted((lab.results_dir / "lab-gpu").glob("*-bench-glm5-nvfp4-tp8-*.json"))[-2:]
    docs = [json.loads(p.read_text()) for p in records]
    assert sorted(d["scenario"] for d in docs) == ["batch", "single"], records
    for doc in docs:
        assert doc["sglang"]["completed"] > 0 and "server_info" not in doc["sglang"]
        assert doc["sglang"]["request_rate"] == "inf"
        assert doc["context"]["gpus"]["count"] == 8 and doc["lock"].startswith("sglang-0.5.23")
        assert doc["gate"]["passed"] is True
        text = json.dumps(doc)
        assert API_KEY not in text and HF_TOKEN not in text


def test_secrets_not_in_pyinfra_output(first_run) -> None:
    _, _, out = first_run
    assert HF_TOKEN not in out and API_KEY not in out


def test_unit_file(vm, first_run) -> None:
    unit = vm.file(UNIT_PATH)
    assert unit.is_file and unit.mode == 0o644 and unit.user == "root"
    text = unit.content_string
    assert "User=sglang" in text and "NoNewPrivileges=yes" in text
    # the lock's own venv (roles/sglang): /opt/gpuserve/venvs/<version>-<lock hash>
    venv = re.search(r"ExecStart=(/opt/gpuserve/venvs/0\.5\.23\+lab-[0-9a-f]{12})/bin/python "
                     r"/opt/gpuserve/bin/sglang_redact\.py", text)
    assert venv, text
    assert f"{venv.group(1)}/bin/python -m sglang.launch_server" in text
    assert vm.file(f"{venv.group(1)}/.gpuserve-verified").exists
    assert "Environment=CUDA_HOME=/usr/local/cuda-13.0" in text
    assert HF_TOKEN not in text and API_KEY not in text
    assert "--model-path" not in text and "$GPUSERVE_SGLANG_ARGS" in text  # in the env file
    # what systemd really started: the launcher, then $GPUSERVE_SGLANG_ARGS from the env file split
    # into words, the secrets file last (the main process is the redacting wrapper)
    pid = vm.check_output(f"systemctl show -p MainPID --value {UNIT}")
    argv = vm.check_output(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    launched = argv[argv.index("sglang.launch_server") + 1:]
    assert launched[launched.index("--model-path") + 1] == "/models/GLM-5-NVFP4", argv
    assert launched[-2:] == ["--config", CONFIG_PATH], argv
    assert vm.run("systemd-analyze verify %s", UNIT_PATH).rc == 0
    # least privilege: a read-only working directory, code only from the venv, and an
    # exposure systemd itself rates at most 4.0 (it was 6.1-6.3 MEDIUM)
    assert "WorkingDirectory=/\n" in text and "Environment=PYTHONSAFEPATH=1" in text
    assert "CapabilityBoundingSet=\n" in text and "DevicePolicy=closed" in text
    security = vm.run("systemd-analyze security --no-pager %s", UNIT)
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout)
    assert level and float(level.group(1)) <= 4.0, security.stdout[-3000:]


def test_systemd_splits_the_rendered_args_into_the_same_words(lab) -> None:
    """The server's arguments pass through two of systemd's parsers (the
    EnvironmentFile's quoting, then the splitting of ``$GPUSERVE_SGLANG_ARGS``): a transient unit
    on the guest's real systemd, given the rendered file, gets exactly these words."""
    from gpuserve.serve.render import render_env_file

    words = ["--x", 'a "quoted" word', "has  space", "50%", "$HOME", "${HOME}", "back\\slash",
             '{"decode": {"max_bs": 256}}', "", "it's", "`x`", "\u00fc", "--y"]
    env = render_env_file([("NCCL_DEBUG", "WARN")], "p", words)
    path = "/run/gpuserve-args-check.env"
    lab.ssh(f"umask 077 && cat > {path} <<'GPUSERVE_EOF'\n{env}GPUSERVE_EOF", check=True)
    r = lab.ssh(f"systemd-run --quiet --wait --pipe -p EnvironmentFile={path} /usr/bin/python3 "
                "-c 'import sys, json; print(json.dumps(sys.argv[1:]))' '$GPUSERVE_SGLANG_ARGS'; "
                f"rc=$?; rm -f {path}; exit $rc", check=True)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == words, r.stdout


def test_the_venv_is_built_by_the_pinned_uv(vm, first_run) -> None:
    """uv (gpuserve/data/tools/uv.json) came from the lab mirror's find-links as a
    hash-checked wheel into /opt/gpuserve/tools, and built the served venv: uv writes
    its version into pyvenv.cfg and installs no pip."""
    from gpuserve.serve.uv import pin

    version = pin().version
    uv = f"/opt/gpuserve/tools/uv-{version}/bin/uv"
    assert vm.check_output(f"{uv} --version").split()[:2] == ["uv", version]
    unit = vm.file(UNIT_PATH).content_string
    venv = re.search(r"ExecStart=(/opt/gpuserve/venvs/[^/\s]+)/bin/python", unit).group(1)
    cfg = vm.file(f"{venv}/pyvenv.cfg").content_string
    assert re.search(rf"^uv = {re.escape(version)}$", cfg, re.M), cfg
    assert not vm.file(f"{venv}/bin/pip").exists
    assert not vm.file("/opt/gpuserve/tools/uv-cache").exists  # removed after the install
    check = vm.run(f"UV_NO_CONFIG=1 {uv} pip check --python {venv}/bin/python")
    assert check.rc == 0 and "All installed packages are compatible" in check.stderr, check


def test_service_account_is_gpuserve_own(vm, first_run) -> None:
    """The account carries gpuserve's mark, so a later deploy knows it may manage it."""
    fields = vm.check_output("getent passwd sglang").split(":")
    assert fields[2] != "0" and fields[4] == "gpuserve service account"
    assert fields[6] == "/usr/sbin/nologin"


def test_secret_files(vm, first_run) -> None:
    env = vm.file(ENV_PATH)
    assert (env.mode, env.user, env.group) == (0o600, "root", "root")
    assert f"HF_TOKEN={HF_TOKEN}" in env.content_string
    cfg = vm.file(CONFIG_PATH)
    assert (cfg.mode, cfg.user) == (0o600, "sglang")
    assert API_KEY in cfg.content_string
    assert vm.file("/etc/gpuserve").mode == 0o750


def test_service_running_listening_healthy(vm, first_run) -> None:
    svc = vm.service(UNIT)
    assert svc.is_running and svc.is_enabled
    # sglang_api_key is set (secrets_data), so the profile's server.host (0.0.0.0) applies;
    # without a key the server would listen on 127.0.0.1 only
    assert vm.socket("tcp://0.0.0.0:30000").is_listening
    assert vm.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health") \
        == "200"
    args = vm.check_output("ps -eo user,args")
    assert HF_TOKEN not in args and API_KEY not in args
    assert re.search(r"^sglang\s+/opt/gpuserve/venvs/0\.5\.23\+lab-\w+/bin/python -m "
                     r"sglang\.launch_server",
                     args, re.M)


def test_metrics_are_on_by_default_and_need_no_key(vm, first_run) -> None:
    """SGLang's /metrics is on without any host data asking, on the API's port, exempt
    from the API key like /health (docs/metrics.md)."""
    text = vm.check_output("curl -s http://127.0.0.1:30000/metrics")
    assert re.search(r"^sglang:num_running_reqs\{", text, re.M), text[:500]
    assert re.search(r"^sglang:time_to_first_token_seconds_bucket\{", text, re.M)
    assert "--enable-metrics" in vm.check_output(f"cat {ENV_PATH}")


def test_secrets_not_in_the_journal(vm, first_run) -> None:
    journal = vm.check_output(f"journalctl -u {UNIT} --no-pager -o cat")
    assert "fired up and ready to roll" in journal
    assert HF_TOKEN not in journal and API_KEY not in journal


def test_api_key_is_enforced(vm, first_run) -> None:
    code = vm.check_output(
        "curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' "
        "-d '{\"model\": \"glm-5\", \"prompt\": \"hi\", \"max_tokens\": 1}' "
        "http://127.0.0.1:30000/v1/completions")
    assert code == "401"


def test_rerun_reports_no_changes(lab, vm, first_run, secrets_data) -> None:
    invocation = vm.check_output(f"systemctl show -p InvocationID --value {UNIT}")
    rc, out = serve(lab, group_data=secrets_data)
    assert rc == 0, out[-6000:]
    assert "No changes" in out
    assert not re.search(r"^\s*\[lab-gpu\]\s+Success\s*$", out, re.M), out[-6000:]
    total = [line for line in out.splitlines() if line.strip().startswith("Grand total")]
    assert total and total[-1].split()[3] == "-", total  # Hosts, Success(-), Error, ...
    assert "lab-gpu: bench: skipped" in out and not BENCH_LINE.search(out)
    assert vm.check_output(f"systemctl show -p InvocationID --value {UNIT}") == invocation
    # still verified: /health generated a token, and the record that measured this very
    # start of the server is named (one smoke per start: docs/reruns.md)
    m = re.search(r"lab-gpu: smoke: none made, the server has run since its smoke of \S+ "
                  r"\([\d.]+ tok/s, (\S+\.json)\) and its /health generated a token now", out)
    assert m, out[-6000:]
    assert json.loads(Path(m.group(1)).read_text())["server_start"] == invocation


def test_oom_start_fails_early_with_the_cause(lab, vm, first_run, secrets_data) -> None:
    """A start that dies (the stand-in's CUDA-graph-capture OOM) fails the deploy at once
    with the cause and the journal, long before health_timeout; a fixed deploy recovers."""
    import time

    oom = ('sglang_extra_env={"GPUSERVE_LAB_STANDIN_LOAD_SECONDS": "3", '
           '"GPUSERVE_LAB_STANDIN_FAIL": "oom"}')
    t0 = time.monotonic()
    rc, out = serve(lab, "--data", oom, "--data", "health_timeout=600",
                    group_data=secrets_data)
    took = time.monotonic() - t0
    assert rc != 0, out[-4000:]
    assert re.search(r"\[lab-gpu\] health: (unit stopped|fatal error) during "
                     r"'capturing CUDA graphs'.*CUDA out of memory", out), out[-6000:]
    assert "last journal lines of gpuserve-sglang.service" in out
    assert took < 400, f"waited {took:.0f} s: the failure was not detected early"
    assert HF_TOKEN not in out and API_KEY not in out
    # back to the good configuration: restarts despite the crash loop's start limit
    rc, out = serve(lab, group_data=secrets_data)
    assert rc == 0, out[-6000:]
    assert "lab-gpu: smoke: " in out
