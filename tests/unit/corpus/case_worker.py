"""Run many bad-input corpus cases in one process, one after another (the corpus's child).

Why: a Python start with gpuserve's imports is most of a case's cost (372 cases, 226 s
of process starts on an idle machine); the cases are about the refusal, not the process.
The bounds stay: the parent sets this process's address space limit (RLIMIT_AS, 1 GiB)
and gives each case a wall-clock timeout, killing this worker (and starting another) on
a case that hangs.

Protocol: one JSON line per case on stdin, ``{"cwd", "kind": "cli"|"host_data", "argv"
| "payload"}``; one JSON line back on the stdout this process started with,
``{"code", "output"}``. While a case runs, file descriptors 1 and 2 and ``sys.stdout`` /
``sys.stderr`` go to one file in the case's directory, so whatever the case prints (or a
child process of it) is its output, as in a process of its own. ``cli`` runs
``gpuserve.cli.main(argv)`` (what ``python -m gpuserve`` runs), ``host_data``
:func:`plan_case.main`; an exception that escapes is printed as a traceback, exit 1.

    python tests/unit/corpus/case_worker.py
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[2]), str(HERE)]

from plan_case import main as plan_main  # noqa: E402

from gpuserve.cli import main as cli_main  # noqa: E402


def run(case: dict) -> tuple[int, str]:
    """(exit code, stdout + stderr) of one case, run in ``case["cwd"]``."""
    cwd = case["cwd"]
    log = Path(cwd) / ".case-output"
    env, here = dict(os.environ), os.getcwd()
    saved = os.dup(1), os.dup(2)
    out, err = sys.stdout, sys.stderr
    with log.open("w", encoding="utf-8", errors="replace") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        sys.stdout = sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"),
                                                   encoding="utf-8", errors="replace",
                                                   line_buffering=True)
        try:
            os.chdir(cwd)
            code = _call(case)
        finally:
            sys.stdout.flush()
            sys.stdout.close()
            sys.stdout, sys.stderr = out, err
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            os.chdir(here)
            os.environ.clear()
            os.environ.update(env)
    text = log.read_text(encoding="utf-8", errors="replace")
    log.unlink()
    return code, text


def _call(case: dict) -> int:
    try:
        if case["kind"] == "cli":
            return int(cli_main(case["argv"]) or 0)
        return plan_main(case["payload"])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            return 1
        return int(code or 0)
    except BaseException:  # noqa: BLE001 - what escapes is reported, as a process would
        traceback.print_exc()
        return 1


def serve() -> None:
    """Answer cases from stdin until it closes (a case itself reads /dev/null)."""
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    cases = os.fdopen(os.dup(0), "r", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - the process's own
    for line in cases:
        code, output = run(json.loads(line))
        reply.write(json.dumps({"code": code, "output": output}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()
