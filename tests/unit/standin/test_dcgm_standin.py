"""The lab's dcgm-exporter stand-in answers in the real exporter's format: DCGM's field
names and types from the counters file, the label set of dcgm-exporter's
render_metrics.go, one series per GPU of the recorded box."""

from __future__ import annotations

import json
from pathlib import Path

from gpuserve.parsers.prometheus_text import parse_metrics
from lab.dcgm_standin import counters, render

BOX = Path(__file__).resolve().parents[3] / "lab" / "nvidia_repo" / "boxes" / "h200-nvlink"


def test_every_counter_for_every_gpu_with_dcgm_exporters_labels() -> None:
    box = json.loads((BOX / "box.json").read_text())
    samples = parse_metrics(render(box, "lab-gpu"))
    fields = {field for field, _, _ in counters()}
    assert {s.name for s in samples} == fields
    assert len(samples) == len(fields) * len(box["gpus"]) == len(fields) * 8
    temp = [s for s in samples if s.name == "DCGM_FI_DEV_GPU_TEMP"]
    assert {dict(s.labels)["gpu"] for s in temp} == {str(i) for i in range(8)}
    first = dict(temp[0].labels)
    assert set(first) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
    assert first["modelName"] == "NVIDIA H200" and first["device"] == "nvidia0"
    free = {dict(s.labels)["gpu"]: s.value for s in samples if s.name == "DCGM_FI_DEV_FB_FREE"}
    used = {dict(s.labels)["gpu"]: s.value for s in samples if s.name == "DCGM_FI_DEV_FB_USED"}
    assert free["0"] + used["0"] == 143771  # MiB, as the box's nvidia-smi reports
    assert all(s.value == 0 for s in samples if s.name == "DCGM_FI_DEV_XID_ERRORS")
