"""The weights step's prepare-time decisions (gpuserve/serve/weights.py), driven with
the WeightsState document the host script prints and a recorded Hub reader: a complete
revision reads nothing from the Hub, a disk too small is refused with the numbers, a
floating branch that moved is refused unless asked, bad host data names its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.launch.profiles import load_profile
from gpuserve.memory.remote import RemoteCheckpoint, RepoFile
from gpuserve.serve.weights import plan_weights, progress_line

COMMIT = "a" * 40
MOVED = "b" * 40
GIB = 1 << 30
FILES = (RepoFile("config.json", 700, None, "c" * 40),
         RepoFile("model.safetensors", 3 * GIB, "d" * 64, "e" * 40))


def _state(complete: bool, free: int, staged: int = 0, recorded: str | None = None) -> str:
    return json.dumps({"schema": "gpuserve.weights/1", "complete": complete,
                       "free_bytes": free, "staged_bytes": staged, "recorded": recorded})


class Hub:
    """Records what the plan asked of the Hub."""

    def __init__(self, commit: str = COMMIT):
        self.calls: list[tuple[str, bool]] = []
        self.commit = commit

    def __call__(self, source, where, token, headers=True, files=True, max_files=None,
                 timeout=None):
        self.calls.append((source.spec, headers, files))
        return RemoteCheckpoint(source, self.commit, FILES if files else (),
                                {"schema": "x"} if headers else None)


def _profile(tmp_path: Path, hf: str, floating: bool = False):
    p = tmp_path / "w.yaml"
    p.write_text(f"model:\n  hf: {hf}\n" + ("  allow_floating_revision: true\n"
                                             if floating else ""))
    return load_profile(p)


def _plan(profile, state: str, hub: Hub, **data):
    seen = []

    def host_state(target, ref, models_dir):
        seen.append((target, ref, models_dir))
        return state

    step = plan_weights(data, "inventory.py", profile, home="/opt/gpuserve", user="sglang",
                        host_state=host_state, remote=hub, want_headers=True)
    return step.finish(), step.profile, step.found, seen


def test_complete_revision_makes_no_hub_call(tmp_path):
    hub = Hub()
    plan, prof, found, seen = _plan(_profile(tmp_path, f"org/name@{COMMIT}"),
                                    _state(True, 0), hub)
    assert hub.calls == [] and found is None and plan.complete
    assert prof.model.path == f"/opt/gpuserve/models/org--name/{COMMIT}" == plan.target
    assert seen == [(plan.target, "", "/opt/gpuserve/models")]


def test_incomplete_revision_reads_headers_and_counts_staged_bytes(tmp_path):
    hub = Hub()
    plan, _, found, _ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"),
                              _state(False, 100 * GIB, staged=GIB), hub,
                              models_dir="/srv/models")
    # headers first (for the preflight), the file list only after
    assert hub.calls == [(f"org/name@{COMMIT}", True, False),
                         (f"org/name@{COMMIT}", False, True)] and found.scan is not None
    assert plan.to_fetch == 3 * GIB + 700 - GIB and plan.total_bytes == 3 * GIB + 700
    assert plan.target == f"/srv/models/org--name/{COMMIT}"


def test_disk_too_small_is_refused_with_the_numbers(tmp_path):
    with pytest.raises(PreflightError) as e:
        _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(False, 2 * GIB), Hub())
    text = str(e.value)
    assert "disk: /opt/gpuserve/models has 2.00 GiB" in text
    assert f"{3 * GIB + 700:,} bytes" in text and "nothing was downloaded" in text


def test_floating_branch_resolved_then_moved_is_refused_unless_asked(tmp_path):
    prof = _profile(tmp_path, "org/name@main", floating=True)
    hub = Hub(commit=MOVED)
    with pytest.raises(PreflightError) as e:
        _plan(prof, _state(False, 100 * GIB, recorded=COMMIT), hub)
    assert f"now resolves to {MOVED}" in str(e.value) and COMMIT in str(e.value)
    assert "hf_revision_update=true" in str(e.value)
    plan, _, _, seen = _plan(prof, _state(False, 100 * GIB, recorded=COMMIT), Hub(MOVED),
                             hf_revision_update=True)
    assert plan.commit == MOVED and plan.ref_record == "/opt/gpuserve/models/org--name/refs/main"
    assert plan.record  # the accepted move is recorded
    assert seen[0][1] == plan.ref_record


@pytest.mark.parametrize("data, key", [
    ({"models_dir": "relative/dir"}, "models_dir"),
    ({"models_dir": "/"}, "models_dir"),
    ({"models_dir": "/etc"}, "models_dir"),
    ({"models_dir": "/usr/lib/models"}, "models_dir"),
    ({"models_dir": "/var/lib/postgresql/models"}, "models_dir"),  # another service's home
    ({"models_dir": "/opt/gpuserve/cache"}, "models_dir"),  # the service user's home
    ({"models_dir": "/opt"}, "models_dir"),
    ({"models_dir": "/srv/models\n"}, "models_dir"),
    ({"hf_endpoint": "https://mirror\n.internal"}, "hf_endpoint"),
    ({"hf_endpoint": "https://mirror.internal/ x"}, "hf_endpoint"),
    ({"hf_plan_endpoint": "file:///etc"}, "hf_plan_endpoint"),
    ({"weights_stall_timeout": 0}, "weights_stall_timeout"),
    ({"weights_max_files": -1}, "weights_max_files"),
    ({"weights_min_rate": -1}, "weights_min_rate"),
    ({"weights_min_rate": "fast"}, "weights_min_rate"),
    ({"weights_min_rate": True}, "weights_min_rate"),
    ({"weights_workers": 0}, "weights_workers"),
    ({"weights_workers": 65}, "weights_workers"),
    ({"weights_workers": 2.5}, "weights_workers"),
    ({"hf_endpoint": "ftp://mirror"}, "hf_endpoint"),
    ({"hf_endpoint": "https://user:pw@mirror"}, "hf_endpoint"),
    ({"hf_endpoint": "http://mirror.internal"}, "hf_endpoint"),  # not a trusted mirror
    ({"hf_token": "short"}, "hf_token"),
    ({"weights_timeout": 0}, "weights_timeout"),
    ({"hf_revision_update": "yes"}, "hf_revision_update"),
])
def test_bad_host_data_names_the_key_before_any_read(tmp_path, data, key):
    hub = Hub()
    with pytest.raises(InputError) as e:
        _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(False, 100 * GIB), hub, **data)
    assert e.value.file == "inventory.py" and e.value.field == key and hub.calls == []


def test_the_rate_floor_and_the_workers_reach_the_plan(tmp_path):
    plan, *_ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(False, 100 * GIB),
                     Hub(), weights_min_rate=0, weights_workers=3)
    assert (plan.min_rate, plan.workers) == (0.0, 3)
    plan, *_ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(False, 100 * GIB),
                     Hub())
    assert (plan.min_rate, plan.workers) == (4096.0, 8)


@pytest.mark.parametrize("models_dir", ["/srv/models", "/opt/gpuserve/models/x",
                                        "/home/ml/models", "/data/hf"])
def test_a_dedicated_models_dir_is_accepted(tmp_path, models_dir):
    plan, *_ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(True, 0), Hub(),
                     models_dir=models_dir)
    assert plan.models_dir == models_dir


def test_http_mirror_allowed_when_trusted(tmp_path):
    plan, *_ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(True, 0), Hub(),
                     hf_endpoint="http://10.0.2.2:8080/", trusted_mirrors=["http://10.0.2.2:8080/"])
    assert plan.endpoint == "http://10.0.2.2:8080"


def test_progress_line_has_bytes_rate_and_eta():
    line = progress_line("gpu1", "org/name", {"state": "running", "phase": "download",
                                              "bytes": GIB, "total": 4 * GIB,
                                              "rate": 100 * (1 << 20), "eta_s": 30.7})
    assert line == "gpu1: weights: org/name: 1.00 GiB of 4.00 GiB (25%), 100.0 MiB/s, ETA 31 s"


def test_plan_endpoint_is_what_the_controller_reads_and_errors_name(tmp_path):
    seen = []

    def hub(source, where, token, headers=True, files=True, max_files=None,
            timeout=None):
        seen.append((where.endpoint, where.endpoint_field))
        return RemoteCheckpoint(source, COMMIT, FILES, None)

    plan, *_ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(False, 100 * GIB),
                     hub, hf_endpoint="https://mirror.lan", hf_plan_endpoint="https://hub.io/")
    assert seen == [("https://hub.io", "hf_plan_endpoint")] * 2
    assert plan.endpoint == "https://mirror.lan"  # the host fetches from its own


def test_http_on_loopback_crosses_no_network(tmp_path):
    plan, *_ = _plan(_profile(tmp_path, f"org/name@{COMMIT}"), _state(True, 0), Hub(),
                     hf_endpoint="http://127.0.0.1:8080/hub")
    assert plan.endpoint == "http://127.0.0.1:8080/hub"


def test_floating_branch_is_recorded_once(tmp_path):
    prof = _profile(tmp_path, "org/name@main", floating=True)
    first, *_ = _plan(prof, _state(True, 0), Hub())  # complete already: recorded anyway
    assert first.complete and first.record and first.commit == COMMIT
    again, *_ = _plan(prof, _state(True, 0, recorded=COMMIT), Hub())
    assert not again.record
