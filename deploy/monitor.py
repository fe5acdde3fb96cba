"""Metrics for an inventory: exporters on the GPU and router hosts, Prometheus on the
``monitor`` group's hosts, scraping them all.

    pyinfra -y inventory/gpu.py deploy/monitor.py --dry
    pyinfra -y inventory/gpu.py deploy/monitor.py

Host data keys and defaults: gpuserve/monitor/targets.EXPORTER_DEFAULTS (GPU hosts),
gpuserve/monitor/plan.MONITOR_DEFAULTS (monitor hosts); what is scraped and what each
alert means: docs/metrics.md (the deploy is ``gpuserve.roles.deploys.monitor_fleet``).
"""

from gpuserve.roles.deploys import monitor_fleet

monitor_fleet()
