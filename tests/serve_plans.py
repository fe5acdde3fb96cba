"""The serve plan of plain host data, for tests: ``read_input`` then ``plan_serve`` with
the given reads (gpuserve/plans/serve.py), as the deploy and ``gpuserve check`` do."""

from __future__ import annotations

from collections.abc import Callable

from gpuserve.plans.serve import HostReads, ServePlan, plan_serve, read_input
from gpuserve.serve.service import ServiceLaunch, ServicePlan, plan_service, service_data


def plan_of(data: dict, source: str, runtime: Callable, host_record: Callable | None = None,
            *, host_name: str = "", group_members: Callable = lambda group: None,
            **reads) -> ServePlan:
    """``data`` (a host's data) planned with ``runtime`` (sglang_home -> HostRuntime),
    ``host_record`` (host.json's lines) and the other :class:`HostReads` given by keyword
    (``checkpoint=``, ``host_facts=`` ...)."""
    inputs = read_input(data, source, host_name, group_members)
    if host_record is not None:
        reads["host_record"] = host_record
    return plan_serve(inputs, HostReads(runtime=runtime, **reads))


def service_plan_of(*, data_source: str, extra_env: object = None, hf_token: object = None,
                    api_key: object = None, listen_address: object = None,
                    hardening_off: object = None, **launch) -> ServicePlan:
    """gpuserve/serve/service.plan_service of one launch (``launch``: the
    :class:`ServiceLaunch` fields) and raw host data, checked as read_input checks it."""
    return plan_service(ServiceLaunch(**launch), service_data(
        data_source, extra_env=extra_env, hf_token=hf_token, api_key=api_key,
        listen_address=listen_address, hardening_off=hardening_off))
