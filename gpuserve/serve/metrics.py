"""SGLang's own Prometheus metrics, on by default: the flags the serve deploy adds.

SGLang serves ``/metrics`` on the API's port only with ``--enable-metrics``, and under
attention-DP only the scheduler of attention rank 0 records unless the version has
``--enable-metrics-for-all-schedulers`` (metrics.md, "SGLang"). The scrape path shares
the API's listen address (gpuserve/serve/service.listen_host), and SGLang's API-key
middleware exempts ``/metrics`` as it does ``/health`` (srt/utils/auth.py), so the
scraper needs no key and the metrics are reachable exactly where the API is.
"""

from __future__ import annotations

from gpuserve.errors import InputError
from gpuserve.launch.catalog import FlagCatalog

DEFAULTS = {
    # SGLang's Prometheus metrics (--enable-metrics, /metrics on the API's port and
    # address; per-rank under attention-DP where the version has
    # --enable-metrics-for-all-schedulers). false: the server exports nothing
    # accepts: bool
    "sglang_metrics": True,
}

ENABLE = "--enable-metrics"
ALL_SCHEDULERS = "--enable-metrics-for-all-schedulers"


def attention_dp(args: list[str]) -> bool:
    """Whether the launch runs attention-DP (``--enable-dp-attention``, or
    ``--attn-dp-size`` above 1 from 0.5.22 on)."""
    if "--enable-dp-attention" in args:
        return True
    for index, arg in enumerate(args):
        value = None
        if arg == "--attn-dp-size" and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith("--attn-dp-size="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit() and int(value) > 1:
            return True
    return False


def metrics_flags(args: list[str], enabled: object, catalog: FlagCatalog,
                  source: str) -> list[str]:
    """The flags to add to ``args`` so the server exports its metrics (none the args
    already have); [] when host data ``sglang_metrics`` is false."""
    if not isinstance(enabled, bool):
        raise InputError(source, "sglang_metrics", f"must be true or false, got {enabled!r:.40}")
    if not enabled or not catalog.has_flag(ENABLE):
        return []
    wanted = [ENABLE]
    if attention_dp(args) and catalog.has_flag(ALL_SCHEDULERS):
        wanted.append(ALL_SCHEDULERS)
    return [flag for flag in wanted if flag not in args]
