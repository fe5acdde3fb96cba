"""Serve deploy, prepare time: host data validation, lock choice and preflight, rendering,
and the real pyinfra CLI refusing a bad profile before any operation runs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.lock_choice import HostRuntime, PreflightError
from gpuserve.plans.serve import HostReads, first_reads, read_input
from gpuserve.roles.checks.probe import serving_probe_read
from gpuserve.serve.install import pip_args
from tests.cli_fork import run_pyinfra
from tests.serve_plans import plan_of

REPO = Path(__file__).resolve().parents[3]


def test_pip_args_air_gapped_mirror() -> None:
    trusted = ("http://10.0.2.2:8000/",)
    assert pip_args(None, "http://10.0.2.2:8000/wheels/", trusted=trusted) == [
        "--no-index", "--find-links", "http://10.0.2.2:8000/wheels/", "--trusted-host",
        "10.0.2.2"]
    assert pip_args("https://m/simple", "https://w/") == [
        "--index-url", "https://m/simple", "--find-links", "https://w/"]
    assert pip_args(None, "/srv/wheels/") == ["--no-index", "--find-links", "/srv/wheels/"]
    assert pip_args(None, None) == []


@pytest.mark.parametrize("field", ["pip_index_url", "pip_find_links"])
def test_plain_http_pip_mirror_needs_trusted_mirrors(field) -> None:
    url = "http://10.0.2.2:8000/simple/"
    with pytest.raises(InputError) as info:
        plan_of({"profile": "glm5-nvfp4-tp8", field: url}, "inventory/gpu.py", runtime())
    assert (info.value.file, info.value.field) == ("inventory/gpu.py", field)
    assert 'trusted_mirrors: ["http://10.0.2.2:8000/"]' in info.value.message
    # pip_args itself refuses too (install_sglang builds the command with it), and never
    # hands pip --trusted-host for a mirror the inventory did not mark
    args = (url, None) if field == "pip_index_url" else (None, url)
    with pytest.raises(InputError):
        pip_args(*args)
    with pytest.raises(InputError):
        pip_args(*args, trusted=("http://10.0.2.2:80/",))
    assert "--trusted-host" not in pip_args("https://m/simple", None,
                                            trusted=("http://10.0.2.2:8000/",))


def test_trusted_mirror_passes_the_serve_plan() -> None:
    plan = plan_of({"profile": "glm5-nvfp4-tp8", "pip_find_links": "http://10.0.2.2:8000/w/",
                       "trusted_mirrors": ["http://10.0.2.2:8000"]},
                      "inventory/gpu.py", runtime())
    assert plan.find_links == "http://10.0.2.2:8000/w/"
    # the install role takes the validated prefixes from the plan, not from host data
    assert plan.trusted_mirrors == ("http://10.0.2.2:8000/",)


@pytest.mark.parametrize("value", ["http://10.0.2.2:8000/", ["ftp://m/"], [""],
                                   ["http://u:p@m/"], [None]])
def test_bad_trusted_mirrors_are_refused(value) -> None:
    with pytest.raises(InputError) as info:
        plan_of({"profile": "glm5-nvfp4-tp8", "trusted_mirrors": value},
                   "inventory/gpu.py", runtime())
    assert info.value.field == "trusted_mirrors"


def runtime(**kw) -> Callable[[str], HostRuntime]:
    """The facts a real 8-GPU R580 host with Debian 12's Python gives the preflight."""
    base = dict(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
                cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)
    base.update(kw)
    return lambda home: HostRuntime(**base)


R580 = runtime()


def test_plan_installs_the_newest_lock_into_its_own_venv() -> None:
    p = plan_of({"profile": "glm5-nvfp4-tp8"}, "inventory/gpu.py", R580)
    assert (p.lock.name, p.version) == ("sglang-0.5.23-cu13-py311", "0.5.23")
    assert p.venv == f"/opt/gpuserve/venvs/0.5.23-{p.lock.hash}"
    unit = p.service.unit_text
    assert f"ExecStart={p.venv}/bin/python -m sglang.launch_server" in unit
    assert "Environment=CUDA_HOME=/usr/local/cuda-13.0" in unit
    assert f"Environment=PATH={p.venv}/bin:/usr/local/cuda-13.0/bin:" in unit
    assert "lock sglang-0.5.23-cu13-py311" in unit
    assert "--cuda-graph-max-bs-decode 128" in p.service.env_text
    assert p.service.served_name == "glm-5" and p.service.port == 30000
    assert p.expect_gpus == 8 and p.keep_venvs == 2


def test_host_python_picks_the_lock() -> None:
    p = plan_of({"profile": "deepseek-v3-fp8-h200-tp8"}, "inv.py",
                   runtime(python="3.12.3", glibc="2.39"))
    assert (p.lock.name, p.version) == ("sglang-0.5.23-cu13-py312", "0.5.23")


def test_pinned_lock_with_a_placeholder_package_is_refused_saying_where_its_wheel_is() -> None:
    # sglang 0.5.19 pins cuda-tile 1.6.0rc5, on PyPI only a download-at-build placeholder
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": "deepseek-v3-fp8-h200-tp8", "sglang_version": "0.5.19"},
                   "inv.py", runtime(python="3.12.3", glibc="2.39"))
    msg = str(e.value)
    assert "lock sglang-0.5.19-cu13-py312" in msg and "cuda-tile==1.6.0rc5" in msg
    assert "--extra-index-url https://pypi.nvidia.com/" in msg


def test_profile_needing_cuda13_on_an_r570_host_is_refused_before_any_change() -> None:
    # GLM-5 NVFP4 is rendered for SGLang 0.5.23 only, whose torch is CUDA 13.0
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py",
                   runtime(driver="570.195.03", cuda_toolkit="12.8"))
    assert "gpu1: driver 570.195.03 cannot run lock sglang-0.5.23-cu13-py311" in str(e.value)


def test_toolkit_of_another_major_and_a_full_disk_are_refused() -> None:
    with pytest.raises(PreflightError) as e:
        plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py",
                   runtime(cuda_toolkit="12.9", free_bytes=1024**3))
    msg = str(e.value)
    assert "GiB free" in msg and "CUDA toolkit 12.9 does not match" in msg
    assert msg.endswith("nothing on the host was changed")


def _host_json(disable: object) -> list[str]:
    """/etc/gpuserve/host.json as the host deploy writes it (gpuserve.host.nccl_env.host_json)."""
    return json.dumps({"disable_custom_all_reduce": disable, "p2p": "none"}, indent=2).splitlines()


def test_host_without_p2p_adds_disable_custom_all_reduce_once() -> None:
    data = {"profile": "deepseek-v3-fp8-h200-tp8", "sglang_version": "0.5.23"}
    plain = plan_of(data, "inv.py", R580)
    assert "--disable-custom-all-reduce" not in plain.service.env_text
    no_p2p = plan_of(data, "inv.py", R580, host_record=lambda: _host_json(True))
    assert no_p2p.service.env_text.count("--disable-custom-all-reduce") == 1
    p2p_ok = plan_of(data, "inv.py", R580, host_record=lambda: _host_json(False))
    assert "--disable-custom-all-reduce" not in p2p_ok.service.env_text
    # the GLM-5 profile leaves it to the host: rendered once, from host.json
    glm = plan_of({"profile": "glm5-nvfp4-tp8", "sglang_version": "0.5.23"},
                     "inv.py", R580, host_record=lambda: _host_json(True))
    assert glm.service.env_text.count("--disable-custom-all-reduce") == 1


def _measured_host_json(p2p: bool) -> list[str]:
    """host.json after the measuring stage chose (gpuserve.host.nccl_env.host_json of a
    plan with the measured choice), the reference box without and with its P2P clique."""
    from gpuserve.host import nccl_env
    from gpuserve.measure import gates

    off = gates.Measurement(25.81, 2147483648, 12.0, {"NCCL_P2P_DISABLE": "1"})
    on = gates.Measurement(38.37, 2147483648, 6.0, {})
    choice = gates.choose_nccl_env("ok" if p2p else "none", on if p2p else None, off)
    plan = nccl_env.plan_nccl("kvm", "ok" if p2p else "none", measured=choice.to_dict())
    return nccl_env.host_json(plan).splitlines()


def test_restoring_p2p_changes_the_rendered_launch_with_no_profile_change() -> None:
    """The reference-box profile carries no verdict: the host's measurement decides
    custom all-reduce (and nccl.env NCCL_P2P_DISABLE); P2P restored and measured faster
    drops the flag at the next serve, and each plan says where its transport came from."""
    data = {"profile": "glm5-nvfp4-tp8", "sglang_version": "0.5.23"}
    no_p2p = plan_of(data, "inv.py", R580, host_record=lambda: _measured_host_json(False))
    assert "--disable-custom-all-reduce" in no_p2p.service.env_text
    assert "NCCL_P2P_DISABLE" not in no_p2p.service.env_text  # nccl.env's, not the profile's
    note, warn = no_p2p.transport
    assert not warn and note.startswith("NCCL transport: measured (driver P2P verdict is none")
    assert "NCCL_P2P_DISABLE=1, custom all-reduce off" in note
    clique = plan_of(data, "inv.py", R580, host_record=lambda: _measured_host_json(True))
    assert "--disable-custom-all-reduce" not in clique.service.env_text
    assert "NCCL defaults, custom all-reduce left to SGLang" in clique.transport[0]
    assert clique.transport[0].startswith("NCCL transport: measured (P2P on is faster")


def test_an_unrecorded_or_unmeasured_host_is_said() -> None:
    data = {"profile": "glm5-nvfp4-tp8", "sglang_version": "0.5.23"}
    bare = plan_of(data, "inv.py", R580)
    note, warn = bare.transport
    assert warn and "no /etc/gpuserve/host.json" in note and "SHM" in note
    assert "--disable-custom-all-reduce" not in bare.service.env_text
    driver = plan_of(data, "inv.py", R580, host_record=lambda: _host_json(True))
    assert driver.transport == (
        "NCCL transport: from the driver's P2P verdict (none), not measured: NCCL defaults, "
        "custom all-reduce off; deploy/host.py with gates measures it", False)


@pytest.mark.parametrize("lines", [["{not json"], _host_json("yes")])
def test_bad_host_record_names_the_file(lines: list[str]) -> None:
    with pytest.raises(InputError) as e:
        plan_of({"profile": "deepseek-v3-fp8-h200-tp8", "sglang_version": "0.5.23"},
                   "inv.py", R580, host_record=lambda: lines)
    assert e.value.file == "/etc/gpuserve/host.json"


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
        ({"profile": "glm5-nvfp4-tp8", "sglang_version": 0.5}, "sglang_version"),
        ({"profile": "glm5-nvfp4-tp8", "keep_venvs": 0}, "keep_venvs"),
        ({"profile": "glm5-nvfp4-tp8", "keep_venvs": "2"}, "keep_venvs"),
        ({"profile": "glm5-nvfp4-tp8", "sglang_extra_env": {"A B": "1"}},
         "sglang_extra_env.A B"),
    ],
)
def test_bad_host_data_names_inventory_and_field(data: dict, field: str) -> None:
    with pytest.raises(InputError) as e:
        plan_of(data, "inventory/gpu.py", R580)
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
        plan_of({"profile": str(profile), "sglang_version": "0.5.23"}, "inv.py",
                   R580)
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
    proc = run_pyinfra(
        ["-y", "@fake", "deploy/serve.py", "--data", f"profile={profile}",
         "--data", "sglang_version=0.5.23"],
        REPO, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"gpuserve: error: {profile}" in out and f": {field}: " in out, out
    assert needle in out
    assert "Beginning operation run" not in out and "Starting operation" not in out
    assert "Traceback" not in out


def test_user_lock_whose_sglang_wheel_differs_from_the_catalogs_is_refused(tmp_path) -> None:
    """The flag catalog was generated from one wheel file; a lock installing a file of the
    same name with another sha256 would render flags for a wheel nobody read."""
    shipped = REPO / "gpuserve/data/locks/sglang-0.5.23-cu13-py311.json"
    lock = json.loads(shipped.read_text())
    forged = "f" * 64
    lock["sglang_sha256"] = forged
    next(p for p in lock["packages"] if p["name"] == "sglang")["sha256"] = forged
    mine = tmp_path / "locks"
    mine.mkdir()
    (mine / shipped.name).write_text(json.dumps(lock))
    with pytest.raises(InputError) as e:
        plan_of({"profile": "glm5-nvfp4-tp8", "sglang_locks_dir": str(mine)}, "inv.py", R580)
    assert (e.value.file, e.value.field) == (str(mine / shipped.name), "packages (sglang)")
    catalog_sha = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
    assert forged in e.value.message and catalog_sha in e.value.message


def test_serve_deploy_on_fake_host_refuses_a_user_lock_check_refuses(tmp_path) -> None:
    """The lock of Python 3.11 is forged; the @fake host would pick the 3.12 one (managed
    CPython), and the deploy used to judge only the lock it picked: prepared, exit 0."""
    shipped = REPO / "gpuserve/data/locks/sglang-0.5.23-cu13-py311.json"
    lock = json.loads(shipped.read_text())
    lock["sglang_sha256"] = "f" * 64
    next(p for p in lock["packages"] if p["name"] == "sglang")["sha256"] = "f" * 64
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / shipped.name).write_text(json.dumps(lock))
    proc = run_pyinfra(
        ["-y", "--dry", "@fake", "deploy/serve.py", "--data",
         "profile=glm5-nvfp4-tp8", "--data", f"sglang_locks_dir={tmp_path / 'locks'}"],
        REPO, timeout=120, env=dict(os.environ, PYINFRA_FAKE_DELAY="0"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert f"{tmp_path / 'locks' / shipped.name}: packages (sglang): " in out, out[-2000:]
    assert "Ready: deploy/serve.py" not in out and "Traceback" not in out


def test_serve_deploy_on_fake_host_refuses_a_fifo_profile_without_waiting(tmp_path) -> None:
    """A profile that is a FIFO nobody writes: named, never opened (opening it waited
    forever); the subprocess's timeout is the hang's test."""
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    proc = run_pyinfra(
        ["-y", "--dry", "@fake", "deploy/serve.py", "--data", f"profile={fifo}"],
        REPO, timeout=120, env=dict(os.environ, PYINFRA_FAKE_DELAY="0"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert f"{fifo}: is a FIFO (named pipe), not a regular file" in out, out[-2000:]
    assert "Ready: deploy/serve.py" not in out and "Traceback" not in out


def test_locks_dir_that_is_not_a_directory_names_the_field() -> None:
    with pytest.raises(InputError) as e:
        plan_of({"profile": "glm5-nvfp4-tp8", "sglang_locks_dir": "/nonexistent/locks"},
                   "inventory/gpu.py", R580)
    assert (e.value.file, e.value.field) == ("inventory/gpu.py", "sglang_locks_dir")


# ------------------------------------------------------------------ throughput checks


def test_bench_plan_defaults_and_record_context() -> None:
    gpus = tuple({"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                  "memory_total_mib": 97887} for _ in range(8))
    host_json = json.dumps({"p2p": "none", "nccl_env": {"NCCL_P2P_DISABLE": "1"},
                            "disable_custom_all_reduce": True})
    p = plan_of({"profile": "glm5-nvfp4-tp8", "sglang_api_key": "sk-plan-secret-01"},
                   "inv.py", runtime(gpu_list=gpus), lambda: host_json.splitlines())
    assert p.bench is not None and p.bench.mode == "auto"
    assert [s.name for s in p.bench.spec.scenarios] == ["single", "batch"]
    # the reference-box profiles roll a missed floor back (their bench section)
    assert p.bench.on_regression == "rollback"
    assert [(e.scenario, e.value) for e in p.bench.spec.expectations] == [
        ("single", 80.5), ("batch", 202.5)]
    assert p.bench.python == f"{p.venv}/bin/python"
    assert p.bench.tokenizer == "/models/GLM-5-NVFP4" and p.bench.served_name == "glm-5"
    assert p.bench.config_path  # the API key is read from the --config file on the host
    ctx = p.record.context
    assert ctx["gpus"] == {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                           "count": 8}
    assert ctx["p2p"] == "none" and ctx["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert ctx["driver"] == "580.126.20" and "13.0" in ctx["cuda"]
    assert p.record.lock == p.lock.name and p.record.profile_hash.startswith("sha256:")
    assert "sk-plan-secret-01" not in json.dumps(ctx) and "sk-plan-secret-01" not in repr(p.bench)


def test_bench_fingerprint_follows_the_launch() -> None:
    a = plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", R580).bench.fingerprint
    assert a == plan_of({"profile": "glm5-nvfp4-tp8"}, "inv.py", R580).bench.fingerprint
    b = plan_of({"profile": "glm5-nvfp4-tp8-ep8"}, "inv.py", R580).bench.fingerprint
    c = plan_of({"profile": "glm5-nvfp4-tp8",
                    "sglang_extra_env": {"SGLANG_X": "1"}}, "inv.py", R580).bench.fingerprint
    assert len({a, b, c}) == 3


@pytest.mark.parametrize(("data", "field"), [
    ({"bench": "sometimes"}, "bench"),
    ({"on_regression": "undo"}, "on_regression"),
])
def test_bench_host_data_is_validated(data, field) -> None:
    with pytest.raises(InputError) as e:
        plan_of({"profile": "glm5-nvfp4-tp8", **data}, "inventory/gpu.py", R580)
    assert e.value.field == field and e.value.file == "inventory/gpu.py"


def test_bench_off_and_host_on_regression_wins() -> None:
    assert plan_of({"profile": "glm5-nvfp4-tp8", "bench": "off"}, "i", R580).bench is None
    p = plan_of({"profile": "glm5-nvfp4-tp8", "on_regression": "rollback"}, "i", R580)
    assert p.bench.on_regression == "rollback"


def test_cli_refuses_untrusted_http_find_links_before_any_operation() -> None:
    env = dict(os.environ, PYINFRA_FAKE_DELAY="0")
    proc = run_pyinfra(
        ["-y", "@fake", "deploy/serve.py", "--data", "profile=glm5-nvfp4-tp8",
         "--data", "sglang_version=0.5.23",
         "--data", "pip_find_links=http://10.0.2.2:8000/wheels/"],
        REPO, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert ": pip_find_links: 'http://10.0.2.2:8000/wheels/' is plain http" in out, out
    assert 'trusted_mirrors: ["http://10.0.2.2:8000/"]' in out
    assert "Beginning operation run" not in out and "Starting operation" not in out
    assert "Traceback" not in out


def _install_commands(trusted: list[str], find_links: str) -> list[str]:
    """install_sglang prepared on a @fake host with the plan's ``trusted_mirrors``."""
    from gpuserve.launch.locks import available_locks
    from gpuserve.roles.sglang import install_sglang
    from tests.unit.conftest import prepare_fake

    lock = next(lk for lk in available_locks() if lk.name == "sglang-0.5.23-cu13-py311")
    responses = {"useradd": ["/usr/sbin/useradd"], "groupadd": ["/usr/sbin/groupadd"]}
    return prepare_fake(install_sglang, responses, {}, host="@fake/h", user="sglang",
                        home="/opt/gpuserve", lock=lock, find_links=find_links,
                        trusted=tuple(trusted)).runs()


def test_install_gives_trusted_host_only_for_a_marked_mirror() -> None:
    cmds = _install_commands(["http://10.0.2.2:8000/"], "http://10.0.2.2:8000/wheels/")
    pip = next(c for c in cmds if "/bin/pip install" in c)
    assert "--find-links http://10.0.2.2:8000/wheels/ --trusted-host 10.0.2.2" in pip
    assert "--require-hashes" in pip  # every wheel checked against the lock's sha256
    https = next(c for c in _install_commands([], "https://m.example/wheels/")
                 if "/bin/pip install" in c)
    assert "--trusted-host" not in https
    # the role checks again (a caller that skipped plan_serve cannot get http through)
    with pytest.raises(InputError) as info:
        _install_commands([], "http://10.0.2.2:8000/wheels/")
    assert info.value.field == "pip_find_links"


def test_bench_fingerprint_and_record_follow_the_listen_address() -> None:
    """What the unit runs (--host appended by the listen rule) is what is fingerprinted
    and recorded: a key that opens the profile's 0.0.0.0 is a new configuration."""
    plain = plan_of({"profile": "glm5-nvfp4-tp8"}, "i", R580)
    keyed = plan_of({"profile": "glm5-nvfp4-tp8",
                        "sglang_api_key": "sk-" + "k" * 20}, "i", R580)
    assert plain.service.host == "127.0.0.1" and keyed.service.host == "0.0.0.0"
    assert plain.bench.fingerprint != keyed.bench.fingerprint
    assert plain.record.launch_hash != keyed.record.launch_hash
    argv = plain.record.context["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


@pytest.mark.parametrize(("data", "host"), [
    ({"profile": "glm5-nvfp4-tp8"}, R580),
    ({"profile": "deepseek-v3-fp8-h200-tp8"}, runtime(python="3.12.3", glibc="2.39")),
    ({"profile": "glm5-nvfp4-tp8", "sglang_version": "0.5.23"}, R580),
    ({"profile": "glm5-nvfp4-tp8", "sglang_locks_dir": str(REPO / "gpuserve/data/locks")},
     R580),
])
def test_the_chosen_lock_is_among_the_candidates_read_in_the_first_batch(data, host) -> None:
    """The deploy reads the venvs of every candidate lock in its first batch,
    so the lock the plan then chooses must be one of them (else a second batch runs)."""
    chosen = plan_of(data, "inventory/gpu.py", host).lock
    candidates = read_input(data, "inventory/gpu.py").candidate_locks
    assert chosen in candidates


@pytest.mark.parametrize("data", [
    {"profile": "glm5-nvfp4-tp8"},
    {"profile": "glm5-nvfp4-tp8-eagle3", "sglang_home": "/srv/gpuserve"},
    {"profile": "deepseek-v3-fp8-h200-tp8-dpattn", "sglang_api_key": "sk-" + "k" * 20},
    {"profile": str(REPO / "profiles/glm5-nvfp4-tp8-ep8.yaml")},
])
def test_the_batch_probe_is_the_one_the_gate_asks_for(data, tmp_path) -> None:
    """The first batch reads the gate's first probe with its smoke, guessed
    from host data and profile before any host read; the gate looks it up by the plan's
    own request, so the guess must equal it (else every rerun probes again). Both skip
    the completion while the start of the host's newest smoke record runs."""
    from gpuserve.measure.results import ResultRecord, write_record
    from gpuserve.roles.checks.probe import serving_probe
    from gpuserve.roles.checks.scripts import PROBE
    from gpuserve.roles.checks.smoke import SmokeRequest
    from gpuserve.serve.service import UNIT_NAME

    start = "4f6e0c2b9d5a4e7f8a1b3c5d7e9f0a12"
    write_record(tmp_path, ResultRecord(kind="smoke", profile="p", host="gpu1",
                                        figures={"tok_s": 40.0}, server_start=start))
    data = {**data, "results_dir": str(tmp_path)}
    plan = plan_of(data, "inventory/gpu.py", R580 if "deepseek" not in data["profile"]
                      else runtime(python="3.12.3", glibc="2.39"))
    asked = serving_probe(f"{plan.bin_dir}/{PROBE}", UNIT_NAME, plan.service.profile_name,
                          SmokeRequest(port=plan.service.port, model=plan.service.served_name,
                                       config=plan.config_path, unless_start=start))
    assert serving_probe_read(first_reads(read_input(data, "inventory/gpu.py")), "gpu1") == asked
    assert dict(serving_probe_read(first_reads(read_input(data, "inventory/gpu.py")), "gpu2")
                .kwargs)["smoke"].unless_start == ""
    assert bool(dict(asked.kwargs)["smoke"].config) == ("sglang_api_key" in data)


@pytest.mark.parametrize("value, per_start", [(None, True), ("1", True), ("true", True),
                                              ("0", False), ("false", False), ("", False)])
def test_a_health_that_generates_nothing_asks_for_a_smoke_every_run(tmp_path, value,
                                                                     per_start) -> None:
    """SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 makes /health a plain 200: it proves no
    generation, so the batch's probe asks for the completion whatever was recorded."""
    from gpuserve.measure.health import health_generates
    from gpuserve.measure.results import ResultRecord, write_record

    start = "4f6e0c2b9d5a4e7f8a1b3c5d7e9f0a12"
    write_record(tmp_path, ResultRecord(kind="smoke", profile="p", host="gpu1",
                                        figures={"tok_s": 40.0}, server_start=start))
    extra = {} if value is None else {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": value}
    data = {"profile": "glm5-nvfp4-tp8", "results_dir": str(tmp_path),
            "sglang_extra_env": extra}
    first = first_reads(read_input(data, "inventory/gpu.py"))
    asked = dict(serving_probe_read(first, "gpu1").kwargs)
    assert asked["smoke"].unless_start == (start if per_start else "")
    assert health_generates(extra) is per_start


@pytest.mark.parametrize("data", [{}, {"profile": "no-such-profile"}, {"profile": 5},
                                  {"profile": "../../etc/passwd"},
                                  {"profile": "glm5-nvfp4-tp8", "sglang_locks_dir": "/nonexistent"},
                                  {"profile": "glm5-nvfp4-tp8", "sglang_version": 5}])
def test_bad_input_stops_before_any_read_with_the_plans_own_error(data) -> None:
    """No guess that swallows the error: the input the first batch is derived from
    raises exactly what the plan raises, before any host read."""
    with pytest.raises(InputError) as first:
        read_input(data, "inventory/gpu.py")
    with pytest.raises(InputError) as planned:
        plan_of(data, "inventory/gpu.py", R580)
    assert str(first.value) == str(planned.value)


def test_the_serve_deploy_loads_the_profile_once_per_host(monkeypatch) -> None:
    """The deploy's prepare step (roles/deploys/serve.plan_and_read) parses host data and
    profile once per host (read_input), derives its first batch of reads from that, and
    plans from the same parsed input: one profile load per host, counted wherever a
    module holds load_profile."""
    import sys

    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    import gpuserve.launch.profiles as profiles
    import gpuserve.roles.deploys.serve as deploy
    from gpuserve.roles.base.run_context import run_context

    loads: list[str] = []
    real = profiles.load_profile

    def counted(ref, *args, **kwargs):
        loads.append(ref)
        return real(ref, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "load_profile", None) is real:
            monkeypatch.setattr(module, "load_profile", counted)
    batches: list[list] = []
    monkeypatch.setattr(deploy, "prefetch", batches.append)
    monkeypatch.setattr(deploy, "host_reads", lambda first: HostReads(runtime=R580))
    monkeypatch.setattr(deploy, "fact", lambda cls, **kwargs: None)  # nothing on the hosts
    monkeypatch.setattr(deploy, "host_facts_document", lambda reader: None)
    inv = Inventory((["gpu1", "gpu2"], {"profile": "glm5-nvfp4-tp8"}))
    state = State(inv, Config())
    plans = []
    for host in inv:
        with ctx_state.use(state), ctx_host.use(host):
            plans.append(deploy.plan_and_read())
    assert loads == ["glm5-nvfp4-tp8", "glm5-nvfp4-tp8"]
    assert len(batches) == 2  # one first batch per host, derived from the parsed input
    assert [run_context(state).host(h).serve_plan for h in ("gpu1", "gpu2")] == plans


def test_the_previews_secrets_include_secret_named_extra_env() -> None:
    """--dry redacts with the input's secrets: a secret-named sglang_extra_env value is one
    of them, as in host_secret_values; a plain extra env value is not."""
    data = {"profile": "glm5-nvfp4-tp8", "hf_token": "hf_" + "a" * 30,
            "sglang_extra_env": {"WANDB_API_KEY": "wandb-secret-value-123",
                                 "NCCL_DEBUG": "WARN"}}
    secrets = read_input(data, "inventory/gpu.py", "", lambda group: None).secrets
    assert set(secrets) == {"hf_" + "a" * 30, "wandb-secret-value-123"}


def test_the_start_record_redacts_with_the_plans_secrets() -> None:
    """The start record's error line (roles/checks/starts.py) is redacted with the plan's
    secrets, the same ones as the preview's, not read from host data again."""
    data = {"profile": "glm5-nvfp4-tp8", "hf_token": "hf_" + "b" * 30, "results_dir": "results",
            "sglang_extra_env": {"WANDB_API_KEY": "wandb-secret-value-456"}}
    plan = plan_of(data, "inventory/gpu.py", runtime())
    assert plan.start is not None
    assert set(plan.start.secrets) == {"hf_" + "b" * 30, "wandb-secret-value-456"}
