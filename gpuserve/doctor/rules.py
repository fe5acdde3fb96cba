"""The doctor: check a profile (and its rendered launch) against a host's facts.

Each lesson learnt the hard way (field notes, SGLang issues) becomes a rule, so the next
deploy on a similar box fails in seconds on a laptop instead of minutes into a model load
on the GPU host. Rule metadata (id, severity, title, fix, source, thresholds) is data in
``gpuserve/data/rules/doctor.yaml``; the predicate for each id is a function here that
returns the evidence it saw, or None when the rule does not apply. Unknown facts
(``null`` in the document) never fire a rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from gpuserve import safeload, versions
from gpuserve.errors import InputError
from gpuserve.host import fabric
from gpuserve.host.hostfacts import HostFacts
from gpuserve.host.nccl_env import NcclPlan, plan_nccl
from gpuserve.launch.dialect import Launch, render_launch, target_version
from gpuserve.launch.profiles import Profile
from gpuserve.paths import DATA_DIR

RULES_PATH = DATA_DIR / "rules" / "doctor.yaml"
SEVERITIES = ("error", "warn", "info")
GIB = 1024  # MiB


@dataclass(frozen=True)
class RuleMeta:
    """A rule's data. ``sets``: the profile fields its fix sets ({field, value}; no value:
    the fix names none), ``drops``: flags it removes; both checked against every shipped
    version's flag catalog (tests/unit/doctor/test_rule_fixes.py). ``versions``: overrides
    of fix, sets, drops and params for a version range (since/until, inclusive), for a rule
    whose fix is not the same on every SGLang lane."""

    id: str
    severity: str
    title: str
    fix: str
    source: str
    params: dict[str, Any]
    sets: tuple[dict[str, Any], ...] = ()
    drops: tuple[str, ...] = ()
    versions: tuple[dict[str, Any], ...] = ()

    def for_version(self, version: str) -> RuleMeta:
        """The rule as it reads on ``version``: the first matching ``versions`` entry's
        fix, sets, drops and params over the rule's own."""
        for entry in self.versions:
            since, until = entry.get("since"), entry.get("until")
            if since and versions.parse(version) < versions.parse(str(since)):
                continue
            if until and versions.parse(version) > versions.parse(str(until)):
                continue
            return replace(
                self, fix=entry.get("fix", self.fix),
                sets=tuple(entry.get("sets", self.sets)),
                drops=tuple(entry.get("drops", self.drops)),
                params={**self.params, **(entry.get("params") or {})}, versions=())
        return self


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    title: str
    evidence: str
    fix: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Context:
    """What a predicate may look at. ``launch`` is None when the profile did not render."""

    profile: Profile
    facts: HostFacts
    version: str
    launch: Launch | None
    render_error: InputError | None
    params: dict[str, Any]
    measured: Any = None  # the host's measured start (gpuserve.memory.measured), or None

    # ---- shared views

    @property
    def env(self) -> dict[str, str]:
        return self.launch.env if self.launch else dict(self.profile.env)

    @property
    def args(self) -> list[str]:
        return self.launch.args if self.launch else list(self.profile.extra_args)

    @property
    def host_nccl(self) -> NcclPlan:
        """The NCCL env and custom all-reduce choice the host deploy renders from these
        facts (roles/nccl, roles/gpu_gates: the measured choice, else the driver's P2P
        verdict), which the unit reads before the profile's env (host data ``nccl_env``
        overrides are not in the facts)."""
        return host_nccl_plan(self.facts)

    @property
    def effective_env(self) -> dict[str, str]:
        """The server's environment as the unit builds it: the host's nccl.env, then the
        profile's env (a later name wins)."""
        return {**self.host_nccl.env, **self.env}

    def custom_all_reduce_off(self) -> bool:
        """Whether the launch runs without SGLang's custom all-reduce: the profile says so,
        or the host's host.json adds ``--disable-custom-all-reduce``."""
        return (self.profile.communication.disable_custom_all_reduce
                or self.flag_present("--disable-custom-all-reduce")
                or self.host_nccl.disable_custom_all_reduce)

    def flag_present(self, flag: str) -> bool:
        return any(a == flag or a.startswith(f"{flag}=") for a in self.args)

    @property
    def sm120(self) -> bool:
        return 12 in self.facts.sm_majors

    @property
    def blackwell(self) -> bool:
        return any(m >= 10 for m in self.facts.sm_majors)

    @property
    def pcie_only(self) -> bool:
        """No NVLink between the GPUs (False when unknown)."""
        return self.facts.topology.nvlink is False

    @property
    def p2p(self) -> str | None:
        return self.facts.topology.p2p

    @property
    def arch(self) -> Any:
        """The model record named by model.arch (gpuserve.memory.models), or None."""
        return _arch(self.profile.model.arch)

    @property
    def nvfp4(self) -> bool:
        quant = (self.profile.model.quantization or "").lower()
        if "fp4" in quant:
            return True
        record = self.arch
        if record is not None and record.quantization is not None:
            return "fp4" in record.quantization.method
        return "nvfp4" in self.profile.model.path.lower()

    @property
    def dsa(self) -> bool:
        record = self.arch
        if record is not None:
            return record.attention == "dsa"
        att = self.profile.attention
        return bool(att.dsa_prefill_backend or att.dsa_decode_backend)

    def decode_max_bs(self) -> int | None:
        """The decode graph max bs SGLang will use: the profile's, else its default."""
        if self.profile.memory.cuda_graph_max_bs is not None:
            return self.profile.memory.cuda_graph_max_bs
        defaults = self.memory_defaults()
        return defaults.decode_max_bs if defaults else None

    def plan(self) -> Any:
        """The planner's prediction for this profile on this host (None if it cannot say):
        calibrated by ``measured`` (the host's start) when given, else checked against
        the real starts the model record quotes ("risky" where they disagree)."""
        from gpuserve.memory.calibration import calibrate_or_check

        try:
            plan = self._predict({})
            if plan is None:
                return None
            try:
                return calibrate_or_check(plan, record=self.arch,
                                          replan=lambda at: self._predict({}, at),
                                          measured=self.measured,
                                          checkpoint=self.profile.model.path)[0]
            except InputError:  # measured on another card: the plan stands uncalibrated
                return plan
        except (ValueError, InputError):
            # settings the planner does not model (e.g. an NVFP4 KV cache): no prediction,
            # other rules judge those settings
            return None

    def _predict(self, overrides: dict, layout: Any = None) -> Any:
        """The planner on the profile's launch with ``overrides`` (a measured launch's)
        or another ``layout``; None without a model record or the GPUs' memory."""
        record = self.arch
        if record is None or self.facts.min_memory_mib is None:
            return None
        from gpuserve.memory.memory_defaults import KNOWN_VERSIONS
        from gpuserve.memory.planner import PlanRequest, predict
        from gpuserve.memory.preflight import launch_settings

        p = self.profile
        settings = launch_settings(p, overrides)
        majors = self.facts.sm_majors
        return predict(record, PlanRequest(
            gpu_memory_mib=self.facts.min_memory_mib,
            gpu_count=len(self.facts.gpus) or p.gpus,
            sm_major=max(majors) if majors else None, layout=layout or settings.layout,
            version=self.version if self.version in KNOWN_VERSIONS else KNOWN_VERSIONS[-1],
            **settings.knobs))

    def memory_defaults(self) -> Any:
        """SGLang's auto memory settings for this launch (gpuserve.memory.memory_defaults)."""
        if self.facts.min_memory_mib is None:
            return None
        try:
            from gpuserve.memory.memory_defaults import (
                KNOWN_VERSIONS,
                MemorySettings,
                memory_defaults,
            )
        except ImportError:  # pragma: no cover - planner side not present
            return None
        version = self.version if self.version in KNOWN_VERSIONS else KNOWN_VERSIONS[-1]
        p = self.profile
        record = self.arch
        return memory_defaults(self.facts.min_memory_mib, MemorySettings(
            tp=p.parallel.tp, attn_dp=p.parallel.attention_dp,
            use_mla=bool(record and record.is_mla), version=version,
            chunked_prefill_size=p.memory.chunked_prefill_size,
            decode_max_bs=p.memory.cuda_graph_max_bs,
            max_running_requests=p.memory.max_running_requests,
            moe_a2a_backend=p.moe.a2a_backend or "none",
            speculative=bool(p.speculative.algorithm)),
        )


def host_nccl_plan(facts: HostFacts) -> NcclPlan:
    """:func:`gpuserve.host.nccl_env.plan_nccl` over a facts document: its measured choice
    (when the measuring stage recorded one) under the driver verdict it was taken with."""
    m = facts.measured
    measured = None
    if m is not None and m.state == "measured" and m.env is not None:
        measured = {"env": m.env, "reason": m.reason or "",
                    "disable_custom_all_reduce": m.disable_custom_all_reduce,
                    "numbers": {"driver_p2p": m.driver_p2p}}
    return plan_nccl(facts.virtualization, facts.topology.p2p,
                     gpu_count=len(facts.gpus) or None, measured=measured)


@cache
def _arch(name: str | None) -> Any:
    if not name:
        return None
    try:
        from gpuserve.memory.models import load_record
        return load_record(name)
    except (ImportError, InputError):
        return None


Predicate = Callable[[Context], "str | None"]
PREDICATES: dict[str, Predicate] = {}


def rule(rule_id: str) -> Callable[[Predicate], Predicate]:
    def register(fn: Predicate) -> Predicate:
        PREDICATES[rule_id] = fn
        return fn
    return register


@cache
def load_rules(path: Path = RULES_PATH) -> tuple[RuleMeta, ...]:
    data = safeload.load_yaml_file(path)
    metas = []
    for index, raw in enumerate((data or {}).get("rules") or []):
        where = f"rules[{index}]"
        for key in ("id", "severity", "title", "fix", "source"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise InputError(path, f"{where}.{key}", "required string")
        if raw["severity"] not in SEVERITIES:
            raise InputError(path, f"{where}.severity", f"must be one of {SEVERITIES}")
        _check_versions(path, where, raw.get("versions") or [])
        metas.append(RuleMeta(raw["id"], raw["severity"], raw["title"], raw["fix"],
                              raw["source"], dict(raw.get("params") or {}),
                              tuple(raw.get("sets") or ()), tuple(raw.get("drops") or ()),
                              tuple(raw.get("versions") or ())))
    return tuple(metas)


def _check_versions(path: Path, where: str, entries: list) -> None:
    """A ``versions`` entry names its range and overrides only what RuleMeta.for_version
    reads, so a typo fails by name instead of silently keeping the newest lane's fix."""
    for index, entry in enumerate(entries):
        at = f"{where}.versions[{index}]"
        if not isinstance(entry, dict) or not (entry.get("since") or entry.get("until")):
            raise InputError(path, at, "needs since and/or until")
        unknown = set(entry) - {"since", "until", "fix", "sets", "drops", "params", "note"}
        if unknown:
            raise InputError(path, at, f"unknown keys: {', '.join(sorted(unknown))}")


def resolve_version(profile: Profile, facts: HostFacts, explicit: str | None) -> str:
    """--sglang-version, else what the host has installed, else the profile's newest."""
    from gpuserve.launch import catalog

    if explicit:
        return catalog.base_version(explicit)
    if facts.sglang_version:
        return catalog.base_version(facts.sglang_version)
    return target_version(profile)


def diagnose(profile: Profile, facts: HostFacts, version: str | None = None,
             measured: Any = None) -> list[Finding]:
    """Run every rule; findings come back ordered error, warn, info. ``measured`` (a
    MeasuredStart of this host: the same checkpoint and version) calibrates the memory
    plan the rules judge."""
    version = resolve_version(profile, facts, version)
    launch: Launch | None = None
    render_error: InputError | None = None
    try:
        launch = render_launch(profile, version)
    except InputError as exc:
        render_error = exc
    findings = []
    for meta in (m.for_version(version) for m in load_rules()):
        predicate = PREDICATES.get(meta.id)
        if predicate is None:
            raise InputError(RULES_PATH, meta.id,
                             "rule has no predicate in gpuserve/doctor/rules.py")
        ctx = Context(profile, facts, version, launch, render_error, meta.params, measured)
        evidence = predicate(ctx)
        if evidence:
            findings.append(Finding(meta.id, meta.severity, meta.title, evidence, meta.fix,
                                    meta.source))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order[f.severity])


def _older(version: str, than: str) -> bool:
    return versions.parse(version) < versions.parse(than)


def _env_true(env: dict[str, str], key: str) -> bool:
    return env.get(key, "").strip().lower() in ("1", "true", "yes", "on")


def _where(ctx: Context, dotted: str) -> str:
    origin = ctx.profile.where(dotted)
    name = Path(origin.file).name
    return f"{name}:{origin.line}" if origin.line else name


# ============================================================================ predicates


@rule("profile-render")
def _profile_render(ctx: Context) -> str | None:
    return str(ctx.render_error) if ctx.render_error else None


@rule("gpu-count")
def _gpu_count(ctx: Context) -> str | None:
    have, need = len(ctx.facts.gpus), ctx.profile.gpus
    if have and need > have:
        return f"profile needs {need} GPUs (tp {ctx.profile.parallel.tp} x dp " \
               f"{ctx.profile.parallel.dp}); host has {have}"
    return None


@rule("sglang-cuda-lane")
def _sglang_cuda_lane(ctx: Context) -> str | None:
    if _older(ctx.version, ctx.params["cuda13_since"]):
        return None
    driver = versions.loose(ctx.facts.driver_version)
    minimum = versions.parse(ctx.params["min_driver"])
    toolkit = versions.loose(ctx.facts.cuda.toolkit)
    problems = []
    if driver is not None and driver < minimum:
        problems.append(f"driver {ctx.facts.driver_version} < {ctx.params['min_driver']}")
    if toolkit is not None and toolkit.major < 13:
        problems.append(f"CUDA toolkit {ctx.facts.cuda.toolkit}")
    if problems:
        return f"SGLang {ctx.version} is CUDA 13 only; host has {', '.join(problems)}"
    return None


@rule("blackwell-open-driver")
def _blackwell_open_driver(ctx: Context) -> str | None:
    if ctx.blackwell and ctx.facts.driver.flavour == "proprietary":
        return f"compute capability {', '.join(sorted(ctx.facts.compute_caps))} with the " \
               f"proprietary driver {ctx.facts.driver_version or ''}".rstrip()
    return None


@rule("blackwell-driver-branch")
def _blackwell_driver_branch(ctx: Context) -> str | None:
    driver = versions.loose(ctx.facts.driver_version)
    if ctx.blackwell and driver is not None and driver.major < ctx.params["min_major"]:
        return f"driver {ctx.facts.driver_version} on compute capability " \
               f"{', '.join(sorted(ctx.facts.compute_caps))}"
    return None


@rule("nvfp4-weights-arch")
def _nvfp4_weights_arch(ctx: Context) -> str | None:
    majors = ctx.facts.sm_majors
    if ctx.nvfp4 and majors and min(majors) < ctx.params["min_sm_major"]:
        return f"NVFP4 checkpoint ({ctx.profile.model.path}) on compute capability " \
               f"{', '.join(sorted(ctx.facts.compute_caps))}"
    return None


@rule("nvfp4-kv-arch")
def _nvfp4_kv_arch(ctx: Context) -> str | None:
    majors = ctx.facts.sm_majors
    if ctx.profile.memory.kv_cache_dtype == "nvfp4" and majors \
            and min(majors) < ctx.params["min_sm_major"]:
        return f"memory.kv_cache_dtype nvfp4 ({_where(ctx, 'memory.kv_cache_dtype')}) on " \
               f"compute capability {', '.join(sorted(ctx.facts.compute_caps))}"
    return None


@rule("nvfp4-cuda")
def _nvfp4_cuda(ctx: Context) -> str | None:
    toolkit = versions.loose(ctx.facts.cuda.toolkit)
    if ctx.nvfp4 and ctx.blackwell and toolkit is not None \
            and toolkit < versions.parse(ctx.params["min_toolkit"]):
        return f"NVFP4 on compute capability {', '.join(sorted(ctx.facts.compute_caps))} " \
               f"with CUDA toolkit {ctx.facts.cuda.toolkit}"
    return None


@rule("shared-experts-fusion-nvfp4")
def _shared_experts_fusion(ctx: Context) -> str | None:
    if not ctx.nvfp4 or ctx.profile.moe.disable_shared_experts_fusion:
        return None
    if not _older(ctx.version, ctx.params["auto_disabled_since"]):
        return None
    return f"NVFP4 checkpoint on SGLang {ctx.version} without " \
           f"moe.disable_shared_experts_fusion"


@rule("allreduce-fusion-sm120")
def _allreduce_fusion_sm120(ctx: Context) -> str | None:
    used = [f for f in ctx.params["flags"] if ctx.flag_present(f)]
    if used and ctx.sm120:
        return f"{', '.join(used)} in the launch; GPUs are SM120 " \
               f"({', '.join(sorted(ctx.facts.compute_caps))})"
    return None


@rule("torch-symm-mem-sm120")
def _torch_symm_mem_sm120(ctx: Context) -> str | None:
    used = [f for f in ctx.params["flags"] if ctx.flag_present(f)]
    if used and ctx.sm120:
        return f"{', '.join(used)} in the launch; GPUs are SM120"
    return None


@rule("nccl-algo-tree-cuda-graphs")
def _nccl_tree(ctx: Context) -> str | None:
    algo = ctx.env.get("NCCL_ALGO", "")
    if not algo or algo.strip().startswith("^"):
        return None
    if "tree" not in algo.lower():
        return None
    graphs_off = ctx.flag_present("--disable-cuda-graph") or \
        ctx.flag_present("--disable-decode-cuda-graph")
    if ctx.launch and ctx.launch.value("--cuda-graph-backend-decode") == "disabled":
        graphs_off = True
    if graphs_off:
        return None
    return f"NCCL_ALGO={algo} ({_where(ctx, 'env.NCCL_ALGO')}) with decode CUDA graphs on"


@rule("pcie-ipc-needs-p2p")
def _pcie_ipc(ctx: Context) -> str | None:
    if not _env_true(ctx.env, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE") \
            and not ctx.profile.communication.pcie_ipc_allreduce:
        return None
    problems = []
    if ctx.p2p in ("none", "partial"):
        problems.append(f"P2P is {ctx.p2p}")
    if ctx.profile.parallel.tp not in ctx.params["world_sizes"]:
        problems.append(f"tp {ctx.profile.parallel.tp} is not a supported world size "
                        f"({'/'.join(map(str, ctx.params['world_sizes']))}); it stays on NCCL")
    if problems:
        return f"PCIe-IPC all-reduce requested but {'; '.join(problems)}"
    return None


def _measured(ctx: Context) -> Any:
    """The host's last measurement (facts ``measured``), None when unknown or none."""
    m = ctx.facts.measured
    return m if m is not None and m.state == "measured" else None


def _env_text(env: dict[str, str] | None) -> str:
    if env is None:
        return "unknown"
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "NCCL defaults"


_P2P_WHY = {
    "hung": "P2P hung in the measuring run",
    "slower": "P2P was not measured working and faster",
    "not_measured": "P2P was not measured (driver verdict {driver}, or a VM): kept off",
}


@rule("allreduce-without-measured-p2p")
def _allreduce_measured(ctx: Context) -> str | None:
    """Custom / PCIe-IPC all-reduce need working peer access; the measurement, not the
    driver, says whether it works (facts ``measured``, gpuserve.measure.gates)."""
    measured = _measured(ctx)
    if measured is None or measured.p2p is None or measured.p2p:
        return None
    tp = ctx.profile.parallel.tp
    uses = []
    if tp >= 2 and not ctx.custom_all_reduce_off():
        uses.append("custom all-reduce (neither the profile nor the host's measured choice "
                    "turns it off)")
    if _env_true(ctx.env, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE") \
            or ctx.profile.communication.pcie_ipc_allreduce:
        uses.append("PCIe-IPC all-reduce")
    if not uses:
        return None
    result = measured.p2p_result or ("hung" if measured.p2p_hang else "slower")
    why = _P2P_WHY.get(result, _P2P_WHY["slower"]).format(
        driver=measured.driver_p2p or "unknown")
    busbw = measured.all_reduce_busbw_gbs
    figures = f", all-reduce busbw {busbw:g} GB/s on the chosen path" if busbw else ""
    env = f"; NCCL env chosen: {_env_text(measured.env)}" if measured.env is not None else ""
    record = f" (record {measured.record})" if measured.record else ""
    return f"{' and '.join(uses)} with tp {tp}; measured: {why}{figures}{env}{record}"


def _check_text(c: Any) -> str:
    if c.status == "missing":
        return f"{c.check}: not in the run ({c.message})" if c.message else \
            f"{c.check}: not in the run"
    return f"{c.check}: {c.message}"


@rule("measured-below-expectation")
def _measured_below(ctx: Context) -> str | None:
    """The host's last measurement fell short: a figure below its expectation or baseline
    (busbw at the gate size, small-message latency, P2P matrices), or not ready."""
    measured = _measured(ctx)
    if measured is None or (not measured.failed and measured.ready is not False):
        return None
    if ctx.profile.gpus < 2:
        return None  # one GPU: no collective on the launch's path
    parts = [_check_text(c) for c in measured.failed]
    if measured.ready is False:
        parts += [p for p in measured.problems if not any(c.check in p
                                                          for c in measured.failed)]
    where = f"class {measured.topology_class}" if measured.topology_class else "class unknown"
    env = _env_text(measured.env)
    record = f"; record {measured.record}" if measured.record else ""
    return f"{'; '.join(parts)} ({where}, NCCL env {env}{record})"


@rule("gates-not-measured")
def _gates_not_measured(ctx: Context) -> str | None:
    """No measurement behind the host's NCCL env, or one taken under another driver P2P
    verdict (the serve deploy then follows the driver's verdict, not the measurement)."""
    m = ctx.facts.measured
    gpus = len(ctx.facts.gpus)
    if m is None or gpus < 2 or ctx.profile.gpus < 2:
        return None
    if m.state == "none":
        return f"no measured.json on a host with {gpus} GPUs: its NCCL env and the " \
               f"custom all-reduce choice follow the driver's P2P verdict " \
               f"({ctx.p2p or 'unknown'}), not a measurement"
    if m.stale(ctx.p2p):
        return f"measured under driver P2P verdict {m.driver_p2p}, the driver now reports " \
               f"{ctx.p2p}: the measurement no longer applies (record {m.record or '?'})"
    return None


@rule("nccl-p2p-disable-missing")
def _nccl_p2p_missing(ctx: Context) -> str | None:
    """The host's nccl.env sets NCCL_P2P_DISABLE=1 without P2P; only the profile's env,
    read after it, can take it away (an override the profile insisted on)."""
    if ctx.p2p in ("none", "partial") and ctx.profile.parallel.tp > 1 \
            and not _env_true(ctx.effective_env, "NCCL_P2P_DISABLE"):
        if "NCCL_P2P_DISABLE" not in ctx.env:
            return f"topo -p2p verdict {ctx.p2p}; NCCL_P2P_DISABLE not set"
        return (f"topo -p2p verdict {ctx.p2p}; NCCL_P2P_DISABLE="
                f"{ctx.env['NCCL_P2P_DISABLE']} in the profile "
                f"({_where(ctx, 'env.NCCL_P2P_DISABLE')}) overrides the host's nccl.env")
    return None


@rule("nccl-p2p-disabled-needlessly")
def _nccl_p2p_needless(ctx: Context) -> str | None:
    measured = _measured(ctx)
    if measured is not None and measured.p2p is False and not measured.stale(ctx.p2p):
        return None  # the measurement kept P2P off too: the driver's "ok" is not the box
    if ctx.p2p == "ok" and _env_true(ctx.env, "NCCL_P2P_DISABLE"):
        return f"topo -p2p verdict ok; NCCL_P2P_DISABLE=1 ({_where(ctx, 'env.NCCL_P2P_DISABLE')})"
    return None


@rule("vm-without-p2p")
def _vm_without_p2p(ctx: Context) -> str | None:
    if ctx.facts.is_vm and ctx.p2p in ("none", "partial") and ctx.profile.parallel.tp > 1:
        return f"virtualization {ctx.facts.virtualization}, P2P {ctx.p2p}, " \
               f"tp {ctx.profile.parallel.tp}"
    return None


@rule("vm-allreduce-container-alternative")
def _vm_container_alternative(ctx: Context) -> str | None:
    """An all-reduce-bound layout (tp over GPUs, no expert parallelism) in a VM without
    P2P: the same GPUs in a container on that hypervisor keep the bare-metal P2P."""
    tp, ep = ctx.profile.parallel.tp, ctx.profile.parallel.ep
    if not (ctx.facts.is_vm and ctx.p2p in ("none", "partial") and tp > 1 and ep == 1):
        return None
    measured = _measured(ctx)
    figures = ""
    if measured is not None and measured.all_reduce_busbw_gbs:
        size = measured.all_reduce_size_bytes
        at = f" at {size} bytes" if size else ""
        figures = (f"; measured in this VM: all-reduce busbw {measured.all_reduce_busbw_gbs:g}"
                   f" GB/s{at}" + (f" (record {measured.record})" if measured.record else ""))
    return (f"tp {tp} without expert parallelism: every layer all-reduces over host memory "
            f"(virtualization {ctx.facts.virtualization}, P2P {ctx.p2p}){figures}")


@rule("iommu-p2p-bare-metal")
def _iommu_p2p(ctx: Context) -> str | None:
    k = ctx.facts.kernel
    if ctx.facts.is_vm is not False or ctx.p2p != "ok" or k.iommu != "on" or not k.cmdline:
        return None
    args = k.cmdline.split()
    if "iommu=pt" in args or "pci=noacs" in args or "amd_iommu=off" in args \
            or "intel_iommu=off" in args:
        return None
    if ctx.pcie_only:
        return f"bare metal, P2P ok over PCIe, IOMMU on, cmdline without iommu=pt: {k.cmdline}"
    return None


@rule("memory-plan")
def _memory_plan(ctx: Context) -> str | None:
    plan = ctx.plan()
    if plan is None or plan.verdict not in ctx.params["verdicts"]:
        return None
    cal = getattr(plan, "calibrated", None)
    if cal:
        return (f"{plan.verdict}, calibrated by the measured start {cal['source']}: "
                f"{cal['measured_after_gib']:.2f} GiB free after weights measured, "
                f"{cal['free_after_weights_gib']:.2f} +- {cal['uncertainty_gib']:.2f} GiB for "
                f"this launch; rest {cal['rest_gib']:+.2f} GiB at mem_fraction_static "
                f"{cal['mem_fraction_static']:.3f}; " + _minimum(cal["safe_mfs"]))
    return f"{plan.verdict}: weights {plan.weights_gib:.1f} GiB per GPU, KV budget " \
           f"{plan.rest_gib:.1f} GiB at mem_fraction_static {plan.mem_fraction_static:.3f}; " \
           + _minimum(math.ceil(plan.min_viable_mfs * 1000) / 1000)


def _minimum(fraction: float) -> str:
    """The one minimum fraction a memory finding names (the preflight's refusal names the
    same), or that none fits."""
    return f"minimum viable {fraction:.3f}" if fraction < 1 else "no mem_fraction_static fits"


@rule("memory-plan-risky")
def _memory_plan_risky(ctx: Context) -> str | None:
    plan = ctx.plan()
    if plan is None or plan.verdict not in ctx.params["verdicts"]:
        return None
    why = next((line for line in reversed(plan.explanation) if line.startswith("risky")), "")
    return f"{plan.verdict} at mem_fraction_static {plan.mem_fraction_static:.3f}: {why}" \
        + (f"; {plan.changes[0]}" if plan.changes else "")


@rule("ep-pcie-no-win")
def _ep_pcie_no_win(ctx: Context) -> str | None:
    if ctx.profile.parallel.ep > 1 and ctx.pcie_only:
        return f"ep {ctx.profile.parallel.ep} over PCIe (no NVLink)"
    return None


@rule("ep-memory")
def _ep_memory(ctx: Context) -> str | None:
    p = ctx.profile
    if p.parallel.ep <= 1:
        return None
    mfs = p.memory.mem_fraction_static
    if mfs is None:
        defaults = ctx.memory_defaults()
        auto = f" (SGLang would pick {defaults.mem_fraction_static:.3f})" if defaults else ""
        return f"ep {p.parallel.ep} with mem_fraction_static auto{auto}; the auto formula " \
               f"does not account for EP"
    defaults = ctx.memory_defaults()
    if defaults is not None and mfs <= defaults.mem_fraction_static:
        return f"ep {p.parallel.ep} with mem_fraction_static {mfs} " \
               f"({_where(ctx, 'memory.mem_fraction_static')}), not above SGLang's TP auto " \
               f"value {defaults.mem_fraction_static:.3f}"
    return None


@rule("a2a-forces-ep")
def _a2a_forces_ep(ctx: Context) -> str | None:
    p = ctx.profile
    if p.moe.a2a_backend in ctx.params["backends"] and p.parallel.ep != p.parallel.tp:
        return f"moe.a2a_backend {p.moe.a2a_backend} with ep {p.parallel.ep} != tp " \
               f"{p.parallel.tp}; SGLang will run ep {p.parallel.tp}"
    return None


@rule("ep-experts-divisible")
def _ep_experts_divisible(ctx: Context) -> str | None:
    """Each EP rank holds (routed + redundant) / ep experts; SGLang asserts it is whole."""
    p, record = ctx.profile, ctx.arch
    if p.parallel.ep <= 1 or record is None or not record.n_routed_experts:
        return None
    redundant = p.moe.num_redundant_experts or 0
    total = record.n_routed_experts + redundant
    if total % p.parallel.ep == 0:
        return None
    plus = f" + {redundant} redundant" if redundant else ""
    return f"{record.n_routed_experts} routed experts{plus} = {total} (model.arch " \
           f"{p.model.arch}) over ep {p.parallel.ep} leaves {total % p.parallel.ep} over"


@rule("tp-heads-divisible")
def _tp_heads_divisible(ctx: Context) -> str | None:
    """SGLang shards attention heads over the attention TP group (tp / attention_dp); a
    remainder aborts the model load on every rank. The planner's own check, so the
    doctor and the plan never disagree."""
    from gpuserve.memory.planner import Layout, heads_problems

    p, record = ctx.profile, ctx.arch
    if record is None:
        return None
    layout = Layout(tp=p.parallel.tp, attn_dp=max(p.parallel.attention_dp, 1))
    problems = heads_problems(record, layout)
    return "; ".join(problems) or None


@rule("decode-graph-bs-dsa")
def _decode_graph_bs_dsa(ctx: Context) -> str | None:
    mem = ctx.facts.min_memory_mib
    if not ctx.dsa or mem is None or mem >= ctx.params["below_gib"] * GIB:
        return None
    max_bs = ctx.decode_max_bs()
    if max_bs is None or max_bs <= ctx.params["max_bs"]:
        return None
    how = "memory.cuda_graph_max_bs" if ctx.profile.memory.cuda_graph_max_bs else \
        "SGLang's default"
    return f"DSA model, decode graph max bs {max_bs} ({how}) on {mem} MiB GPUs"


@rule("dsa-backend-sm120")
def _dsa_backend_sm120(ctx: Context) -> str | None:
    """A backend SM120 cannot run on this version (params.unsupported, per version), or
    none set where SGLang's own default is not one it can (params.default_ok_kv: the KV
    dtype under which the version's default is flashinfer_sparse_mla; absent: pin it)."""
    if not ctx.sm120 or not ctx.dsa:
        return None
    att, bad = ctx.profile.attention, ctx.params["unsupported"]
    chosen = [f"attention.{n} = {getattr(att, n)}"
              for n in ("dsa_prefill_backend", "dsa_decode_backend") if getattr(att, n) in bad]
    if chosen:
        return f"{', '.join(chosen)} on SM120 with SGLang {ctx.version}"
    unset = [n for n in ("dsa_prefill_backend", "dsa_decode_backend") if getattr(att, n) is None]
    kv, ok_kv = ctx.profile.memory.kv_cache_dtype, ctx.params.get("default_ok_kv")
    if unset and ok_kv is None:
        return f"attention.{unset[0]} unset on SGLang {ctx.version}: its default is not " \
               "pinned to a backend SM120 runs"
    if unset and kv != ok_kv:
        return f"attention.{unset[0]} unset with kv_cache_dtype {kv or 'auto'}: SGLang's " \
               f"default is not flashinfer_sparse_mla there (trtllm/flashmla) on SM120"
    return None


@rule("dp-attention-graph-bs")
def _dp_attention_graph_bs(ctx: Context) -> str | None:
    p = ctx.profile
    if p.parallel.attention_dp <= 1:
        return None
    max_bs = ctx.decode_max_bs()
    if max_bs is not None and max_bs > ctx.params["max_bs"]:
        return f"attention_dp {p.parallel.attention_dp} with decode graph max bs {max_bs}"
    if max_bs is None and p.memory.cuda_graph_max_bs is None:
        return f"attention_dp {p.parallel.attention_dp} with SGLang's default decode max bs"
    return None


@rule("spec-running-cap")
def _spec_running_cap(ctx: Context) -> str | None:
    algo = (ctx.profile.speculative.algorithm or "").upper()
    if algo in ctx.params["algorithms"] and ctx.profile.memory.max_running_requests is None:
        return f"speculative.algorithm {algo} and memory.max_running_requests unset"
    return None


@rule("spec-vs-baseline")
def _spec_vs_baseline(ctx: Context) -> str | None:
    algo = ctx.profile.speculative.algorithm
    if algo and ctx.pcie_only and ctx.profile.parallel.tp > 1:
        return f"speculative.algorithm {algo} with tp {ctx.profile.parallel.tp} over PCIe " \
               f"(no NVLink)"
    return None


@rule("fabric-not-ready")
def _fabric_not_ready(ctx: Context) -> str | None:
    verdict = fabric.judge(ctx.facts.fabric or ())
    if verdict.state == fabric.FabricState.READY:
        return None
    return (f"fabric registration {verdict.state}: {verdict.detail}; until every GPU shows "
            "State Completed / Status Success, CUDA fails with error 802")


@rule("memory-unbalanced")
def _memory_unbalanced(ctx: Context) -> str | None:
    if ctx.env.get("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "").strip() in ("0", "false"):
        return None
    used = ctx.facts.gpus[: ctx.profile.gpus] if ctx.profile.gpus else ctx.facts.gpus
    free = {g.index if g.index is not None else i: g.memory_free_mib
            for i, g in enumerate(used) if g.memory_free_mib is not None}
    if len(free) < 2:
        return None
    low, high = min(free.values()), max(free.values())
    if low < ctx.params["ratio"] * high:
        busy = sorted(i for i, f in free.items() if f < ctx.params["ratio"] * high)
        return f"free MiB min {low} < {ctx.params['ratio']} x max {high}; busy GPUs: " \
               f"{', '.join(map(str, busy))}"
    return None


@rule("nouveau-loaded")
def _nouveau(ctx: Context) -> str | None:
    return "nouveau is in /proc/modules" if ctx.facts.kernel.nouveau_loaded else None


@rule("persistence-mode")
def _persistence(ctx: Context) -> str | None:
    off = [str(g.index) for g in ctx.facts.gpus if g.persistence_mode == "Disabled"]
    return f"persistence mode Disabled on GPU {', '.join(off)}" if off else None


def _rdma_problems(ctx: Context, kind: str) -> str | None:
    """The evidence of one kind of RDMA fault in the host's record (None: no record)."""
    if ctx.facts.rdma is None:
        return None
    from gpuserve.host.rdma import problems

    found = [evidence for k, evidence in problems(ctx.facts.rdma) if k == kind]
    return "; ".join(found) or None


@rule("rdma-port-down")
def _rdma_port_down(ctx: Context) -> str | None:
    return _rdma_problems(ctx, "port_down")


@rule("rdma-no-roce-v2-gid")
def _rdma_no_roce_v2(ctx: Context) -> str | None:
    return _rdma_problems(ctx, "no_roce_v2_gid")


@rule("rdma-numa-mismatch")
def _rdma_numa(ctx: Context) -> str | None:
    return _rdma_problems(ctx, "numa_mismatch")


@rule("rdma-pair-slow")
def _rdma_pair_slow(ctx: Context) -> str | None:
    """A pair of hosts measured far below its link rate, or not measured (the tools
    failed), from the pair figures this host recorded as a client."""
    pairs = (ctx.facts.rdma or {}).get("pairs")
    if not pairs:
        return None
    from gpuserve.host.rdma_pairs import slow

    return "; ".join(slow(pairs)) or None


@rule("pd-without-rdma")
def _pd_without_rdma(ctx: Context) -> str | None:
    """A prefill or decode profile whose host recorded no ACTIVE RDMA port: the KV
    cache moves over TCP. Unknown (no record gathered) never fires."""
    spec = ctx.profile.disaggregation
    if spec is None or ctx.facts.rdma is None:
        return None
    active = [d for d in ctx.facts.rdma.get("devices") or [] if d.get("state") == "ACTIVE"]
    if active:
        return None
    from gpuserve.fleet.disaggregation import TCP_COST

    return (f"{spec.mode or 'PD'} with {spec.transfer_backend}, "
            f"{len(ctx.facts.rdma.get('devices') or [])} RDMA ports recorded, none ACTIVE: "
            f"TCP fallback; {TCP_COST}")


@rule("deepep-needs-nvlink")
def _deepep_needs_nvlink(ctx: Context) -> str | None:
    """DeepEP moves tokens over NVLink inside a node (its README's requirements); with
    neither NVLink nor peer access measured working it cannot run here. Unknown links,
    NVLink, or P2P measured working (or the driver's "ok" before any measurement) never
    fire."""
    backend = (ctx.launch.value("--moe-a2a-backend") if ctx.launch else None) \
        or ctx.profile.moe.a2a_backend
    if backend not in ctx.params["backends"] or ctx.profile.gpus < 2:
        return None
    if ctx.facts.topology.nvlink is not False:
        return None
    verdict = _p2p_verdict(ctx)
    if verdict is None:
        return None
    links = sorted({c.strip() for i, row in enumerate(ctx.facts.topology.links or [])
                    for j, c in enumerate(row) if i != j})
    vm = f" in a {ctx.facts.virtualization} guest" if ctx.facts.is_vm else ""
    return (f"moe.a2a_backend {backend} ({_where(ctx, 'moe.a2a_backend')}) on "
            f"{len(ctx.facts.gpus) or ctx.profile.gpus} GPUs joined by "
            f"{'/'.join(links) or 'PCIe'}, no NVLink{vm}; {verdict}")


def _p2p_verdict(ctx: Context) -> str | None:
    """What says peer access does not work here (the measurement first, else the driver's
    topo -p2p verdict), None when it works or nothing says."""
    measured = _measured(ctx)
    if measured is not None and measured.p2p is not None and not measured.stale(ctx.p2p):
        if measured.p2p:
            return None
        result = measured.p2p_result or ("hung" if measured.p2p_hang else "slower")
        why = _P2P_WHY.get(result, _P2P_WHY["slower"]).format(
            driver=measured.driver_p2p or "unknown")
        record = f" (record {measured.record})" if measured.record else ""
        return f"measured P2P: {why}{record}"
    if ctx.p2p in ("none", "partial"):
        return f"topo -p2p verdict {ctx.p2p}, P2P not measured working"
    return None


@rule("kernel-arch-unsupported")
def _kernel_arch_unsupported(ctx: Context) -> str | None:
    """Known from a start-up log only (gpuserve/data/rules/log_signatures.yaml): which
    kernel lacks a build shows in the traceback. The launches known to need one are
    allreduce-fusion-sm120, dsa-backend-sm120 and torch-symm-mem-sm120."""
    return None


@rule("nan-at-decode")
def _nan_at_decode(ctx: Context) -> str | None:
    """Known from a start-up or serving log only; on SM120 its known cause, a DSA backend
    that does not run there, is dsa-backend-sm120's."""
    return None


@rule("graph-capture-oom")
def _graph_capture_oom(ctx: Context) -> str | None:
    """Known from a start-up log only; the memory planner (memory-plan) and
    decode-graph-bs-dsa judge a launch's capture room beforehand."""
    return None


# ============================================================================ output


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def format_table(findings: list[Finding]) -> str:
    """A plain-text table: severity, id, evidence; then fix and source under each row."""
    if not findings:
        return "doctor: no findings"
    width = max(len(f.id) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{f.severity.upper():5}  {f.id:{width}}  {f.title}")
        pad = " " * (width + 9)
        lines.append(f"{pad}saw:    {f.evidence}")
        lines.append(f"{pad}fix:    {f.fix}")
        lines.append(f"{pad}source: {f.source}")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)
