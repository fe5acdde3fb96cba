"""Print the planner's per-case error table against tests/fixtures/memory_cases.jsonl.

    .venv/bin/python bench/planner_accuracy.py

Same data and comparison as tests/unit/memory/test_planner.py: weights per GPU,
KV bytes per token and KV tokens (from each case's own free-memory figures and mem
fraction), with skipped cases and their reasons.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuserve.host.gpus import get_gpu, known_gpus  # noqa: E402
from gpuserve.memory.memory_defaults import KNOWN_VERSIONS, MemorySettings, memory_defaults  # noqa: E402
from gpuserve.memory.planner import sglang_need_mb  # noqa: E402
from gpuserve.memory.planner_cases import evaluate, format_table  # noqa: E402


def defaults_table() -> str:
    """SGLang's default mem_fraction_static per version (every version with memory rules,
    i.e. every shipped lock's) for each GPU of gpus.yaml, GQA TP1 / TP8 and MLA TP8."""
    head = f"{'GPU':14} {'MiB':>7}  " + "  ".join(f"{v:>20}" for v in KNOWN_VERSIONS)
    lines = ["default mem_fraction_static (GQA tp1 / GQA tp8 / MLA tp8)", head]
    for key in known_gpus():
        mib = get_gpu(key).memory_total_mib
        cells = []
        for v in KNOWN_VERSIONS:
            mfs = [memory_defaults(mib, MemorySettings(tp=tp, use_mla=mla, version=v)
                                   ).mem_fraction_static
                   for tp, mla in ((1, False), (8, False), (8, True))]
            cells.append(f"{' / '.join(f'{m:.3f}' for m in mfs):>20}")
        lines.append(f"{key:14} {mib:>7}  " + "  ".join(cells))
    return "\n".join(lines)


def ceiling_table() -> str:
    """The planner's max safe mem_fraction_static at SGLang's default graph and chunk sizes
    (1 - need / pre, pre = memory.total less gpus.yaml's init overhead): what an explicit
    fraction may reach before the memory outside the static pool is short of what SGLang
    allocates there (docs/planner.md, "What must fit outside the static pool")."""
    head = f"{'GPU':14} {'MiB':>7}  " + "  ".join(f"{v:>20}" for v in KNOWN_VERSIONS)
    lines = ["max safe mem_fraction_static (GQA tp1 / GQA tp8 / MLA tp8)", head]
    for key in known_gpus():
        gpu = get_gpu(key)
        pre = gpu.memory_total_gib - gpu.init_overhead_gib
        cells = []
        for v in KNOWN_VERSIONS:
            needs = [sum(sglang_need_mb(memory_defaults(
                gpu.memory_total_mib, MemorySettings(tp=tp, use_mla=mla, version=v))
                ).values()) / 1024
                for tp, mla in ((1, False), (8, False), (8, True))]
            cells.append(f"{' / '.join(f'{1 - n / pre:.3f}' for n in needs):>20}")
        lines.append(f"{key:14} {gpu.memory_total_mib:>7}  " + "  ".join(cells))
    return "\n".join(lines)


def main() -> int:
    fixtures = ROOT / "tests" / "fixtures"
    results = evaluate(fixtures / "memory_cases.jsonl", fixtures / "memory_cases_inputs.yaml", ROOT)
    print(format_table(results))
    checked = [r for r in results if r.status == "checked"]
    print(f"\n{len(checked)} cases checked, {len(results) - len(checked)} skipped")
    bounds = (
        ("weights GiB/GPU", 0.05),
        ("free after weights GiB", 0.05),
        ("KV tokens", 0.10),
        ("KV B/token", 0.01),
    )
    for what, bound in bounds:
        errs = [abs(e) for r in results for e in r.errors(what)]
        if errs:
            print(f"{what}: {len(errs)} checked, worst {max(errs):.1%} (bound {bound:.0%})")
    print("\n" + defaults_table())
    print("\n" + ceiling_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
