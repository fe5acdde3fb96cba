"""Run ``plan_serve`` on one host-data case in its own process (the corpus's child).

Why a process: the corpus bounds each case's time and address space (RLIMIT_AS), which
only a child can have. Prints one JSON line ``{"file", "field", "message"}`` and exits
2 on a GpuserveError, like the CLI; anything else escapes as a traceback (exit 1), which
the corpus reports as a failure.

    python tests/unit/corpus/plan_case.py CASE_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from gpuserve.errors import GpuserveError, InputError  # noqa: E402
from gpuserve.launch.lock_choice import HostRuntime  # noqa: E402
from tests.serve_plans import plan_of  # noqa: E402

#: The 8-GPU R580 host of tests/unit/serve/test_serve_plan.py.
RUNTIME = dict(name="gpu1", python="3.11.2", glibc="2.36", driver="580.126.20",
               cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


def main(case: dict) -> int:
    host_json = case.get("host_json")
    facts = case.get("host_facts")  # a host-facts document: the preflight's doctor runs
    try:
        plan_of(case["data"], case.get("source", "inventory/gpu.py"),
                   lambda home: HostRuntime(**RUNTIME),
                   host_record=lambda: None if host_json is None else host_json.splitlines(),
                   host_facts=None if facts is None else lambda: facts)
    except GpuserveError as exc:
        fields = {"file": getattr(exc, "file", None), "field": getattr(exc, "field", None)}
        if not isinstance(exc, InputError):
            fields = {"file": None, "field": None}
        print(json.dumps({**fields, "message": str(exc)}))
        return 2
    print(json.dumps({"accepted": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
