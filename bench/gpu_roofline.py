"""What only a GPU can show, for the planner and the tuner's decode roofline.

On a machine with a GPU and torch: ``python3 bench/gpu_roofline.py > result.json``
measures
1. CUDA context + cuBLAS resident memory (what SGLang's pre-load free memory loses);
2. achieved HBM read bandwidth and bf16 GEMM peak (the roofline's denominators);
3. a decode-step stand-in: a stack of bf16 GEMMs whose weights are read once per step,
   batch 1..1024, eager and as a CUDA graph, timed with CUDA events; and 200 small
   GEMMs at batch 1, where launch overhead (what CUDA graphs remove) dominates.
Anywhere: ``python3 bench/gpu_roofline.py --report result.json`` prints each batch's
measured step time beside the roofline max(weight bytes / read bandwidth, flops / peak)
and their ratio. A recorded result: bench/results/h200-roofline-2026-12-04.json.
"""

import json
import statistics
import sys
import time

if len(sys.argv) == 3 and sys.argv[1] == "--report":
    with open(sys.argv[2]) as f:
        d = json.load(f)
    bw, peak = d["bandwidth"]["read_tb_s"] * 1e12, d["peak"]["tflops"] * 1e12
    w = d["decode"]["weight_bytes"]
    print(f"{d['memory']['name']}: read {bw / 1e12:.2f} TB/s, bf16 peak {peak / 1e12:.0f} "
          f"TFLOP/s, {w / 2**30:.0f} GiB of weights per step")
    print(f"{'batch':>6} {'graph ms':>9} {'eager ms':>9} {'roofline ms':>12} "
          f"{'meas/pred':>10} {'tok/s':>8}")
    for r in d["decode"]["rows"]:
        pred = max(w / bw, r["flops"] / peak)
        print(f"{r['batch']:>6} {r['graph_s'] * 1e3:>9.2f} {r['eager_s'] * 1e3:>9.2f} "
              f"{pred * 1e3:>12.2f} {r['graph_s'] / pred:>10.2f} "
              f"{r['batch'] / r['graph_s']:>8.0f}")
    small = d["decode"]["small_200x2048x2048_b1"]
    print(f"200 small GEMMs at batch 1: eager {small['eager_s'] * 1e3:.2f} ms, "
          f"graph {small['graph_s'] * 1e3:.2f} ms")
    sys.exit(0)

import torch  # noqa: E402  (only the measuring mode needs it)

out: dict = {"torch": torch.__version__, "cuda": torch.version.cuda}


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    return statistics.median(times)


def section(name):
    def wrap(fn):
        t0 = time.time()
        try:
            out[name] = fn()
        except Exception as exc:  # keep the other sections
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out[name + "_wall_s"] = round(time.time() - t0, 2)
        print(f"# {name} done in {out[name + '_wall_s']} s", file=sys.stderr, flush=True)
        return fn
    return wrap


def eager_and_graph(step, reps=8):
    """Median seconds of ``step`` run eagerly and replayed as a captured CUDA graph
    (warmed on a side stream first, as torch's capture requires)."""
    eager = timed(step, reps=reps, warm=2)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        step()
    return eager, timed(g.replay, reps=reps, warm=2)


@section("memory")
def _memory():
    free0, total = torch.cuda.mem_get_info()  # initialises the context
    x = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (x @ x).sum().item()  # cuBLAS handle and workspace
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    return {"name": torch.cuda.get_device_name(0), "total_mib": total / 2**20,
            "free_after_context_mib": free0 / 2**20,
            "free_after_cublas_mib": free1 / 2**20,
            "resident_before_weights_gib": (total - free1) / 2**30,
            "torch_allocated_mib": torch.cuda.memory_allocated() / 2**20,
            "capability": list(torch.cuda.get_device_capability(0)),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}


@section("bandwidth")
def _bandwidth():
    n = 8 * 2**30 // 2  # 8 GiB of bf16
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_()
    read = timed(lambda: x.sum(dtype=torch.float32), reps=10)
    y = torch.empty_like(x)
    copy = timed(lambda: y.copy_(x), reps=10)
    return {"bytes": n * 2, "read_s": read, "read_tb_s": n * 2 / read / 1e12,
            "copy_s": copy, "copy_rw_tb_s": 2 * n * 2 / copy / 1e12}


@section("decode")
def _decode():
    layers, k, m = 48, 8192, 16384  # 48 x 8192 x 16384 bf16 = 12 GiB read per step
    ws = [torch.empty(k, m, device="cuda", dtype=torch.bfloat16).normal_(std=0.01)
          for _ in range(layers)]
    wbytes = layers * k * m * 2
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)

        def step(x=x):
            for w in ws:
                torch.matmul(x, w)
        eager, graph = eager_and_graph(step)
        rows.append({"batch": b, "eager_s": eager, "graph_s": graph,
                     "flops": 2 * b * k * m * layers})
    # small layers: where launch overhead, not bandwidth, dominates (eager vs graph)
    small = [torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(200)]
    xs = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)

    def small_step():
        for w in small:
            torch.matmul(xs, w)
    eager_small, graph_small = eager_and_graph(small_step)
    return {"layers": layers, "k": k, "m": m, "weight_bytes": wbytes, "rows": rows,
            "small_200x2048x2048_b1": {"eager_s": eager_small, "graph_s": graph_small}}


@section("peak")
def _peak():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b, reps=10)
    return {"n": n, "s": t, "tflops": 2 * n**3 / t / 1e12}


print(json.dumps(out, indent=1))
