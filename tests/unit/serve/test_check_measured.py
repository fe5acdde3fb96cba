"""``gpuserve check`` plans a host's memory from its model record calibrated by the
host's last start the serve deploy recorded on this controller (gpuserve.start/1 under
``results_dir``), without connecting: a launch that calibration refuses fails the host
naming the measured figures; one that fits shows its margin; a host without a recorded
start is not memory-checked.

The start is tests/fixtures/logs/fieldnote_glm5_tp8.log (SGLang 0.5.23's line formats
with the field notes' TP8 figures: 94 GiB free before weights, 21.7 after)."""

from __future__ import annotations

import json
from pathlib import Path

from test_check_inventory import check, fleet, line, no_network  # noqa: F401 (fixture)

from gpuserve.measure.starts import Checkpoint, StartSpec, from_log, write_start
from gpuserve.memory.startup_log import read_log

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
EP8 = REPO / "profiles/glm5-nvfp4-tp8-ep8.yaml"
GPU = {"name": BOX["gpus"][0]["name"], "memory_total_mib": BOX["gpus"][0]["memory_total_mib"],
       "compute_cap": BOX["gpus"][0]["compute_cap"], "count": len(BOX["gpus"])}


def ep8_at(tmp: Path, fraction: float) -> str:
    path = tmp / f"ep8-mfs{int(fraction * 100)}.yaml"
    path.write_text(f"extends: {EP8}\nmemory:\n  mem_fraction_static: {fraction}\n")
    return str(path)


def test_a_launch_the_host_s_start_refuses_fails_its_check(tmp_path, capsys) -> None:
    results = tmp_path / "results"
    for host in ("gpu1", "gpu2"):
        write_start(
            results,
            from_log(
                read_log(REPO / "tests/fixtures/logs/fieldnote_glm5_tp8.log"),
                StartSpec(
                    results_dir="",
                    sglang_version="0.5.23",
                    checkpoint=Checkpoint("/models/GLM-5-NVFP4"),
                    launch={"profile": "glm5-nvfp4-tp8", "tp": 8, "ep": 1},
                    gpu=GPU,
                ),
                host=host,
                timestamp="2026-12-06T07:00:00Z",
                server_start="2026-12-06T07:00:00Z",
            ),
        )
    inv = fleet(tmp_path, {
        "gpu1": {"profile": ep8_at(tmp_path, 0.78), "results_dir": str(results)},
        "gpu2": {"profile": ep8_at(tmp_path, 0.83), "results_dir": str(results)},
        "gpu3": {"profile": ep8_at(tmp_path, 0.78), "results_dir": str(results)}})
    rc, out, err = check(capsys, str(inv), "--deploy", "serve")
    assert rc == 1, out + err
    refused = line(out, "gpu1", "serve")
    assert " FAIL " in refused and "memory calibrated by the host's start of 2026-12-06T07:00:00Z" \
        in refused, out
    assert "21.70 GiB/GPU" in refused and "16.29 +- 1.50 GiB" in refused, refused
    assert "minimum viable mem_fraction_static 0.843" in refused
    assert " ok " in line(out, "gpu2", "serve")
    assert "(margin +0.31 +- 1.50 GiB)" in out  # gpu2's warning lines
    assert " ok " in line(out, "gpu3", "serve")  # no start recorded for gpu3
    assert out.count("memory calibrated by the host's start") == 2
