"""The bad-input corpus: every case is refused cleanly, bounded in time and memory.

Cases are data (tests/fixtures/corpus/*.yaml, format in its README.md). Each runs in a
child process, the real CLI (``python -m gpuserve ...``) for CLI inputs or
tests/unit/corpus/plan_case.py for host data, under a wall-clock timeout and an address
space limit, and must exit with the expected code, name the file and the field in its
message, and print no traceback. The corpus writes only under pytest's tmp_path, so a
case cannot change a host.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CASES_DIR = REPO / "tests" / "fixtures" / "corpus"
TIMEOUT_S = 20
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


def write_input(case: dict[str, Any], tmp: Path) -> Path | None:
    """The case's input file under ``tmp``: ``text`` (UTF-8, ``{repo}`` expanded),
    ``raw`` (each character one byte, for non-UTF-8), or ``repeat`` (``head`` +
    ``body`` x ``times`` + ``tail``, for huge or deep documents)."""
    name = case.get("name", "input.yaml")
    path = tmp / name
    if "text" in case:
        path.write_text(case["text"].replace("{repo}", str(REPO)), encoding="utf-8")
    elif "raw" in case:
        path.write_bytes(case["raw"].replace("{repo}", str(REPO)).encode("latin-1"))
    elif "repeat" in case:
        r = case["repeat"]
        text = r.get("head", "") + r["body"] * r["times"] + r.get("tail", "")
        path.write_text(text.replace("{repo}", str(REPO)), encoding="utf-8")
    else:
        return None
    return path


def run_case(case: dict[str, Any], tmp: Path) -> tuple[int, str]:
    path = write_input(case, tmp)
    subst = {"{input}": str(path), "{tmp}": str(tmp), "{repo}": str(REPO)}
    if case.get("kind", "cli") == "cli":
        argv = [sys.executable, "-m", "gpuserve"]
        for arg in case["argv"]:
            for key, value in subst.items():
                arg = arg.replace(key, value)
            argv.append(arg)
    else:
        payload = {"data": case["data"], "host_json": case.get("host_json")}
        if "host_json" in case and path is not None:
            payload["host_json"] = path.read_text(encoding="utf-8")
        argv = [sys.executable, str(REPO / "tests/unit/corpus/plan_case.py"),
                json.dumps(payload)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True,
                          errors="replace", timeout=TIMEOUT_S, preexec_fn=_limit_memory,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_is_refused_cleanly(case: dict[str, Any], tmp_path: Path) -> None:
    code, output = run_case(case, tmp_path)
    assert "Traceback" not in output, output[-3000:]
    assert code == case.get("exit", 2), output[-3000:]
    file = case.get("file", "{input}")
    if file:
        name = case.get("name", "input.yaml")
        file = file.replace("{input}", str(tmp_path / name)).replace("{repo}", str(REPO))
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
