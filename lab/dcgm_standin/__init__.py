"""Stand-in for NVIDIA's dcgm-exporter (lab only): DCGM's field names, units, types and
label set, with values from a recorded lab box (lab/nvidia_repo/boxes/<box>/box.json).

Interface taken from the real exporter: the text format and labels of
NVIDIA/dcgm-exporter internal/pkg/rendermetrics/render_metrics.go (``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname``), the fields, types and help
texts of gpuserve/data/monitor/dcgm-counters.csv (NVIDIA's default-counters.csv plus
ours). The values are COMPOSED, not measured: memory from the box's nvidia-smi figures,
a fixed idle temperature, power and clocks, zero error and violation counters. It
proves the monitor's scrape, labels and GPU-count rules, never a real GPU's telemetry.

    python -m lab.dcgm_standin --box lab/nvidia_repo/boxes/h200-nvlink --listen 127.0.0.1:9400
"""

from __future__ import annotations

import argparse
import json
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COUNTERS = Path(__file__).resolve().parents[2] / "gpuserve" / "data" / "monitor" / \
    "dcgm-counters.csv"
#: composed idle values per field (units as DCGM's help text says); fields not named
#: here report 0 (counters, error codes, utilisation of an idle GPU)
IDLE = {"DCGM_FI_DEV_SM_CLOCK": 345, "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_GPU_TEMP": 31, "DCGM_FI_DEV_MEMORY_TEMP": 29,
        "DCGM_FI_DEV_POWER_USAGE": 76.5}


def counters(path: Path = COUNTERS) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of each counter line (labels left out)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        field, kind, text = (part.strip() for part in line.split(",", 2))
        if kind != "label":
            out.append((field, kind, text))
    return out


def render(box: dict, hostname: str) -> str:
    """The exporter's answer for every GPU of ``box``."""
    lines: list[str] = []
    for field, kind, text in counters():
        lines += [f"# HELP {field} {text}", f"# TYPE {field} {kind}"]
        for gpu in box["gpus"]:
            total, used = gpu["memory_total_mib"], gpu.get("memory_used_mib", 0)
            value = {"DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_FREE": total - used
                     }.get(field, IDLE.get(field, 0))
            labels = (f'gpu="{gpu["index"]}",UUID="{gpu["uuid"]}",'
                      f'pci_bus_id="{gpu["bus_id"]}",device="nvidia{gpu["index"]}",'
                      f'modelName="{gpu["name"]}",Hostname="{hostname}"')
            lines.append(f"{field}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def server(box_dir: Path, host: str, port: int) -> ThreadingHTTPServer:
    box = json.loads((box_dir / "box.json").read_text(encoding="utf-8"))
    hostname = socket.gethostname()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = render(box, hostname).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.dcgm_standin")
    parser.add_argument("--box", type=Path, required=True)
    parser.add_argument("--listen", default="127.0.0.1:9400")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    server(args.box, host, int(port)).serve_forever()


if __name__ == "__main__":
    main()
