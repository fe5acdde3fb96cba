"""The command blocks of README.md, docs/getting-started.md, docs/metrics.md and
docs/deploys.md as tests/lab/test_docs_run.py sees them (lab/doc_blocks.py): every block
the lab runs uses the lab's inventories, every block on a real host is marked, every
"run by" names a test that exists, and the markers read as written."""

from __future__ import annotations

from pathlib import Path

from lab.doc_blocks import DOCS, blocks_of, doc_blocks

REPO = Path(__file__).resolve().parents[2]
REAL_HOSTS = ("inventory/gpu.py", "inventory/proxmox.py", "<")


def test_every_block_the_lab_runs_can_run_there() -> None:
    blocks = doc_blocks(REPO)
    assert {b.doc for b in blocks} == set(DOCS)
    run = [b for b in blocks if b.kind == "run"]
    assert len(run) >= 4
    for b in run:
        assert not any(h in line for line in b.commands() for h in REAL_HOSTS), (
            f"{b.where}: names a real host or a placeholder; mark it *On a real GPU host:*")
    for b in blocks:
        if b.kind == "run_by":
            assert (REPO / b.note).is_file(), f"{b.where}: {b.note} does not exist"
        if b.kind == "not_run":
            assert b.note, b.where


def test_markers_and_languages() -> None:
    text = "\n".join([
        "*On a real GPU host:*", "", "```sh", "pyinfra inventory/gpu.py deploy/host.py", "```",
        "*Run by tests/unit/test_wheel.py (the wheel):*", "```sh", "cd p && pyinfra x", "```",
        "*Not run by the docs test: it runs them all:*", "```sh", "make test", "```",
        "Some prose.", "```sh", "  # a comment", "make demo", "```",
        "```python", "print(1)", "```", "```", "output line", "```",
        "- a list item:", "  ```sh", "  gpuserve check inventory/lab.py", "  ```"])
    blocks = blocks_of("x.md", text)
    assert [(b.kind, b.note, b.commands()) for b in blocks] == [
        ("gpu", "", ["pyinfra inventory/gpu.py deploy/host.py"]),
        ("run_by", "tests/unit/test_wheel.py", ["cd p && pyinfra x"]),
        ("not_run", "it runs them all", ["make test"]),
        ("run", "", ["make demo"]),
        ("run", "", ["gpuserve check inventory/lab.py"]),
    ]
    assert [b.line for b in blocks] == [3, 7, 11, 15, 26]
