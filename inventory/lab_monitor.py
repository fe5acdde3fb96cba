"""pyinfra inventory for the lab's monitor: the lab host serves SGLang and is its own
monitor host (Debian's prometheus and prometheus-node-exporter from Debian's archive).

    python -m lab up
    pyinfra -y inventory/lab.py deploy/serve.py
    pyinfra -y inventory/lab_monitor.py deploy/monitor.py

The lab host's data (inventory/lab.py) without the gateway's keys (the monitor test
scrapes the server, not smg), no DCGM exporter (NVIDIA's packages are not in the lab's
repository: lab/dcgm_standin stands in for its answer in the unit tier only), and short
windows: a 2 s scrape and a 10 s SGLangServerDown, so the test sees the alert fire and
resolve within seconds. Lab knobs only; product code never reads this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from lab.inventories import lab_inventory, without_gateway  # noqa: E402
from lab.state import instance_name  # noqa: E402

_data = without_gateway(lab_inventory().host_data_for(instance_name()))
_data.update(dcgm_exporter=False, monitor_scrape_interval=2, monitor_alertmanager=False,
             monitor_alert_for={"SGLangServerDown": 10})

gpu = [("lab-gpu", _data)]
monitor = ["lab-gpu"]
