"""A hostile or broken mirror against the real controller code and the real host script
(run here in a temporary directory), the lab's Hub stand-in (lab/hub) on loopback
switched to one misbehaviour per test: hostile listings, endless and dripping bodies, a
server ignoring Range, hung and self-paging listings, pagination and redirects to
another origin, an error page echoing the token, a refused port. Each ends in one clear
error (or a correct download) within seconds; victim files beside the models directory
and in the home directory stay untouched; no token reaches another origin or any
output."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.commands.weights import fetch_module
from gpuserve.errors import InputError
from gpuserve.launch.hf_source import HfSource
from gpuserve.memory.remote import Where, hub_module, read_remote
from lab.hub import publish
from lab.hub.server import HubServer
from lab.hub.server import control as lab_control

TINY = "gpuserve-lab/Tiny-Llama-3L"
SHARD1 = "model-00001-of-00003.safetensors"
TOKEN = "hf_" + "Sekr3t" * 6
HUB = hub_module()


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory) -> Path:
    mirror = tmp_path_factory.mktemp("mirror")
    publish.publish(mirror, [TINY])
    return publish.hub_root(mirror)


@pytest.fixture
def hub(hub_root):
    with HubServer(hub_root) as server:
        yield server


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A models directory with victims beside it and in a fake home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    victims = [tmp_path / "victim.txt", home / "victim.txt"]
    for v in victims:
        v.write_text("keep me\n")
    models = tmp_path / "models"
    (models / "gpuserve-lab--Tiny-Llama-3L").mkdir(parents=True)
    yield models
    for v in victims:
        assert v.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "models", "victim.txt"]
    assert [p.name for p in home.iterdir()] == ["victim.txt"]


def fault(hub, **body):
    lab_control(hub.url, "faults", {"repo": TINY, "times": 100, **body}, timeout=10)


def commit(hub) -> str:
    return lab_control(hub.url, "repos", {}, timeout=10)[TINY]["branches"]["main"]


def fetch(hub, models: Path, **kw):
    c = commit(hub)
    target = str(models / "gpuserve-lab--Tiny-Llama-3L" / c)
    module = fetch_module()
    return module.fetch(TINY, c, target, endpoint=hub.url, token=TOKEN,
                        report=lambda d: None, options=module.FetchOptions(**kw)), target


def where(hub) -> Where:
    return Where("p.yaml:3", "model.hf", "inventory.py", "hf_endpoint", hub.url)


def requests_of(hub) -> list[dict]:
    return lab_control(hub.url, "stats", timeout=10)["requests"]


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("name, problem", [
    ("../../victim.txt", "not a normalised"), ("/abs/victim.txt", "absolute"),
    ("/dev/zero", "absolute"), (".gpuserve-complete.json", "collides"),
    (".cache/gpuserve/x.incomplete", "collides"), ("a\\..\\..\\v", "backslash"),
    ("a\x00b", "control"), ("a\nb", "control"), ("x/./y", "not a normalised"),
    ("x" * 1100, "longer than"), ("", "not a non-empty"),
])
def test_the_path_rule(name, problem):
    assert problem in HUB.path_problem(name)


@pytest.mark.parametrize("entry, words", [
    ({"type": "file", "path": "../../victim.txt", "size": 8, "oid": "0" * 40},
     "'../../victim.txt' is not a normalised"),
    ({"type": "file", "path": "/dev/zero", "size": 8, "oid": "0" * 40}, "is absolute"),
    ({"type": "file", "path": ".gpuserve-complete.json", "size": 2, "oid": "0" * 40},
     "collides"),
    ({"type": "file", "path": "config.json", "size": 2, "oid": "0" * 40}, "listed twice"),
    ({"type": "file", "path": "x.bin", "size": "1e3", "oid": "0" * 40}, "size '1e3'"),
    ({"type": "file", "path": "x.bin", "size": None, "oid": "0" * 40}, "size None"),
    ({"type": "file", "path": "x.bin", "size": -5, "oid": "0" * 40}, "size -5"),
    ({"type": "file", "path": "x.bin", "size": 5}, "oid is not"),
    ({"type": "file", "path": "config.json/x", "size": 5, "oid": "0" * 40},
     "both a file and a folder"),
    ({"type": "symlink", "path": "x", "size": 5, "oid": "0" * 40}, "not a file"),
])
def test_a_hostile_listing_refuses_the_revision_on_both_sides(hub, place, entry, words):
    fault(hub, kind="entries", entries=[entry])
    with pytest.raises(HUB.HubError) as e:
        fetch(hub, place)
    assert words in str(e.value) and e.value.kind == "listing"
    # nothing was staged: the listing is judged before any file is touched
    assert list((place / "gpuserve-lab--Tiny-Llama-3L").iterdir()) == []
    with pytest.raises(InputError) as c:
        read_remote(HfSource(TINY, commit(hub)), where(hub), TOKEN, headers=False)
    assert (c.value.file, c.value.field) == ("inventory.py", "hf_endpoint")
    assert words in c.value.message and "nothing was downloaded" in c.value.message


def test_a_listing_that_changes_between_controller_and_host_is_judged_again(hub, place):
    """The controller saw a clean listing; the host's own (read again, the same rule,
    only for this client's User-Agent) is refused."""
    c = commit(hub)
    read_remote(HfSource(TINY, c), where(hub), None, headers=False)
    fault(hub, kind="entries", ua="gpuserve", times=1,
          entries=[{"type": "file", "path": "../x", "size": 1, "oid": "0" * 40}])
    with pytest.raises(HUB.HubError, match="'../x'"):
        fetch(hub, place)


def test_a_huge_listing_stops_at_the_cap(hub, place):
    fault(hub, kind="many", count=10_001)
    with pytest.raises(HUB.HubError, match="more than 10000 files .*weights_max_files"):
        fetch(hub, place)
    with pytest.raises(HUB.HubError, match="more than 50 files"):
        fetch(hub, place, max_files=50)
    tree_pages = [r for r in requests_of(hub) if r["kind"] == "api"]
    assert len(tree_pages) <= 2 * 12  # at most what the cap lets through, twice


def test_self_pagination_and_pagination_to_another_origin(hub, hub_root, place):
    fault(hub, kind="self_page", times=1)
    with pytest.raises(HUB.HubError, match="repeats a page"):
        fetch(hub, place)
    with HubServer(hub_root, address="127.0.0.2") as other:
        fault(hub, kind="page_to", times=1, location=f"{other.url}/api/models/{TINY}/tree/x")
        with pytest.raises(HUB.HubError, match="another origin"):
            fetch(hub, place)
        assert requests_of(other) == []  # not even a request, let alone the token


def test_the_token_stays_with_the_endpoints_origin_over_a_cdn_redirect(hub, place):
    lab_control(hub.url, "config", {"cdn_host": "localhost"}, timeout=10)
    marker, target = fetch(hub, place)
    reqs = requests_of(hub)
    assert any(r["kind"] == "cdn" for r in reqs)
    assert all(r["auth"] for r in reqs if r["kind"] in ("api", "resolve"))
    assert not any(r["auth"] for r in reqs if r["kind"] == "cdn")  # another origin
    assert fetch_module().verify(target, marker["files"]) == []


def test_a_redirect_to_another_port_of_the_same_host_gets_no_token(hub, hub_root, place):
    c = commit(hub)
    with HubServer(hub_root) as other:  # 127.0.0.1 too, another port: another origin
        fault(hub, kind="redirect", file="config.json",
              location=f"{other.url}/{TINY}/resolve/{c}/config.json")
        marker, target = fetch(hub, place)
        got = [r for r in requests_of(other) if r["file"] == "config.json"]
    assert got and not any(r["auth"] for r in got)
    assert fetch_module().verify(target, marker["files"]) == []


def test_one_line_redacts_and_bounds_server_text():
    text = (f"<html>\n401: Authorization: Bearer {TOKEN}\r\n token={TOKEN[:20]}"
            " hf_AbCdEf123456 \x1b[31m" + "x" * 1000)
    out = HUB.one_line(text, (TOKEN,), 300)
    assert "\n" not in out and "\x1b" not in out and len(out) <= 300
    assert "Sekr3t" not in out and "hf_AbCdEf" not in out and "<redacted>" in out


def test_an_endless_body_is_refused_at_one_byte_over(hub, place):
    fault(hub, kind="endless", file="config.json", after=80 << 20)
    t = time.monotonic()
    with pytest.raises(HUB.HubError, match="sent more than the"):
        fetch(hub, place)
    assert time.monotonic() - t < 30
    c = commit(hub)
    total = sum(f.size for f in read_remote(HfSource(TINY, c), where(hub), None,
                                            headers=False).files)
    assert _bytes_under(place) <= total + 1
    # the controller's read of the same file: capped, never the operator's HF cache
    with pytest.raises(InputError, match="more than the 67,108,864 bytes allowed"):
        read_remote(HfSource(TINY, c), where(hub), None, files=False)


def test_ignoring_range_is_refused_for_a_header_and_restarts_a_download(hub, place):
    fault(hub, kind="ignore_range", file=SHARD1, times=1)
    with pytest.raises(InputError, match="more than the 100,001 (bytes )?allowed"):
        read_remote(HfSource(TINY, commit(hub)), where(hub), None, files=False)
    # a resumed download answered with the whole file starts again from byte 0
    size = next(f.size for f in read_remote(HfSource(TINY, commit(hub)), where(hub), None,
                                            headers=False).files if f.path == SHARD1)
    fault(hub, kind="cut", file=SHARD1, times=1, after=size // 2)
    fault(hub, kind="ignore_range", file=SHARD1, times=1)
    marker, target = fetch(hub, place)
    assert fetch_module().verify(target, marker["files"]) == []


def test_a_drip_stalls_and_the_rerun_resumes(hub, place):
    fault(hub, kind="drip", file="config.json", times=1, interval=0.3)
    t = time.monotonic()
    with pytest.raises(HUB.HubError, match="stalled .*weights_stall_timeout") as e:
        fetch(hub, place, stall=2)
    assert e.value.resumable and time.monotonic() - t < 20
    marker, target = fetch(hub, place, stall=2)  # the drip is gone: done
    assert fetch_module().verify(target, marker["files"]) == []


@pytest.mark.parametrize("command", ["plan", "weights"])
def test_a_drip_at_one_byte_a_second_ends_with_a_clear_error(hub, place, command, capsys,
                                                             monkeypatch):
    """The controller's header read (``gpuserve plan --hf``) and the fetch (``gpuserve
    weights``, the host's code) of a body dripping 1 byte/s: per-read timeouts never
    fire, the stall window (120 s) would; the minimum rate ends it within one rate
    window (shortened here from 30 s to 3 s)."""
    monkeypatch.setattr(HUB, "RATE_WINDOW", 3.0)
    fault(hub, kind="drip", file="config.json", times=1, interval=1.0)
    c = commit(hub)
    argv = ["plan", "--hf", f"{TINY}@{c}", "--gpus", "2xH200", "--tp", "2",
            "--hf-endpoint", hub.url] if command == "plan" else \
        ["weights", "--hf", f"{TINY}@{c}", "--hf-endpoint", hub.url, str(place)]
    err = _cli(argv, capsys, monkeypatch)
    assert "config.json" in err and "hf_endpoint" in err
    found = re.search(r"\b(\d+) bytes in (\d+) s, below 4096 bytes/s \(host data "
                      r"weights_min_rate\)", err)
    assert found, err
    # the decision, not the machine's pace: judged only after a whole rate window, and
    # long before the stall window (120 s) would have ended it
    got, seconds = int(found[1]), int(found[2])
    assert 3 <= seconds < 120 and 0 < got < 4096 * seconds, err


def test_a_listing_that_never_answers_ends_within_the_stall_window(hub, place):
    fault(hub, kind="hang", seconds=30, times=1)
    t = time.monotonic()
    with pytest.raises(HUB.HubError, match="did not answer within 2 s"):
        fetch(hub, place, stall=2)
    assert time.monotonic() - t < 30  # ended by the window, not by the server's answer


def _cli(argv, capsys, monkeypatch) -> str:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    rc = main(argv)
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc != 0 and "gpuserve: error:" in out.err
    assert "Traceback" not in text and TOKEN not in text and "Sekr3t" not in text
    assert len([ln for ln in out.err.splitlines() if "error:" in ln]) == 1
    return out.err


@pytest.mark.parametrize("status", [401, 500])
def test_an_error_page_echoing_the_token_never_shows_it(hub, place, status, capsys,
                                                        monkeypatch):
    fault(hub, kind="echo_auth", status=status)
    c = commit(hub)
    err = _cli(["weights", "--hf", f"{TINY}@{c}", "--hf-endpoint", hub.url, str(place)],
               capsys, monkeypatch)
    assert hub.url in err or "answered" in err or "refused access" in err
    # the host's status line: the same text, redacted by the host script itself
    status_file = place / "status.json"
    rc = fetch_module().main(["run", "--repo", TINY, "--commit", c, "--target",
                              str(place / "gpuserve-lab--Tiny-Llama-3L" / c), "--endpoint",
                              hub.url, "--status", str(status_file)]
                             + ["--token-file", _token_file(place)])
    doc = json.loads(status_file.read_text())
    status_file.unlink()
    (place / "token").unlink()
    assert rc != 0 and doc["state"] == "failed" and "Sekr3t" not in json.dumps(doc)
    assert "\n" not in doc["error"] and len(doc["error"]) <= 400


def _token_file(place: Path) -> str:
    path = place / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_plan_hf_gives_one_error_line_for_each_broken_endpoint(hub, capsys, monkeypatch):
    c = commit(hub)
    base = ["plan", "--hf", f"{TINY}@{c}", "--gpus", "2xH200", "--tp", "2"]
    fault(hub, kind="redirect", file="config.json", location="file:///etc/passwd")
    assert "non-HTTP URL" in _cli(base + ["--hf-endpoint", hub.url], capsys, monkeypatch)
    lab_control(hub.url, "faults/clear", {}, timeout=10)
    fault(hub, kind="status", status=503)
    assert "503" in _cli(base + ["--hf-endpoint", hub.url], capsys, monkeypatch)
    lab_control(hub.url, "faults/clear", {}, timeout=10)
    fault(hub, kind="hang", seconds=40, file="config.json", times=1)
    monkeypatch.setattr(HUB, "READ_TIMEOUT", 2.0)
    assert "did not answer within 2 s" in _cli(base + ["--hf-endpoint", hub.url], capsys,
                                               monkeypatch)
    err = _cli(base + ["--hf-endpoint", f"http://127.0.0.1:{_closed_port()}"], capsys,
               monkeypatch)
    assert "refused the connection" in err and f"{TINY}@{c}" in err
    for bad, words in [("file:///etc", "http(s) URL"), ("http://u:pw@127.0.0.1:1",
                                                        "credentials"),
                       ("http://127.0.0.1:1/\nx", "control")]:
        err = _cli(base + ["--hf-endpoint", bad], capsys, monkeypatch)
        assert words in err and "hf_endpoint" in err and "pw" not in err


def test_a_hung_fetch_is_ended_by_the_next_start(hub, place, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("start drops to the service user: root only")
    run_dir = tmp_path / "models" / "run"
    run_dir.mkdir()
    status = run_dir / "status.json"
    script = str(Path(fetch_module().__file__))
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", script,
                             "--status", str(status)], start_new_session=True)
    (run_dir / "pid").write_text(str(hung.pid))
    status.write_text(json.dumps({"state": "running", "phase": "download",
                                  "progress_at": time.time() - 600, "at": time.time()}))
    c = commit(hub)
    target = str(place / "gpuserve-lab--Tiny-Llama-3L" / c)
    fetch_module().main(["start", "--run-dir", str(run_dir), "--user", "root", "--python",
                         sys.executable, "--hung-after", "60", "--", "run", "--repo", TINY,
                         "--commit", c, "--target", target, "--endpoint", hub.url])
    assert hung.wait(timeout=15) is not None  # ended, not attached to
    t = time.monotonic()
    while not (run_dir / "rc").exists() and time.monotonic() - t < 60:
        time.sleep(0.5)
    assert json.loads(status.read_text())["state"] == "done"
    for name in ("pid", "rc", "status.json", "run.err"):
        (run_dir / name).unlink(missing_ok=True)
    run_dir.rmdir()
