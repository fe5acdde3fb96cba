"""``sglang serve`` / ``python -m sglang.launch_server`` of the stand-in.

Flow (like srt/entrypoints/http_server.py::launch_server): parse argv with the
version's real parser (rebuilt from the bundled flag catalog; --config merged first),
log the start-up phases over a simulated load time, and only then listen on
--host/--port; a warmup thread flips /health to 200 and logs
"The server is fired up and ready to roll!".

Failures end the way SGLang's do: the scheduler logs "Scheduler hit an exception:
<traceback>", the launcher logs "Received sigquit from a child process. It usually
means the child failed." and the process tree is killed (SIGKILL, so the exit
status is non-zero).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sglang._standin import group, jit, logs, pd
from sglang._standin import surface as surfaces
from sglang._standin.config import ConfigArgumentMerger
from sglang._standin.flagparser import build_parser, stderr_warn
from sglang._standin.server import State, serve
from sglang._standin.sim import (
    ModelShape,
    Plan,
    StartupError,
    capture_oom,
    env_float,
    env_str,
    plan,
)
from sglang.version import __version__


def load_catalog() -> dict:
    return json.loads(resources.files("sglang._standin").joinpath("flags.json").read_text())


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("+", 1)[0].split(".")[:3] if p.isdigit())


def parse_args(argv: list[str]):
    catalog = load_catalog()
    parser = build_parser(catalog, warn=stderr_warn)
    if "--config" in argv:
        # 0.5.19's merger keyed the file by dest only; 0.5.2x accepts every long spelling.
        legacy = _version_tuple(__version__) < (0, 5, 23)
        argv = ConfigArgumentMerger(parser, legacy=legacy).merge_config_with_args(argv)
    return parser.parse_args(argv), argv


def _die(exc: StartupError, rank: str = "TP0") -> None:
    frames = "".join(f'  File "{path}", line {line}, in {func}\n'
                     for path, line, func in exc.frames)
    logs.log(f"Scheduler hit an exception: Traceback (most recent call last):\n{frames}"
             f"{exc.exc_type}: {exc.message}\n", rank=rank, level="error")
    logs.log("Received sigquit from a child process. It usually means the child failed.",
             level="error")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _pd_engine(args) -> None:
    """A PD server's Mooncake transfer engine must import, as SGLang's KV manager needs
    it (0.5.23: srt/distributed/device_communicators/mooncake_transfer_engine.py:120)."""
    mode = getattr(args, "disaggregation_mode", None) or "null"
    if mode == "null" or args.disaggregation_transfer_backend not in ("mooncake",
                                                                     "mooncake_tcp"):
        return
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as exc:
        _die(StartupError("ImportError", "Please install mooncake by following the "
                          "instructions at https://github.com/kvcache-ai/Mooncake/blob/main/"
                          "doc/en/build.md to run SGLang with MooncakeTransferEngine.",
                          [("sglang/srt/distributed/device_communicators/"
                            "mooncake_transfer_engine.py", 120, "init")]))
        raise SystemExit(1) from exc  # _die kills the process; never reached


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def _resolved(args, p) -> dict:
    """ServerArgs after resolution: the CLI values plus what the memory hook decided."""
    info = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    info.update({
        "mem_fraction_static": p.mem_fraction_static,
        "chunked_prefill_size": p.chunked_prefill_size,
        "served_model_name": args.served_model_name or args.model_path,
        "tokenizer_path": args.tokenizer_path or args.model_path,
        "cuda_graph_config": {
            "decode": {"backend": "full" if p.decode_graphs else "disabled",
                       "max_bs": p.decode_max_bs, "bs": p.decode_bs},
            "prefill": {"backend": "breakable" if p.prefill_graphs else "disabled",
                        "max_bs": p.prefill_bs[-1] if p.prefill_bs else None,
                        "bs": p.prefill_bs}},
    })
    return info


def _scheduler_info(p) -> dict:
    return {"max_total_num_tokens": p.max_total_num_tokens,
            "max_running_requests": p.max_running_requests,
            "max_req_input_len": max(p.context_len - 1, 0),
            "context_len": p.context_len}


@dataclass
class Launch:
    """What the start-up does: the memory plan, the speed model, how it fails."""

    plan: Plan
    perf: surfaces.Perf
    error: StartupError | None = None     # a surface's start failure or capture OOM
    crash: surfaces.Fail | None = None    # a surface's crash while serving
    surface: bool = False


def _load_surface(ref: str) -> surfaces.Surface:
    """GPUSERVE_LAB_STANDIN_SURFACE: a file path, or the name of a bundled surface."""
    path = Path(ref)
    if "/" not in ref and not ref.endswith((".yaml", ".yml")):
        path = Path(str(resources.files("sglang._standin").joinpath("surfaces")
                        .joinpath(ref + ".yaml")))
    try:
        return surfaces.load(path)
    except surfaces.SurfaceError as e:
        logs.log(f"sglang lab stand-in: bad performance surface: {e}", level="error")
        sys.stderr.flush()
        raise SystemExit(1) from None


#: the lab host's recorded box (lab/nvidia_repo: /etc/gpuserve-lab/box); the knob
#: GPUSERVE_LAB_STANDIN_BOX_FILE reads it elsewhere (a server run outside a lab host)
BOX_FILE = "/etc/gpuserve-lab/box"
#: the surface whose memory figures are a box's own, per box: the field notes measured
#: GLM-5 NVFP4's start on the reference box (lab/surfaces/field-notes.yaml cites them)
BOX_MEMORY = {"rtxpro6000-kvm": "field-notes"}


def _box_memory(args, shape: ModelShape) -> Plan | None:
    """Without a surface: the memory of this start on the host's box when the box has
    measured figures for the served model (its architecture); None: the knobs'. Speed
    stays the knobs' (a surface gives both)."""
    try:
        box = Path(env_str("BOX_FILE") or BOX_FILE).read_text().strip()
    except OSError:
        return None
    ref = BOX_MEMORY.get(box)
    if ref is None:
        return None
    surface = _load_surface(ref)
    model = surface.model or {}
    if shape.architecture not in (model.get("architectures") or []):
        return None
    return surface.start(args, shape).plan


def _launch(args, shape: ModelShape) -> Launch:
    ref = env_str("SURFACE").strip()
    if not ref:
        perf = surfaces.Perf(decode_tps=env_float("DECODE_TPS", 60.0),
                             batch_decode_tps=env_float("BATCH_DECODE_TPS", 1500.0),
                             prefill_tps=env_float("PREFILL_TPS", 8000.0))
        p = _box_memory(args, shape)
        if p is None:
            return Launch(plan=plan(args, shape), perf=perf)
        return Launch(plan=p, perf=perf)
    surface = _load_surface(ref)
    # GPUSERVE_LAB_STANDIN_SURFACE_NOISE / _SEED: a bundled surface with run-to-run noise
    surface.noise["run"] = env_float("SURFACE_NOISE", surface.noise["run"])
    surface.noise["seed"] = int(env_float("SURFACE_SEED", surface.noise["seed"]))
    # a start's noise is keyed by systemd's id of this start (another start, another draw)
    st = surface.start(args, shape, speedup=env_float("SURFACE_SPEEDUP", 1.0),
                       start_key=os.environ.get("INVOCATION_ID", ""))
    error = None if st.plan.errors else st.error
    return Launch(plan=st.plan, perf=st.perf, error=error, crash=st.crash, surface=True)


def _load_phase(p: Plan, shape: ModelShape, args, ranks: list[str], load_s: float) -> None:
    for r in ranks:
        logs.log(f"Load weight begin. avail mem={p.pre_gb:.2f} GB", rank=r)
    _sleep(load_s * 0.6)
    if p.load_failed:
        _die(p.errors[0])
    quant = f"quant={args.quantization}, " if args.quantization else ""
    for r in ranks:
        logs.log(f"Load weight end. elapsed={load_s * 0.6:.2f} s, type={shape.architecture}, "
                 f"{quant}avail mem={p.after_weights_gb:.2f} GB, "
                 f"mem usage={p.weights_gb:.2f} GB.", rank=r)
    if p.errors:
        _die(p.errors[0])
    for r in ranks:
        kv = p.kv_gb
        if p.is_mla:
            logs.log(f"KV Cache is allocated. dtype: {p.kv_dtype_name}, "
                     f"#tokens: {p.max_total_num_tokens}, KV size: {kv:.2f} GB", rank=r)
        else:
            logs.log(f"KV Cache is allocated. dtype: {p.kv_dtype_name}, "
                     f"#tokens: {p.max_total_num_tokens}, K size: {kv / 2:.2f} GB, "
                     f"V size: {kv / 2:.2f} GB", rank=r)
        logs.log(f"Memory pool end. avail mem={p.after_pool_gb:.2f} GB", rank=r)
    _sleep(load_s * 0.1)


def _capture_phase(launch: Launch, ranks: list[str], load_s: float, fail: str) -> float:
    """Graph capture; dies like SGLang when it cannot fit (or a surface says it fails
    here); returns the memory left."""
    p = launch.plan
    avail = p.after_pool_gb
    if p.prefill_graphs:
        for r in ranks:
            logs.log(f"Capture target prefill CUDA graph begin. backend=breakable, "
                     f"num_tokens={p.prefill_bs}, avail mem={avail:.2f} GB", rank=r)
        avail -= p.prefill_graph_gb
        for r in ranks:
            logs.log(f"Capture target prefill CUDA graph end. elapsed={load_s * 0.1:.2f} s, "
                     f"mem usage={p.prefill_graph_gb:.2f} GB, avail mem={avail:.2f} GB.",
                     rank=r)
    if not p.decode_graphs:
        if fail == "oom":
            _die(capture_oom(p, tried_gb=2.0, avail_gb=max(avail - 0.12, 0.0)))
        if launch.error is not None:
            _die(launch.error)
        return avail
    for r in ranks:
        logs.log(f"Capture target decode CUDA graph begin. backend=full, "
                 f"num_tokens_per_req=1, avail mem={avail:.2f} GB", rank=r)
    _sleep(load_s * 0.2)
    # Capture needs its graphs plus activation scratch inside the free memory.
    need = p.decode_graph_gb + 0.25
    if fail == "oom" or need > avail:
        tried = max(need - avail, 0.0) + 2.0 if fail == "oom" else need
        _die(capture_oom(p, tried_gb=tried, avail_gb=max(avail - 0.12, 0.0)))
    if launch.error is not None:
        _die(launch.error)
    avail -= p.decode_graph_gb
    for r in ranks:
        logs.log(f"Capture target decode CUDA graph end. bs={p.decode_bs}, "
                 f"elapsed={load_s * 0.2:.2f} s, mem usage={p.decode_graph_gb:.2f} GB, "
                 f"avail mem={avail:.2f} GB.", rank=r)
    return avail


def _crash_now(fail: surfaces.Fail) -> None:
    from sglang._standin import sim
    _die(surfaces.crash_error(sim, fail))


def run(argv: list[str]) -> None:
    args, merged_argv = parse_args(list(argv))
    logs.set_level(args.log_level)
    shape = ModelShape.from_model_path(args.model_path)
    launch = _launch(args, shape)
    p = launch.plan
    resolved = _resolved(args, p)
    # Like entrypoints/engine.py::_launch_subprocesses, which logs the resolved record
    # (api_key included: SGLang redacts only watermark secrets).
    logs.log(f"server_args={resolved}")

    load_s = env_float("LOAD_SECONDS", 1.0)
    fail = env_str("FAIL").strip().lower()
    nnodes, node_rank = int(args.nnodes or 1), int(args.node_rank or 0)
    if nnodes > 1:
        # every node blocks here until the group has formed (lab/.../group.py)
        group.join(nnodes, node_rank, args.dist_init_addr, on_lost=lambda why: _die(
            StartupError("RuntimeError", f"NCCL communicator was aborted: {why}",
                         [("sglang/srt/managers/scheduler.py", 1480, "run_event_loop")])))
    # this node's ranks (TP ranks are spread over the nodes in order)
    per_node = max(1, p.tp // nnodes)
    # scheduler.py's log prefix: " TP{tp_rank}", then " EP{moe_ep_rank}" when ep_size > 1
    ep = int(getattr(args, "ep_size", 1) or 1)
    ranks = [f"TP{r}" + (f" EP{r // max(1, p.tp // ep)}" if ep > 1 else "")
             for r in range(node_rank * per_node, (node_rank + 1) * per_node)]

    _load_phase(p, shape, args, ranks, load_s)
    _pd_engine(args)
    jit.load_op(str(getattr(args, "kv_cache_dtype", "") or ""), shape.architecture)
    avail = _capture_phase(launch, ranks, load_s, fail)
    logs.log(f"max_total_num_tokens={p.max_total_num_tokens}, "
             f"chunked_prefill_size={p.chunked_prefill_size}, "
             f"max_prefill_tokens={p.max_prefill_tokens}, "
             f"max_running_requests={p.max_running_requests}, "
             f"context_len={p.context_len}, available_gpu_mem={avail:.2f} GB", rank="TP0")

    if node_rank > 0:
        # like SGLang: only node 0 runs the HTTP server; the others run their schedulers
        logs.log(f"multi-node: node {node_rank} serves no HTTP (node 0 does)")
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
        signal.signal(signal.SIGINT, lambda signum, frame: done.set())
        done.wait()
        return
    _serve(args, launch, resolved, merged_argv, shape, fail)


def _serve(args, launch: Launch, resolved: dict, merged_argv: list[str], shape: ModelShape,
           fail: str) -> None:
    p = launch.plan
    info = {**resolved, "launch_command": " ".join(merged_argv), **_scheduler_info(p),
            "_model_type": shape.model_type, "_architectures": [shape.architecture]}
    mode = getattr(args, "disaggregation_mode", None) or "null"
    pd_role = pd.PdRole(mode, args.host, int(args.disaggregation_bootstrap_port), args.port,
                        args.disaggregation_transfer_backend) if mode != "null" else None
    state = State(args, info, __version__, decode_tps=launch.perf.decode_tps,
                  prefill_tps=launch.perf.prefill_tps,
                  batch_decode_tps=launch.perf.batch_decode_tps, perf=launch.perf,
                  admission=launch.surface)
    if launch.crash is not None:
        crash = launch.crash
        state.crash_after = crash.after_requests
        state.on_crash = lambda: _crash_now(crash)
    state.pd = pd_role
    httpd = serve(state, args.host, args.port)
    logs.uvicorn(f"Started server process [{os.getpid()}]")
    logs.uvicorn("Waiting for application startup.")
    logs.uvicorn("Application startup complete.")
    logs.uvicorn(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")

    def warmup() -> None:
        if not args.skip_server_warmup:
            _sleep(env_float("WARMUP_SECONDS", 0.3))
            logs.uvicorn('127.0.0.1:0 - "GET /model_info HTTP/1.1" 200 OK')
            logs.uvicorn('127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
        state.status = "Up"
        logs.log("The server is fired up and ready to roll!")
        if fail == "crash":
            _sleep(env_float("CRASH_AFTER_SECONDS", 2.0))
            _die(StartupError(
                "RuntimeError", surfaces.ILLEGAL_MEMORY_ACCESS,
                [("sglang/srt/managers/scheduler.py", 1480, "run_event_loop")]))

    threading.Thread(target=warmup, name="warmup", daemon=True).start()
    threading.Thread(target=state.decode_logger, args=(args.decode_log_interval,),
                     name="decode-log", daemon=True).start()

    def stop(signum, frame) -> None:
        logs.uvicorn("Shutting down")
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        logs.uvicorn(f"Finished server process [{os.getpid()}]")
