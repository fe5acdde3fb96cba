"""The bad-input corpus: every case is refused cleanly, bounded in time and memory.

Cases are data (tests/fixtures/corpus/*.yaml, format in its README.md). Each runs in a
child process, the real CLI's entry point (``gpuserve.cli.main``, what ``python -m
gpuserve`` runs) for CLI inputs or tests/unit/corpus/plan_case.py for host data, under a
wall-clock timeout and an address space limit, and must exit with the expected code,
name the file and the field in its message, and print no traceback and no raw terminal
escape. The child is one worker for many cases (tests/unit/corpus/case_worker.py: a
Python start with gpuserve's imports was most of each case's cost), restarted after a
case that times out; ``GPUSERVE_CORPUS_PROCESS=1`` runs each case in a process of its
own instead (``python -m gpuserve``). The corpus writes only under pytest's tmp_path,
so a case cannot change a host.
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CASES_DIR = REPO / "tests" / "fixtures" / "corpus"
#: a case's own CPU seconds at most (the slowest take about 15 on an idle machine): a bound
#: the machine's load cannot flip, since the unit tier runs niced beside the lab tiers
CPU_LIMIT_S = 60
#: a hang that spends no CPU (a blocked read) ends here; wall time, far beyond what the
#: slowest case took niced beside four busy loops (about 15 CPU s at a twentieth of a core)
TIMEOUT_S = 900
MEMORY_BYTES = 1024 * 1024 * 1024  # 1 GiB of address space: a billion laughs would need more


def load_cases() -> list[dict[str, Any]]:
    cases = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        for case in yaml.safe_load(path.read_text(encoding="utf-8"))["cases"]:
            case["_from"] = path.name
            cases.append(case)
    return cases


CASES = load_cases()


def _limit_memory() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def _limit_memory_and_cpu() -> None:  # a process per case: the CPU bound as an rlimit
    _limit_memory()
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


def _cpu_seconds(pid: int) -> float:
    """The process's CPU seconds so far (user + system, /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def expand(text: str, tmp: Path) -> str:
    return text.replace("{repo}", str(REPO)).replace("{tmp}", str(tmp))


def write_input(case: dict[str, Any], tmp: Path) -> Path | None:
    """The case's input file under ``tmp``: ``text`` (UTF-8, ``{repo}`` and ``{tmp}``
    expanded), ``raw`` (each character one byte, for non-UTF-8), or ``repeat`` (``head``
    + ``body`` x ``times`` + ``tail``, for huge or deep documents), or ``fifo: true`` (a
    FIFO nobody writes), or ``special``: ``fifo``, ``device`` (a symlink to /dev/zero,
    which never ends) or ``directory`` in place of a file. A ``lock`` is written too
    (:func:`write_lock`), and ``mkdir`` makes a directory."""
    if "lock" in case:
        write_lock(case["lock"], tmp)
    if "mkdir" in case:
        (tmp / case["mkdir"]).mkdir()
    name = case.get("name", "input.yaml")
    path = tmp / name
    special = case.get("special") or ("fifo" if case.get("fifo") else None)
    if special == "fifo":  # a FIFO no process writes to: reading must not wait forever
        os.mkfifo(path)
    elif special == "device":
        path.symlink_to("/dev/zero")
    elif special == "directory":
        path.mkdir()
    elif "text" in case:
        path.write_text(expand(case["text"], tmp), encoding="utf-8")
    elif "raw" in case:
        path.write_bytes(expand(case["raw"], tmp).encode("latin-1"))
    elif "repeat" in case:
        path.write_text(expand(repeat(case["repeat"]), tmp), encoding="utf-8")
    else:
        return None
    return path


def repeat(r: dict[str, Any]) -> str:
    return r.get("head", "") + r["body"] * r["times"] + r.get("tail", "")


LOCKS = REPO / "gpuserve" / "data" / "locks"


def _walk(doc: Any, dotted: str) -> tuple[Any, Any]:
    """(container, key) of ``a.b[2].c`` in ``doc``."""
    steps: list[Any] = []
    for part in dotted.split("."):
        name, _, rest = part.partition("[")
        if name:
            steps.append(name)
        steps += [int(i) for i in rest.rstrip("]").split("][") if i] if rest else []
    for step in steps[:-1]:
        doc = doc[step]
    return doc, steps[-1]


def write_lock(spec: dict[str, Any], tmp: Path) -> Path:
    """``{tmp}/locks/<name>``: the committed lock ``from`` (default the newest py312 one)
    with ``set`` (dotted path: value), ``delete`` (dotted paths), ``duplicate`` (a
    dotted path to a package, appended again) and ``replace`` ([old, new] on the JSON
    text) applied; or ``text`` / ``repeat`` as is."""
    source = spec.get("from", "sglang-0.5.23-cu13-py312.json")
    path = tmp / "locks" / spec.get("name", source)
    path.parent.mkdir(exist_ok=True)
    if "text" in spec:
        path.write_text(spec["text"], encoding="utf-8")
        return path
    if "repeat" in spec:
        path.write_text(repeat(spec["repeat"]), encoding="utf-8")
        return path
    doc = json.loads((LOCKS / source).read_text(encoding="utf-8"))
    for dotted, value in spec.get("set", {}).items():
        container, key = _walk(doc, dotted)
        container[key] = value
    for dotted in spec.get("delete", []):
        container, key = _walk(doc, dotted)
        del container[key]
    for dotted in spec.get("duplicate", []):
        container, key = _walk(doc, dotted)
        doc["packages"].append(dict(container[key]))
    text = json.dumps(doc, indent=1)
    for old, new in spec.get("replace", []):  # what json.dumps cannot write (1e400)
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text, encoding="utf-8")
    return path


def run_case(case: dict[str, Any], tmp: Path, worker: Worker | None = None
             ) -> tuple[int, str]:
    """(exit code, output) of ``case`` run in ``tmp``: by ``worker``, or, without one, in
    a process of its own."""
    path = write_input(case, tmp)
    subst = {"{input}": str(path), "{tmp}": str(tmp), "{repo}": str(REPO)}
    if case.get("kind", "cli") == "cli":
        args = []
        for arg in case["argv"]:
            for key, value in subst.items():
                arg = arg.replace(key, value)
            args.append(arg)
        message = {"kind": "cli", "argv": args}
        argv = [sys.executable, "-m", "gpuserve", *args]
    else:
        payload = {"data": _substitute(case["data"], subst),
                   "host_json": case.get("host_json"), "host_facts": case.get("host_facts")}
        if "host_json" in case and path is not None:
            payload["host_json"] = path.read_text(encoding="utf-8")
        message = {"kind": "host_data", "payload": payload}
        argv = [sys.executable, str(REPO / "tests/unit/corpus/plan_case.py"),
                json.dumps(payload)]
    if worker is not None:
        return worker.run({**message, "cwd": str(tmp)})
    proc = subprocess.run(argv, cwd=tmp, env=_env(), capture_output=True, text=True,
                          errors="replace", timeout=TIMEOUT_S,
                          preexec_fn=_limit_memory_and_cpu,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


class Worker:
    """tests/unit/corpus/case_worker.py: cases one after another in one child process
    (its address space limited as each case's was), each within :data:`CPU_LIMIT_S` of
    the child's CPU and :data:`TIMEOUT_S` of wall time; a case that passes either kills
    the child (the next case starts another) and fails."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.bound: float = TIMEOUT_S

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, str(REPO / "tests/unit/corpus/case_worker.py")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=_env(), text=True, preexec_fn=_limit_memory)
        return self.proc

    def run(self, message: dict[str, Any]) -> tuple[int, str]:
        proc = self._start()
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        line = self._answer(proc)
        if not line:
            died = proc.poll()
            self.close()
            if died is not None:  # killed (the memory limit, a signal): as a process would
                return died, f"the case worker exited with {died}"
            raise subprocess.TimeoutExpired(message.get("argv") or "plan_case", self.bound)
        answer = json.loads(line)
        return answer["code"], answer["output"]

    def _answer(self, proc: subprocess.Popen) -> str:
        """The case's answer line; "" once the child exits or passes a bound (which one:
        ``self.bound``, in seconds)."""
        spent = _cpu_seconds(proc.pid)
        deadline = time.monotonic() + TIMEOUT_S
        self.bound = TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                return proc.stdout.readline()
            if _cpu_seconds(proc.pid) - spent > CPU_LIMIT_S:
                self.bound = CPU_LIMIT_S
                break
        return ""

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def worker():
    """One case worker for the module (None: a process per case, as the env asks)."""
    if os.environ.get("GPUSERVE_CORPUS_PROCESS") == "1":
        yield None
        return
    each = Worker()
    yield each
    each.close()


def _substitute(data: Any, subst: dict[str, str]) -> Any:
    """Host data with ``{input}``, ``{tmp}`` and ``{repo}`` expanded in its strings (a
    profile written as the case's input, ``profile: '{input}'``)."""
    if isinstance(data, dict):
        return {k: _substitute(v, subst) for k, v in data.items()}
    if isinstance(data, list):
        return [_substitute(v, subst) for v in data]
    if isinstance(data, str):
        for key, value in subst.items():
            data = data.replace(key, value)
    return data


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_is_refused_cleanly(case: dict[str, Any], tmp_path: Path, worker) -> None:
    code, output = run_case(case, tmp_path, worker)
    assert "Traceback" not in output, output[-3000:]
    assert "\x1b" not in output, "a raw ESC reached the terminal (gpuserve.terminal)"
    assert code == case.get("exit", 2), output[-3000:]
    file = case.get("file", "{input}")
    if file:
        name = case.get("name", "input.yaml")
        file = expand(file.replace("{input}", str(tmp_path / name)), tmp_path)
        assert file in output, output[-3000:]
    field = case.get("field")
    if field:
        assert f": {field}" in output or f"argument {field}" in output, output[-3000:]
    for words in case.get("says", []):
        assert words in output, output[-3000:]


def test_corpus_ids_are_unique_and_every_case_names_what_it_covers() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert case.get("kind", "cli") in ("cli", "host_data"), case["id"]
        assert case.get("field") or case.get("says"), f"{case['id']}: name a field or words"


LOCK_CASES = [c for c in CASES if "lock" in c]


@pytest.mark.parametrize("case", LOCK_CASES, ids=[c["id"] for c in LOCK_CASES])
def test_check_and_the_serve_deploy_refuse_the_same_locks(case: dict[str, Any], tmp_path: Path,
                                                          monkeypatch) -> None:
    """Every lock the corpus refuses through ``gpuserve check`` is refused by the serve
    deploy's prepare step (roles/deploys/serve.plan_and_read) too, with the same error,
    before its first read of the host: both go through plans.serve.read_input."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    import gpuserve.roles.deploys.serve as deploy
    from gpuserve.commands.check import check_host
    from gpuserve.errors import InputError

    write_lock(case["lock"], tmp_path)
    data = {"profile": "glm5-nvfp4-tp8", "sglang_locks_dir": str(tmp_path / "locks")}
    checked = check_host("gpu1", data, "inv.py", "serve")
    assert not checked.ok and checked.error is not None
    lock_file = expand(case["file"], tmp_path)
    assert lock_file in checked.error, checked.error
    reads: list[list] = []
    monkeypatch.setattr(deploy, "prefetch", reads.append)
    inv = Inventory((["gpu1"], data))
    state = State(inv, Config())
    with ctx_state.use(state), ctx_host.use(inv.get_host("gpu1")), \
            pytest.raises(InputError) as refused:
        deploy.plan_and_read()
    assert str(refused.value) == checked.error
    assert reads == []  # refused before the first batch of host reads
