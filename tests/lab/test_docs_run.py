"""The docs run as written: every ``sh`` block of README.md, docs/getting-started.md,
docs/metrics.md and docs/deploys.md that the lab can run runs on one lab host, in
document order, each in its own ``bash -e`` from the repository root with the venv
activated (as getting-started.md's first block leaves a shell), and exits 0. A few
blocks also show what they are there to show (:data:`EXPECT`). Blocks marked for a
real GPU host, run by another test, or not run (lab/doc_blocks.py) are listed and
skipped, so the list is in the output of every run.

Cost: README's ``make demo`` serves with its benchmarks (the demo as a user sees it);
the later blocks find the host served (reruns with no changes), docs/deploys.md's switch
runs without benchmarks, and docs/metrics.md's ``python -m lab monitor`` installs
Debian's Prometheus on the host (tests/lab/test_monitor.py proves what it scrapes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lab.doc_blocks import doc_blocks

pytestmark = pytest.mark.lab

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: (document, a command of the block): what its output must hold, in words a user reads
EXPECT = {
    ("README.md", "make demo"): [
        "lab-gpu: preflight: weights ", "GiB/GPU from the checkpoint", "lab-gpu: smoke: ",
        ".venv/bin/gpuserve logs inventory/lab.py"],
    ("docs/metrics.md", "python -m lab monitor"): [
        "Prometheus at http://127.0.0.1:", "lab-gpu", "not behind a gateway"],
    ("docs/deploys.md", "gpuserve render inventory/lab.py"): [
        "lab-gpu: switches from glm5-nvfp4-tp8 (running since ",
        "# running: glm5-nvfp4-tp8-ep8 since ", "DIFFERS: runs glm5-nvfp4-tp8-ep8, the "
        "inventory names glm5-nvfp4-tp8",
        "lab-gpu  glm5-nvfp4-tp8-ep8* (inventory: glm5-nvfp4-tp8)",
        "lab-gpu: runs glm5-nvfp4-tp8-ep8 (the last passing deploy's record), the inventory "
        "names glm5-nvfp4-tp8: labelled and scraped as glm5-nvfp4-tp8-ep8",
        "lab-gpu: switches from glm5-nvfp4-tp8-ep8 (running since "],
}
TIMEOUT = 1800


def _run(block, env: dict) -> str:
    proc = subprocess.run(["bash", "-e", "-c", block.text], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace",
                          timeout=TIMEOUT)
    out = ANSI.sub("", proc.stdout)
    sys.stdout.write(out)
    assert proc.returncode == 0, f"{block.where}: exit {proc.returncode}:\n{out[-4000:]}"
    return out


def test_the_docs_command_blocks_run_as_written(lab) -> None:
    blocks = doc_blocks(REPO)
    skipped = [b for b in blocks if b.kind != "run"]
    for b in skipped:
        why = {"gpu": "needs a real GPU host", "run_by": f"run by {b.note}",
               "not_run": b.note}[b.kind]
        print(f"skipped {b.where} ({why}): {b.commands()[0]}")
    env = {**lab.env, "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(REPO / ".venv")}
    ran = []
    for b in blocks:
        if b.kind != "run":
            continue
        out = _run(b, env)
        ran.append(b.where)
        for (doc, command), wanted in EXPECT.items():
            if b.doc == doc and any(line.startswith(command) for line in b.commands()):
                for text in wanted:
                    assert text in out, f"{b.where}: {text!r} not in its output"
    assert len(ran) >= 5, ran
    # the host is left as the inventory says: serving its own profile, and (as the other
    # modules expect it) no scraper running
    lab.ssh("systemctl stop prometheus prometheus-node-exporter")
    assert lab.ssh("systemctl is-active gpuserve-sglang.service").stdout.strip() == "active"
