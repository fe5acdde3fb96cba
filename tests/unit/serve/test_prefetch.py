"""One batched read instead of one command per fact (roles/base/prefetch.py, roles/base/managed.py),
and the small facts the no-op rerun relies on. The shell parts run in a real local ``sh``
against real files: the batch must give each fact exactly the lines its own command
gives."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.facts.files import FileContents

from gpuserve.host.unit_state import LiveUnit, parse_unit_state, utc_timestamp
from gpuserve.roles.base.managed import (
    DebInstalled,
    PathInfo,
    PathState,
    UnitState,
    parse_path_states,
)
from gpuserve.roles.base.prefetch import Read, _command_text, _Group, batch_script, split_output
from gpuserve.roles.sglang import STAMP, ServiceAccount, VenvVerified, parse_account


def sh(script: str) -> list[str]:
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()


def alone(read: Read) -> list[str]:
    """The fact's own command run on its own (what host.get_fact would see)."""
    return sh(_command_text(read.cls().command(**dict(read.kwargs))))


def test_batch_gives_each_fact_its_own_lines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\n\n  two  \nthree")  # blank line, spaces, no EOL
    (tmp_path / "d").mkdir(mode=0o750)
    reads = [Read.of(PathState, path=str(tmp_path / "a.txt")),
             Read.of(PathState, path=str(tmp_path / "d")),
             Read.of(PathState, path=str(tmp_path / "missing")),
             Read.of(FileContents, path=str(tmp_path / "a.txt")),
             Read.of(FileContents, path=str(tmp_path / "missing"))]
    marker = "##test-marker##"
    results = split_output(sh(batch_script(reads, marker)), marker, len(reads))
    for read, result in zip(reads, results, strict=True):
        assert result is not None
        status, lines = result
        assert status == 0
        assert lines == alone(read), read
    assert results[3][1] == ["one", "", "  two  ", "three"]


def test_failing_read_reports_its_status_and_the_rest_go_on() -> None:
    class Fails(PathState):
        def command(self, path: str) -> str:
            return "echo partial; exit 3"

    reads = [Read.of(Fails, path="/x"), Read.of(PathState, path="/")]
    marker = "##m##"
    results = split_output(sh(batch_script(reads, marker)), marker, 2)
    assert results[0] == (3, ["partial"])
    assert results[1][0] == 0 and PathState().process(results[1][1]).kind == "dir"


class Slow(PathState):
    """A read that takes a while and prints when it ends, and leaves a mark of its end."""

    def command(self, path: str) -> str:
        return f"sleep 0.6; echo slow; date +%s.%N >> {path}"


class Quick(PathState):
    def command(self, path: str) -> str:
        return f"echo quick; date +%s.%N >> {path}"


def test_reads_run_at_the_same_time_and_print_in_order(tmp_path: Path) -> None:
    """A batch costs its slowest read, not the sum, and each read's lines stay
    its own, in the order given."""
    ends = tmp_path / "ends"
    reads = [Read.of(Slow, path=str(ends)), Read.of(Slow, path=str(ends)),
             Read.of(Quick, path=str(ends))]
    results = split_output(sh(batch_script(reads, "##m##")), "##m##", 3)
    assert results == [(0, ["slow"]), (0, ["slow"]), (0, ["quick"])]
    slow_ends = sorted(float(t) for t in ends.read_text().split())[1:]  # the quick one first
    assert slow_ends[1] - slow_ends[0] < 0.4  # one after the other: 0.6 s apart
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("tmp.*/2"))


def test_without_a_temporary_directory_the_reads_run_in_turn(tmp_path: Path) -> None:
    """``mktemp -d`` failing (a full or read-only /tmp): the same output, one read after
    the other."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "mktemp").write_text("#!/bin/sh\nexit 1\n")
    (stub / "mktemp").chmod(0o755)
    ends = tmp_path / "ends"
    reads = [Read.of(Slow, path=str(ends)), Read.of(Slow, path=str(ends)),
             Read.of(PathState, path=str(tmp_path))]
    script = f"PATH={stub}:$PATH\n" + batch_script(reads, "##m##")
    results = split_output(sh(script), "##m##", 3)
    assert results[:2] == [(0, ["slow"]), (0, ["slow"])]
    assert results[2] is not None and PathState().process(results[2][1]).kind == "dir"
    first, last = (float(t) for t in ends.read_text().split())
    assert last - first >= 0.5


def test_no_output_is_the_fact_default_as_in_pyinfra(monkeypatch) -> None:
    """pyinfra's File fact has no output for a missing path and cannot process []."""
    from pyinfra.facts.files import File

    import gpuserve.roles.base.prefetch as prefetch_mod

    class FakeHost:
        name = "h"

        @staticmethod
        def get_fact(cls, script):
            marker = script.split('echo "', 1)[1].split(" ", 1)[0]
            return sh(script.replace(marker, marker))

    monkeypatch.setattr(prefetch_mod, "host", FakeHost)
    prefetch_mod.prefetch([Read.of(File, path="/nonexistent/gpuserve-test")])
    assert prefetch_mod.fact(File, path="/nonexistent/gpuserve-test") is None
    prefetch_mod.forget()


def test_deferred_reads_join_the_next_batch(monkeypatch, tmp_path: Path) -> None:
    """defer() runs nothing; the next prefetch runs the deferred reads in its one
    command, with its own reads."""
    import gpuserve.roles.base.prefetch as prefetch_mod

    (tmp_path / "later").write_text("deferred")
    scripts: list[str] = []

    class FakeHost:
        name = "h-defer"

        @staticmethod
        def get_fact(cls, script):
            scripts.append(script)
            return sh(script)

    monkeypatch.setattr(prefetch_mod, "host", FakeHost)
    later = Read.of(FileContents, path=str(tmp_path / "later"))
    now = Read.of(PathState, path=str(tmp_path))
    prefetch_mod.defer([later])
    assert scripts == []
    prefetch_mod.prefetch([now])
    assert len(scripts) == 1
    assert prefetch_mod.fact(FileContents, path=str(tmp_path / "later")) == ["deferred"]
    assert prefetch_mod.fact(PathState, path=str(tmp_path)).kind == "dir"
    assert len(scripts) == 1  # both came from the one batch
    prefetch_mod.prefetch([])  # nothing pending: no command
    assert len(scripts) == 1
    prefetch_mod.forget()


JOB = "##gpuserve-job_batch##"  # in_parallel's frame of the batch's jobs


def test_missing_marker_leaves_the_read_unknown() -> None:
    lines = [f"{JOB} 0 begin", "x", "##m## 0 0", f"{JOB} 0 end", f"{JOB} 1 begin", "y",
             f"{JOB} 1 end"]
    assert split_output(lines, "##m##", 2) == [(0, ["x"]), None]


def test_a_read_cut_short_is_unknown_and_never_lends_lines_to_the_next() -> None:
    """A job whose file was cut short (a full /tmp: no end line) is dropped whole; its
    lines never pass for the next read's, even when the cut falls mid-line and the next
    job's first line is glued onto it (review of the side-by-side batch)."""
    cut = [f"{JOB} 0 begin", '{"cache":"hit","files":[1,2', f"{JOB} 1 begin", "Mtime=1 /x",
           "##m## 1 0", f"{JOB} 1 end"]
    assert split_output(cut, "##m##", 2) == [None, (0, ["Mtime=1 /x"])]
    glued = [f"{JOB} 0 begin", f'{{"cache":"hi{JOB} 1 begin', "Mtime=1 /x", "##m## 1 0",
             f"{JOB} 1 end"]
    assert split_output(glued, "##m##", 2) == [None, None]


def test_path_state_of_real_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"payload")
    os.chmod(f, 0o640)
    (tmp_path / "link").symlink_to(f)
    state = PathState().process(alone(Read.of(PathState, path=str(f))))
    assert state.kind == "file" and state.mode == 0o640
    assert state.sha1 == hashlib.sha1(b"payload").hexdigest()
    assert PathState().process(alone(Read.of(PathState, path=str(tmp_path / "link")))) \
        == PathInfo("link")
    assert PathState().process(alone(Read.of(PathState, path=str(tmp_path / "no")))) \
        == PathInfo("absent")
    # a name with spaces and quotes stays one path
    odd = tmp_path / "it's a file"
    odd.write_text("x")
    assert PathState().process(alone(Read.of(PathState, path=str(odd)))).kind == "file"


def test_many_paths_in_one_stat_and_one_sha1sum(tmp_path: Path) -> None:
    """The grouped read (what the prefetch runs) equals each path read alone."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "empty").write_text("")
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "f")
    names = ["f", "empty", "d", "l", "absent", "it's odd"]
    (tmp_path / "it's odd").write_text("y")
    kwargs = [{"path": str(tmp_path / n)} for n in names]
    grouped = PathState.group_process(kwargs, sh(PathState.group_command(kwargs)))
    alone_each = [PathState().process(alone(Read.of(PathState, **k))) for k in kwargs]
    assert grouped == alone_each
    assert [g.kind for g in grouped] == ["file", "file", "dir", "link", "absent", "file"]
    assert grouped[1].sha1 == hashlib.sha1(b"").hexdigest()


@pytest.mark.parametrize("lines", [["stat 7z9 root root directory|/p"],
                                   ["stat 644 root root regular file|/p"],  # no sha1
                                   ["stat 644 root root fifo|/p"]])
def test_unreadable_path_state_is_never_a_match(lines: list[str]) -> None:
    assert parse_path_states(lines)["/p"].kind == "other"


# systemctl show (systemd 252, Debian 12) and the time lines UnitState adds, as printed
# on the lab host for the serve unit
SHOW = ["ActiveState=active", "UnitFileState=enabled", "NeedDaemonReload=no"]


def test_unit_started_after_its_files_is_converged() -> None:
    live = parse_unit_state([*SHOW, "Started=1796102344.394563000",
                             "Mtime=1796073608.044000000 /etc/gpuserve/sglang.env"])
    assert live.converged and not live.stale


def test_file_written_after_the_start_makes_the_unit_stale() -> None:
    live = parse_unit_state([*SHOW, "Started=1796102344.394563000",
                             "Mtime=1796102344.500000000 /etc/gpuserve/sglang.env"])
    assert live.stale and not live.converged
    assert live.newer == ("/etc/gpuserve/sglang.env",)


def test_whole_second_start_needs_a_full_second_to_call_a_file_newer() -> None:
    # systemd without --timestamp=us+utc: the start is only known to the second
    same_second = parse_unit_state([*SHOW, "Started=1796102344.000000000",
                                    "Mtime=1796102344.900000000 /u"])
    assert not same_second.stale
    later = parse_unit_state([*SHOW, "Started=1796102344.000000000",
                              "Mtime=1796102345.100000000 /u"])
    assert later.stale


# systemctl show --timestamp=us+utc -p ... -p ExecMainStartTimestamp, systemd 252 (Debian
# 12, the lab host), as UnitState now reads it in one systemctl run
SHOW_US = [*SHOW, "ExecMainStartTimestamp=Wed 2026-12-02 00:59:34.394563 UTC"]


def test_start_time_read_from_systemctl_with_microseconds() -> None:
    before = parse_unit_state([*SHOW_US, "Mtime=1796173174.300000000 /etc/gpuserve/sglang.env"])
    assert before.converged
    after = parse_unit_state([*SHOW_US, "Mtime=1796173174.400000000 /etc/gpuserve/sglang.env"])
    assert after.newer == ("/etc/gpuserve/sglang.env",)


@pytest.mark.parametrize("stamp", ["", "n/a", "Wed 2026-12-02 00:59:34 CET"])
def test_a_start_time_in_no_known_form_never_restarts(stamp: str) -> None:
    """Never started, or a form this cannot read: no file counts as newer (a rerun must
    never restart a model server on a guess)."""
    live = parse_unit_state([*SHOW, f"ExecMainStartTimestamp={stamp}", "Mtime=1900000000.0 /u"])
    assert live.newer == () and live.converged


def test_the_weekday_in_the_hosts_locale_does_not_matter() -> None:
    assert utc_timestamp("Mi 2026-12-02 00:59:34.394563 UTC") == \
        utc_timestamp("Wed 2026-12-02 00:59:34.394563 UTC") == 1796173174.394563


@pytest.mark.parametrize("lines", [
    ["ActiveState=inactive", "UnitFileState=enabled", "NeedDaemonReload=no"],
    ["ActiveState=active", "UnitFileState=disabled", "NeedDaemonReload=no"],
    ["ActiveState=active", "UnitFileState=enabled", "NeedDaemonReload=yes"],
    [],
])
def test_not_converged(lines: list[str]) -> None:
    assert not parse_unit_state(lines).converged


def test_unit_state_command_on_a_unit_systemd_does_not_know(tmp_path: Path) -> None:
    """Runs the real command here (no systemd in a container: systemctl fails or is
    absent); the fact must still parse to 'not converged', never raise."""
    cmd = UnitState().command("gpuserve-test-absent.service", (str(tmp_path / "x"),))
    assert parse_unit_state(sh(cmd)) != LiveUnit(active="active", enabled="enabled")


def test_service_account_from_getent_lines() -> None:
    ours = parse_account(["passwd=sglang:x:999:997:gpuserve service account:"
                          "/opt/gpuserve/cache:/usr/sbin/nologin",
                          "group=sglang:x:997:", "primary=sglang"])
    assert ours == {"entry": {"uid": "999", "comment": "gpuserve service account",
                              "home": "/opt/gpuserve/cache", "shell": "/usr/sbin/nologin",
                              "group": "sglang"}, "group_exists": True}
    assert parse_account([]) == {"entry": None, "group_exists": False}


def test_service_account_command_reads_root_here() -> None:
    doc = parse_account(sh(ServiceAccount().command("root")))
    assert doc["entry"]["uid"] == "0" and doc["group_exists"]


def test_deb_installed() -> None:
    # dpkg-query -W -f='${Package} ${Status}\n' on Debian 12 (multi-arch names carry :arch)
    lines = ["python3-venv install ok installed", "curl deinstall ok config-files",
             "libc6:amd64 install ok installed"]
    assert DebInstalled().process(lines[:1])
    assert not DebInstalled().process(lines[1:2])
    assert not DebInstalled().process([])
    kwargs = [{"package": p} for p in ("python3-venv", "curl", "libc6", "absent")]
    assert DebInstalled.group_process(kwargs, lines) == [True, False, True, False]
    assert "dpkg-query -W -f='${Package} ${Status}\\n' python3-venv curl libc6 absent" in \
        DebInstalled.group_command(kwargs)


def test_write_changed_writes_only_the_files_that_differ(monkeypatch) -> None:
    """managed.write_changed (nccl.env/host.json, measured.json): one command per file
    whose prefetched state differs, none for one that matches; returns whether any."""
    from gpuserve.roles.base import managed

    same = managed.PathInfo("file", 0o644, "root", "root", managed.sha1("kept\n"))
    states = {"/etc/gpuserve/a": same, "/etc/gpuserve/b": managed.PathInfo("absent"),
              "/etc/gpuserve/c": managed.PathInfo("file", 0o600, "root", "root",
                                                  managed.sha1("mode\n"))}
    monkeypatch.setattr(managed, "fact_if_unchanged", lambda cls, path: states[path])

    def run(files):
        gen, cmds = managed.write_changed(files), []
        while True:
            try:
                cmds.append(str(next(gen)))
            except StopIteration as stop:
                return stop.value, cmds

    changed, cmds = run([("/etc/gpuserve/a", "kept\n"), ("/etc/gpuserve/b", "fresh-contents\n"),
                         ("/etc/gpuserve/c", "mode\n")])
    assert changed is True and len(cmds) == 2
    assert "/etc/gpuserve/b" in cmds[0] and "/etc/gpuserve/c" in cmds[1]
    assert all("fresh-contents" not in c for c in cmds)  # contents go on stdin
    assert run([("/etc/gpuserve/a", "kept\n")]) == (False, [])


def test_venv_stamps_of_many_venvs_in_one_read(tmp_path: Path) -> None:
    """The deploy reads every candidate lock's venv stamp in its first batch: grouped,
    with shell builtins only, each value exactly what the fact alone gives."""
    done, bare, empty = tmp_path / "done", tmp_path / "bare", tmp_path / "empty"
    for venv in (done, bare, empty):
        venv.mkdir()
    (done / STAMP).write_text("sha256:abc123\nverified 2026-12-02\n")
    (empty / STAMP).write_text("")
    venvs = [str(done), str(bare), str(empty), str(tmp_path / "missing"), "/a b/it's"]
    reads = [Read.of(VenvVerified, venv=v) for v in venvs]
    results = split_output(sh(batch_script(
        [Read.of(_Group, fact_cls=VenvVerified, reads=tuple(reads))], "##m##")), "##m##", 1)
    grouped = VenvVerified.group_process([dict(r.kwargs) for r in reads], results[0][1])
    assert grouped == ["sha256:abc123", None, None, None, None]
    assert grouped == [VenvVerified().process(alone(r)) for r in reads]


def test_a_document_section_cut_short_is_absent_not_shorter() -> None:
    """The doctor's nvidia-smi runs write side by side; a GPU table cut short (3 of 8
    rows on a full /tmp) must not pass for a 3-GPU host: the section is absent."""
    from gpuserve.facts.document import HostFactsDocument
    from gpuserve.parsers.sections import marker

    job = "##gpuserve-job_doc##"
    row = ("{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 00000000:0{i}:00.0, "
           "97887, 0, 580.126.20, 12.0, Enabled")
    lines = [f"{job} 0 begin", marker("gpus"), *(row.format(i=i) for i in range(3)),
             f"{job} 4 begin", marker("hostname"), "lab-gpu", f"{job} 4 end"]
    doc = HostFactsDocument().process(lines)
    assert doc["gpus"] == [] and doc["hostname"] == "lab-gpu"
    whole = [f"{job} 0 begin", marker("gpus"), *(row.format(i=i) for i in range(8)),
             f"{job} 0 end"]
    assert len(HostFactsDocument().process(whole)["gpus"]) == 8


@pytest.mark.parametrize(("mode", "stamp", "want"), [
    # systemd >= 251 (Debian 12's 252: the lab host): microseconds, UTC
    ("us", "Wed 2026-12-02 00:59:34.394563 UTC", 1796173174.394563),
    # systemd 248-250 (Ubuntu 22.04's 249) accept --timestamp= but ignore it for show
    ("ignored", "Wed 2026-12-02 01:59:34 CET", 1796173174.0),
    # systemd < 248 refuse --timestamp=: the plain show
    ("refused", "Wed 2026-12-02 00:59:34 UTC", 1796173174.0),
])
def test_unit_start_time_from_every_systemd(tmp_path: Path, mode, stamp, want) -> None:
    """The real UnitState command against a systemctl that answers as each systemd
    generation does (review: v248-v250 print local time to the second even with
    --timestamp=us+utc, which must not lose the start time)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "systemctl").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--timestamp=*) [ {mode} = refused ] && exit 1 ;; esac\n'
        "printf 'ActiveState=active\\nExecMainStartTimestamp=%s\\nUnitFileState=enabled\\n"
        f"NeedDaemonReload=no\\n' '{stamp}'\n")
    (stub / "systemctl").chmod(0o755)
    conf = tmp_path / "sglang.env"
    conf.write_text("X=1\n")
    os.utime(conf, (want + 0.5, want + 0.5))  # half a second after the start
    cmd = UnitState().command("gpuserve-sglang.service", (str(conf),))
    lines = sh(f"PATH={stub}:$PATH; TZ=UTC; export TZ\n{cmd}")
    live = parse_unit_state(lines)
    assert live.active == "active" and live.enabled == "enabled"
    started = [line for line in lines if line.startswith("Started=")]
    if mode == "us":
        assert not started and live.stale  # to the microsecond: 0.5 s later is newer
    else:
        assert started and not live.stale  # to the second: 0.5 s later is not yet newer
        os.utime(conf, (want + 1.5, want + 1.5))
        assert parse_unit_state(sh(f"PATH={stub}:$PATH; TZ=UTC; export TZ\n{cmd}")).stale


@pytest.mark.parametrize("text", ["one line\n", "no newline at the end", "",
                                  "  leading and trailing  \n\\backslash\\n\tand tab\n\n\nlast\n"])
def test_print_file_prints_what_cat_prints(tmp_path: Path, text: str) -> None:
    """The first batch prints small files with builtins (a process costs 70-90 ms under
    TCG); a line is a line either way, the last one with or without its newline."""
    from gpuserve.facts.base import print_file

    path = tmp_path / "f"
    path.write_text(text)
    done = subprocess.run(["sh", "-c", print_file(str(path))], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.splitlines() == text.splitlines()


def test_print_file_of_a_missing_file_fails_quietly(tmp_path: Path) -> None:
    from gpuserve.facts.base import print_file

    done = subprocess.run(["sh", "-c", print_file(str(tmp_path / "absent"))],
                          capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == "" and done.stderr == ""


def test_print_file_of_a_directory_fails_as_cat_does(tmp_path: Path) -> None:
    from gpuserve.facts.base import print_file

    done = subprocess.run(["sh", "-c", print_file(str(tmp_path))], capture_output=True,
                          text=True)
    assert done.returncode != 0 and done.stdout == ""


def test_prune_state_reads_units_and_venvs_in_one_command(tmp_path: Path) -> None:
    """The prune decides from one read (after a change, one fresh command, not two): the
    units' ExecStart lines and the venv listing, each kind parsed as before."""
    from gpuserve.launch.venvs import parse_listing, referenced_venvs, venvs_to_prune
    from gpuserve.roles.sglang import PruneState

    home = tmp_path / "home"
    venvs = {name: home / "venvs" / name for name in ("0.5.1-aaa", "0.5.2-bbb", "0.5.3-ccc",
                                                       "0.5.4-ddd")}
    for i, (name, venv) in enumerate(venvs.items()):
        venv.mkdir(parents=True)
        if name != "0.5.4-ddd":  # an unverified leftover
            (venv / STAMP).write_text("hash\n")
        os.utime(venv, (1_700_000_000 + i, 1_700_000_000 + i))
    live, saved = tmp_path / "live.service", tmp_path / "last-good-unit"
    live.write_text(f"[Service]\nExecStart={venvs['0.5.1-aaa']}/bin/python -m sglang\n")
    saved.write_text(f"# ExecStart={venvs['0.5.2-bbb']} (a comment names nothing)\n"
                     f"  ExecStart = {venvs['0.5.2-bbb']}/bin/python -m sglang\n")
    fact = PruneState()
    paths = (str(live), str(saved), str(tmp_path / "absent-unit"))
    seen = fact.process(sh(fact.command(home=str(home), paths=paths)))
    assert seen["units"] == [f"ExecStart={venvs['0.5.1-aaa']}/bin/python -m sglang",
                             f"  ExecStart = {venvs['0.5.2-bbb']}/bin/python -m sglang"]
    assert sorted(e.path for e in parse_listing(seen["listing"], str(home))) == sorted(
        str(v) for v in venvs.values())
    named = referenced_venvs(seen["units"], str(home))
    assert named == {str(venvs["0.5.1-aaa"]), str(venvs["0.5.2-bbb"])}
    # keep 3: both named ones and the newest verified (0.5.3); the unverified one goes
    assert venvs_to_prune(parse_listing(seen["listing"], str(home)), named, 3) == [
        str(venvs["0.5.4-ddd"])]
    # no venvs, no units: nothing, and the command still succeeds
    empty = subprocess.run(["sh", "-c", fact.command(home=str(tmp_path / "none"),
                                                     paths=(str(tmp_path / "x"),))],
                           capture_output=True, text=True, timeout=30)
    assert empty.returncode == 0 and fact.process(empty.stdout.splitlines()) == {
        "units": [], "listing": []}
