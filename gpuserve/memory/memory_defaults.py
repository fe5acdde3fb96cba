"""SGLang's default choice of mem_fraction_static, chunked_prefill_size and decode max_bs.

A transcription of SGLang's own rules (``memory_hook.py::handle_gpu_memory_settings`` in
the 0.5.19 and 0.5.23 wheels, ``ServerArgs._handle_gpu_memory_settings`` in 0.5.10.post1),
so the planner starts from what the server itself would choose. Why per version: the
memory tiers, fallbacks and reserves differ between those releases.

A PD server's role (``disaggregation_mode``: prefill, decode) changes the reserve:
memory_hook.py of the 0.5.23 wheel (lines 298-305; 0.5.19: 239-246; reserve_for_graph_mb
and reserve_for_deepep_a2a_mb in both) sizes a decode server's activations by running
requests x draft tokens and reserves no prefill graphs, and a prefill server's no decode
graphs, attention-DP padding or deepep buffers. 0.5.10.post1's PD rules are not modelled.

How: docs/planner.md, "gpuserve.memory.memory_defaults: sources and version differences"
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

KNOWN_VERSIONS = ("0.5.10.post1", "0.5.19", "0.5.23")
# Versions whose tiers, unknown-memory fraction and MLA prefill max are 0.5.19's.
_OLD_RULES = ("0.5.10.post1", "0.5.19")
_SERVER_ARGS_HOOK = ("0.5.10.post1",)  # the hook still in server_args.py
DEFAULT_VERSION = "0.5.23"
# moe_a2a_backend values whose buffers memory_hook reserves for (only deepep).
_DEEPEP = ("deepep",)


@dataclass(frozen=True)
class MemoryDefaults:
    """What SGLang would pick, and the reserve (MiB) behind mem_fraction_static."""

    version: str
    gpu_memory_mib: float | None
    chunked_prefill_size: int  # before the attention-DP split (the value the fraction uses)
    chunked_prefill_size_per_dp: int  # what the scheduler ends up with
    decode_max_bs: int
    decode_capture_sizes: tuple[int, ...]
    prefill_graph_max_bs: int | None
    mem_fraction_static: float
    mem_fraction_is_default: bool
    reserved_mb: float
    reserve_breakdown: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_version(version: str) -> str:
    if version not in KNOWN_VERSIONS:
        from gpuserve.errors import InputError

        raise InputError(
            "--sglang-version",
            "sglang_version",
            f"no memory rules for SGLang {version}; known: {', '.join(KNOWN_VERSIONS)}",
        )
    return version


def capacity_defaults(
    gpu_memory_mib: float | None, tp: int, version: str = DEFAULT_VERSION
) -> tuple[int, int]:
    """(chunked_prefill_size, decode max_bs) by GPU memory tier (handle_gpu_memory_settings)."""
    _check_version(version)
    if gpu_memory_mib is None:
        return 4096, 160
    g = gpu_memory_mib
    if g < 20 * 1024:
        return 2048, 8
    if g < 35 * 1024:
        if version in _OLD_RULES:
            return 2048, (24 if tp < 4 else 80)
        return 4096, (48 if tp < 4 else 160)
    if g < 60 * 1024:
        return 4096, (32 if tp < 4 else 160)
    if g < 90 * 1024:
        return 8192, (256 if tp < 4 else 512)
    if g < 160 * 1024:
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512


def decode_capture_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """cuda_graph_hook.py::generate_decode_cuda_graph_batch_sizes (no padding override)."""
    if not speculative:
        sizes = (
            [1, 2, 4, 8, 12]
            + list(range(16, 257, 8))
            + list(range(272, 512, 16))
            + list(range(512, max_bs + 1, 32))
        )
    else:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max_bs + 1, 16))
        )
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.py::generate_prefill_cuda_graph_batch_sizes."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


@dataclass(frozen=True)
class MemorySettings:
    """The launch settings SGLang's memory defaults depend on (:func:`memory_defaults`):
    the parallel layout, the chunked prefill, the decode graphs' batch sizes, the fraction
    when it is set, and speculation. None: SGLang's own default."""

    tp: int = 1
    pp: int = 1
    attn_dp: int = 1
    use_mla: bool = False
    version: str = DEFAULT_VERSION
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    decode_max_bs: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    decode_graph: bool = True
    prefill_graph: bool = True
    prefill_graph_breakable: bool = True
    moe_a2a_backend: str = "none"
    speculative: bool = False
    post_capture_kv_sizing: bool = False
    speculative_algorithm: str | None = None
    disaggregation_mode: str = "null"  # a PD server's role: prefill, decode
    num_draft_tokens: int | None = None


@dataclass(frozen=True)
class _ReserveTerms:
    """What the reserve's terms read, resolved (chunked prefill, graph batch sizes)."""

    tp: int
    pp: int
    attn_dp: int
    use_mla: bool
    cps: int
    max_prefill_tokens: int
    max_bs: int
    prefill_max: int
    decode_graph: bool
    prefill_graph: bool
    prefill_graph_breakable: bool
    moe_a2a_backend: str
    post_capture_kv_sizing: bool
    disaggregation_mode: str = "null"
    decode_tokens: int = 1  # a PD decode server's running requests x draft tokens


def _reserve_breakdown(gpu_memory_mib: float | None, terms: _ReserveTerms) -> dict[str, float]:
    """The MiB SGLang reserves outside the static pool when it picks mem_fraction_static
    itself, by cause (handle_gpu_memory_settings' reserved_mem)."""
    t = terms
    tp, pp, attn_dp, use_mla, cps = t.tp, t.pp, t.attn_dp, t.use_mla, t.cps
    max_prefill_tokens, max_bs, moe_a2a_backend = t.max_prefill_tokens, t.max_bs, t.moe_a2a_backend
    pd = t.disaggregation_mode
    # a PD prefill server captures no decode graphs, a decode server no prefill ones
    decode_graph = t.decode_graph and pd != "prefill"
    breakdown: dict[str, float] = {}
    if t.post_capture_kv_sizing and not use_mla:
        # SGLANG_ENABLE_POST_CAPTURE_KV_SIZING: only the floor + parallel slack.
        breakdown["floor"] = 1536
        breakdown["parallel"] = tp * pp / 8 * 1024
    else:
        activation_tokens = max(cps, 2048) if cps > 0 else max(max_prefill_tokens, 2048)
        if pd == "decode":  # running requests x draft tokens (PD decode)
            activation_tokens = max(t.decode_tokens, 2048)
        breakdown["constant"] = 512
        breakdown["activations"] = activation_tokens * 1.5
        breakdown["parallel"] = tp * pp / 8 * 1024
        breakdown["cuda_graphs"] = _graph_reserve_mb(
            max_bs, attn_dp=attn_dp if pd != "prefill" else 1, use_mla=use_mla,
            prefill_max=t.prefill_max, decode_graph=decode_graph,
            prefill_graph=t.prefill_graph and pd != "decode",
            prefill_graph_breakable=t.prefill_graph_breakable, moe_a2a_backend=moe_a2a_backend)
        subtotal = sum(breakdown.values())
        if gpu_memory_mib is not None and gpu_memory_mib > 60 * 1024 and subtotal < 10240:
            breakdown["floor_10GiB"] = 10240 - subtotal
        if decode_graph and moe_a2a_backend in _DEEPEP:
            breakdown["deepep_buffers"] = 2048
    return breakdown


def _graph_reserve_mb(max_bs: int, *, attn_dp: int, use_mla: bool, prefill_max: int,
                      decode_graph: bool, prefill_graph: bool, prefill_graph_breakable: bool,
                      moe_a2a_backend: str) -> float:
    """reserve_for_graph_mb: the MiB the decode and prefill CUDA graphs are given."""
    graphs = 0.0
    if decode_graph:
        graphs += max_bs * 2
    if attn_dp > 1:
        graphs += max_bs * attn_dp * 3
        if max_bs > 300:
            graphs += max_bs * attn_dp * 1.5
    if prefill_graph:
        if use_mla:
            graphs += 1.5 * 1024
        else:
            graphs += len(prefill_capture_sizes(prefill_max)) * 8
        if prefill_graph_breakable and moe_a2a_backend in _DEEPEP:
            graphs += 1024
    return graphs


def _server_args_hook_breakdown(
    gpu_memory_mib: float | None, settings: _ReserveTerms, speculative_algorithm: str | None
) -> dict[str, float]:
    """0.5.10.post1's reserve (server_args.py::_handle_gpu_memory_settings, 1281-1322): the
    same terms without deepep's or post-capture sizing, the piecewise (prefill) graphs off
    where _handle_piecewise_cuda_graph (1078-1102) turns them off, and the draft's 4/6 GiB
    added after the 10 GiB floor."""
    piecewise_off = (
        speculative_algorithm is not None or settings.attn_dp > 1 or settings.pp > 1
        or settings.moe_a2a_backend != "none"
    )
    breakdown = _reserve_breakdown(gpu_memory_mib, replace(
        settings, prefill_graph=settings.prefill_graph and not piecewise_off,
        moe_a2a_backend="none", post_capture_kv_sizing=False,
        disaggregation_mode="null"))  # its PD rules are not transcribed
    if speculative_algorithm == "STANDALONE":
        breakdown["speculative"] = 6 * 1024  # "standalone draft model and cuda graphs"
    elif speculative_algorithm not in (None, "NGRAM"):
        breakdown["speculative"] = 4 * 1024  # "eagle draft models and cuda graphs"
    return breakdown


def _default_fraction(gpu_memory_mib: float | None, version: str, settings: _ReserveTerms,
                      speculative_algorithm: str | None) -> tuple[float, dict[str, float]]:
    """SGLang's own mem_fraction_static, (G - R) / G to 3 places, and R by cause."""
    if version in _SERVER_ARGS_HOOK:
        breakdown = _server_args_hook_breakdown(gpu_memory_mib, settings, speculative_algorithm)
    else:
        breakdown = _reserve_breakdown(gpu_memory_mib, settings)
    if gpu_memory_mib is None:
        return (0.88 if version in _OLD_RULES else 0.95), breakdown
    return round((gpu_memory_mib - sum(breakdown.values())) / gpu_memory_mib, 3), breakdown


def memory_defaults(gpu_memory_mib: float | None,
                    settings: MemorySettings = MemorySettings()) -> MemoryDefaults:
    """Reproduce handle_gpu_memory_settings for a non-VLM CUDA launch (a PD role too).

    ``gpu_memory_mib`` is nvidia-smi's memory.total (min over GPUs). Explicit values
    (chunked_prefill_size, decode_max_bs, mem_fraction_static) win, as in SGLang.
    In 0.5.19 attention-DP is ``--enable-dp-attention --dp-size N``; pass N as attn_dp.
    ``speculative_algorithm`` (EAGLE, NEXTN, STANDALONE, NGRAM...) matters to 0.5.10.post1
    only, whose reserve grows with it; ``speculative`` alone counts as EAGLE there.
    """
    m = settings
    tp, attn_dp, use_mla, version = m.tp, m.attn_dp, m.use_mla, m.version
    chunked_prefill_size, decode_max_bs = m.chunked_prefill_size, m.decode_max_bs
    max_running_requests, mem_fraction_static = m.max_running_requests, m.mem_fraction_static
    speculative_algorithm = m.speculative_algorithm
    _check_version(version)
    default_cps, default_bs = capacity_defaults(gpu_memory_mib, tp, version)
    cps = chunked_prefill_size if chunked_prefill_size is not None else default_cps
    max_bs = decode_max_bs if decode_max_bs is not None else default_bs
    if (
        version not in _OLD_RULES
        and decode_max_bs is None
        and max_running_requests is not None
        and max_bs > max_running_requests
    ):
        max_bs = max_running_requests
    speculative = m.speculative or bool(speculative_algorithm)
    captures = tuple(decode_capture_sizes(max_bs, speculative))

    # Prefill graph max_bs as the hook sets it, even when chunking is off (cps = -1): the
    # reserve below still counts the MLA prefill graphs then, as SGLang does.
    prefill_max = cps
    if use_mla:
        prefill_max = 2048 if version in _OLD_RULES else min(8192, cps)

    breakdown: dict[str, float] = {}
    if mem_fraction_static is not None:
        mfs, is_default, reserved = mem_fraction_static, False, 0.0
    else:
        is_default = True
        terms = _ReserveTerms(
            tp=tp, pp=m.pp, attn_dp=attn_dp, use_mla=use_mla, cps=cps,
            max_prefill_tokens=m.max_prefill_tokens, max_bs=max_bs, prefill_max=prefill_max,
            decode_graph=m.decode_graph, prefill_graph=m.prefill_graph,
            prefill_graph_breakable=m.prefill_graph_breakable,
            moe_a2a_backend=m.moe_a2a_backend, post_capture_kv_sizing=m.post_capture_kv_sizing,
            disaggregation_mode=m.disaggregation_mode,
            decode_tokens=(max_running_requests or max_bs or 1) * (m.num_draft_tokens or 1))
        spec = speculative_algorithm or ("EAGLE" if speculative else None)
        mfs, breakdown = _default_fraction(gpu_memory_mib, version, terms, spec)
        reserved = sum(breakdown.values())

    per_dp = cps // attn_dp if (attn_dp > 1 and cps > 0) else cps
    return MemoryDefaults(
        version=version,
        gpu_memory_mib=gpu_memory_mib,
        chunked_prefill_size=cps,
        chunked_prefill_size_per_dp=per_dp,
        decode_max_bs=max_bs,
        decode_capture_sizes=captures,
        prefill_graph_max_bs=prefill_max if prefill_max > 0 else None,
        mem_fraction_static=mfs,
        mem_fraction_is_default=is_default,
        reserved_mb=reserved,
        reserve_breakdown=breakdown,
    )
