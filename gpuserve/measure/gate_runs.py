"""What the measuring stage runs on a host, and what it makes of the output.

Why a module of its own: ``gates.py`` judges figures; this module says *what runs on the
host* (the build and measure scripts, as text) and turns what came back into a choice, a
record and the host's ``measured.json``. Both are pure, so the role (roles/gpu_gates)
only moves text between them and the host, and every decision is unit-tested here.

How: docs/gpu-gates.md, "gpuserve.measure.gate_runs: the build and measure scripts"
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuserve.errors import InputError
from gpuserve.measure import gates
from gpuserve.parsers.common import ParseError
from gpuserve.parsers.nccl_tests import NcclTestsResult, parse_nccl_tests
from gpuserve.parsers.p2p_bandwidth import P2PBandwidthReport, parse_p2p_bandwidth

GATES_ROOT = "/opt/gpuserve/gates"
MEASURED_JSON = "/etc/gpuserve/measured.json"
MARKER = "##gpuserve-gate-run##"
MODES = ("auto", "on", "off")
#: One sweep per env: small sizes for the latency figure, 1-4 GiB for the gate sizes
#: (expectations.yaml judges busbw at 2 GiB or 4 GiB, never the sweep average).
ALL_REDUCE_ARGS = ("-b", "8", "-e", "4G", "-f", "2")
#: exit status of ``timeout`` when it killed the command (124), or of a KILL (137)
HANG_STATUSES = (124, 137)
NCCL_TOOL, P2P_TOOL = "nccl-tests", "cuda-samples"

#: nccl-tests collectives the stage can run (``<name>_perf``), in run order.
COLLECTIVES = ("all_reduce", "all_gather", "alltoall")
ALL_REDUCE_ONLY = ("all_reduce",)

DEFAULTS_DOC = {
    "gates": "auto",
    "gates_timeout": 600,
    "gates_remeasure": False,
    "gates_sources": {},
    "gates_collectives": None,
}


@dataclass(frozen=True)
class GateSettings:
    """Validated host data of the measuring stage."""

    mode: str
    timeout_s: float
    remeasure: bool
    sources: dict[str, gates.ToolSource]
    root: str = GATES_ROOT
    collectives: tuple[str, ...] = ALL_REDUCE_ONLY


def gate_settings(data: Mapping[str, Any], source: str,
                  profile_ref: Any = None) -> GateSettings:
    """Host data ``gates``, ``gates_timeout``, ``gates_remeasure``, ``gates_sources``,
    ``gates_collectives`` (``profile_ref``: host data ``profile``, see
    :func:`gate_collectives`), checked before anything runs; ``InputError`` names the
    inventory and the key.

    YAML reads ``on``/``off`` as booleans, so ``true``/``false`` mean on/off too."""
    mode = data.get("gates", "auto")
    if isinstance(mode, bool):
        mode = "on" if mode else "off"
    if mode not in MODES:
        raise InputError(source, "gates", f"must be one of {', '.join(MODES)}, got {mode!r}")
    timeout = data.get("gates_timeout", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 1 <= timeout <= 7200:
        raise InputError(source, "gates_timeout",
                         f"must be seconds per tool run, 1 to 7200, got {timeout!r}")
    remeasure = data.get("gates_remeasure", False)
    if not isinstance(remeasure, bool):
        raise InputError(source, "gates_remeasure", f"must be true or false, got {remeasure!r}")
    sources = gates.load_sources(overrides=data.get("gates_sources") or {},
                                 overrides_source=source)
    for name in (NCCL_TOOL, P2P_TOOL):
        if name not in sources:
            raise InputError(str(gates.SOURCES_PATH), f"tools.{name}", "is required")
    collectives = gate_collectives(data, source, profile_ref if mode != "off" else None)
    return GateSettings(mode, float(timeout), remeasure, sources, collectives=collectives)


def gate_collectives(data: Mapping[str, Any], source: str,
                     profile_ref: Any = None) -> tuple[str, ...]:
    """Which nccl-tests collectives the host's gates run, in :data:`COLLECTIVES` order.

    Host data ``gates_collectives: [all_reduce, all_gather, alltoall]`` says so outright
    (all_reduce is required: the NCCL env is chosen from it). Without it, the host's
    profile decides: the same inventory's ``profile`` (the serve deploy's key) naming a
    profile with expert parallelism (``parallel.ep > 1`` or a ``moe.a2a_backend``, which
    makes SGLang run EP) adds all_gather and alltoall, the collectives EP's dispatch and
    combine move tokens with; any other profile, or none, measures all-reduce only.

    Why the profile and not a key of its own by default: the host deploy runs before
    anything is served, and the profile is already the one place that says the host
    serves EP; a second key would drift from it. A profile that does not load leaves
    all-reduce only (the serve deploy refuses that profile with the reason).
    """
    raw = data.get("gates_collectives")
    if raw is None:
        return COLLECTIVES if _serves_ep(profile_ref) else ALL_REDUCE_ONLY
    if not isinstance(raw, list | tuple) or not all(isinstance(c, str) for c in raw):
        raise InputError(source, "gates_collectives",
                         f"must be a list of {', '.join(COLLECTIVES)}, got {raw!r:.60}")
    unknown = [c for c in raw if c not in COLLECTIVES]
    if unknown:
        raise InputError(source, "gates_collectives",
                         f"unknown collective {unknown[0]!r:.40} (known: "
                         f"{', '.join(COLLECTIVES)})")
    if "all_reduce" not in raw:
        raise InputError(source, "gates_collectives",
                         "must include all_reduce (the NCCL env is chosen from it)")
    return tuple(c for c in COLLECTIVES if c in raw)


def _serves_ep(profile_ref: Any) -> bool:
    from gpuserve.launch.profiles import load_profile, profile_ref_problem

    if not isinstance(profile_ref, str) or not profile_ref \
            or profile_ref_problem(profile_ref):
        return False
    try:
        profile = load_profile(profile_ref)
    except InputError:
        return False
    backend = profile.moe.a2a_backend
    return profile.parallel.ep > 1 or backend not in (None, "", "none")


# ----------------------------------------------------------------------------- NCCL


@dataclass(frozen=True)
class NcclLib:
    """The NCCL the tools are built against and run with.

    ``origin``: ``venv`` (the ``nvidia-nccl-cu*`` wheel in the SGLang venv the unit
    runs: the library that serves) or ``system`` (libnccl2/libnccl-dev)."""

    origin: str
    include: str
    lib: str

    @property
    def key(self) -> str:
        """A short name for directory names: another NCCL is another build."""
        if self.origin == "system":
            return "system"
        return "venv-" + hashlib.sha256(self.lib.encode()).hexdigest()[:10]


#: Prints ``venv <nvidia/nccl dir>`` for the venv the SGLang unit runs, else
#: ``system <lib dir>`` where libnccl2 put libnccl.so.2 and libnccl-dev nccl.h.
NCCL_LOCATION_COMMAND = (
    "u=/etc/systemd/system/gpuserve-sglang.service; "
    "v=$(sed -n 's|^ExecStart=\\(/[^ ]*\\)/bin/python[0-9.]* .*|\\1|p' \"$u\" 2>/dev/null "
    "| head -n1); "
    "if [ -n \"$v\" ]; then for d in \"$v\"/lib/python3*/site-packages/nvidia/nccl; do "
    "[ -f \"$d/lib/libnccl.so.2\" ] && [ -f \"$d/include/nccl.h\" ] && "
    "{ echo \"venv $d\"; exit 0; }; done; fi; "
    "for l in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do "
    "[ -e \"$l/libnccl.so.2\" ] && [ -f /usr/include/nccl.h ] && "
    "{ echo \"system $l\"; exit 0; }; done; true"
)


def parse_nccl_location(lines: Iterable[str]) -> NcclLib | None:
    """The output of :data:`NCCL_LOCATION_COMMAND`; None when the host has no NCCL."""
    for line in lines:
        kind, _, path = line.strip().partition(" ")
        if kind == "venv" and path.startswith("/"):
            return NcclLib("venv", f"{path}/include", f"{path}/lib")
        if kind == "system" and path.startswith("/"):
            return NcclLib("system", "/usr/include", path)
    return None


# ----------------------------------------------------------------------------- build


def gencode(compute_caps: Iterable[str | None]) -> str:
    """nvcc ``-gencode`` flags for the host's GPUs only (``12.0`` -> sm_120): one arch
    built in about 3 min on 2 cores against five for the Makefile default (gpu-gates.md
    §2). Unknown capabilities give "" (the Makefile's default list)."""
    archs = sorted({c.replace(".", "") for c in compute_caps
                    if c and c.replace(".", "").isdigit()}, key=int)
    return " ".join(f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs)


def tool_dir(root: str, src: gates.ToolSource, nccl: NcclLib | None = None) -> str:
    """``<root>/<tool>-<version>-<pin 12>[-<nccl key>]``: one build per version, pin and
    (for nccl-tests) NCCL library."""
    pin = (src.commit or src.sha256 or "unpinned")[:12]
    name = f"{src.name}-{src.version or 'unversioned'}-{pin}"
    return f"{root}/{name}-{nccl.key}" if nccl is not None else f"{root}/{name}"


STAMP = ".gpuserve-built"


def stamp_text(src: gates.ToolSource, nccl: NcclLib | None) -> str:
    doc = {"tool": src.name, "version": src.version, "commit": src.commit,
           "sha256": src.sha256, "url": src.url,
           "nccl": None if nccl is None else {"origin": nccl.origin, "lib": nccl.lib}}
    return json.dumps(doc, sort_keys=True) + "\n"


def _fetch_lines(src: gates.ToolSource) -> list[str]:
    q = shlex.quote
    fail = f"gpuserve: gates: {src.name}"
    if src.sha256:
        return [
            f"curl -fsSL --retry 3 -o src.tar.gz {q(src.url)}",
            "got=$(sha256sum src.tar.gz | cut -d' ' -f1)",
            f"if [ \"$got\" != {src.sha256} ]; then echo {q(fail + ': archive ' + src.url)}"
            f"\" has sha256 $got, pinned {src.sha256} (tools.{src.name}.sha256)\" >&2; "
            "exit 3; fi",
            "mkdir src && tar -xzf src.tar.gz -C src --strip-components=1 --no-same-owner",
        ]
    return [
        "git init -q src",
        f"git -C src fetch -q --depth 1 {q(src.url)} {src.commit}",
        "git -C src checkout -q FETCH_HEAD",
        "head=$(git -C src rev-parse HEAD)",
        f"if [ \"$head\" != {src.commit} ]; then echo {q(fail + ': checkout of ' + src.url)}"
        f"\" is at $head, pinned {src.commit} (tools.{src.name}.commit)\" >&2; exit 3; fi",
    ]


#: The build script's phase lines (``build_progress`` reads the last one).
BUILD_PHASE = "gpuserve gates build: "


def build_progress(lines: list[str], elapsed_s: float) -> str:
    """``compiling, 40 s``: the build script's last phase line, and the time so far."""
    phases = [line[len(BUILD_PHASE):] for line in lines if line.startswith(BUILD_PHASE)]
    return f"{phases[-1] if phases else 'starting'}, {elapsed_s:.0f} s"


def build_script(src: gates.ToolSource, dest: str, cuda_home: str,
                 nccl: NcclLib | None, arch_flags: str) -> str:
    """The root shell script that fetches, verifies, builds and installs one tool into
    ``dest`` (``dest/bin/<binary>`` and the stamp), renamed into place when complete."""
    q = shlex.quote
    lines = [
        "set -eu",
        "umask 022",
        f"dest={q(dest)}",
        'mkdir -p "$(dirname "$dest")"',
        'w=$(mktemp -d /var/tmp/gpuserve-gates.XXXXXX)',
        'trap \'rm -rf "$w"\' EXIT',
        'cd "$w"',
        f"echo {q(BUILD_PHASE + 'fetching and checking the pinned source')}",
        *_fetch_lines(src),
        'mkdir -p out/bin',
        f"echo {q(BUILD_PHASE + 'compiling')}",
    ]
    if src.name == NCCL_TOOL:
        if nccl is None:
            raise ValueError("nccl-tests needs an NCCL library to build against")
        gen = f" NVCC_GENCODE={q(arch_flags)}" if arch_flags else ""
        lines += [
            # fix 1 (gpu-gates.md §2): the wheel has no unversioned libnccl.so for -lnccl
            "mkdir -p ncclhome/lib",
            f"ln -s {q(nccl.include)} ncclhome/include",
            f"ln -s {q(nccl.lib + '/libnccl.so.2')} ncclhome/lib/libnccl.so.2",
            "ln -s libnccl.so.2 ncclhome/lib/libnccl.so",
            f"make -C src -j\"$(nproc)\" CUDA_HOME={q(cuda_home)} "
            f"NCCL_HOME=\"$w/ncclhome\"{gen} >build.log 2>&1 "
            "|| { tail -n 30 build.log >&2; exit 4; }",
        ]
        built = "src/build"
    else:
        sub = str(src.build.get("subdir", "Samples/5_Domain_Specific/p2pBandwidthLatencyTest"))
        lines += [
            f"cmake -S src/{q(sub)} -B cbuild -DCMAKE_CUDA_COMPILER={q(cuda_home)}/bin/nvcc "
            ">build.log 2>&1 || { tail -n 30 build.log >&2; exit 4; }",
            "cmake --build cbuild -j\"$(nproc)\" >>build.log 2>&1 "
            "|| { tail -n 30 build.log >&2; exit 4; }",
        ]
        built = "cbuild"
    lines.append(f"echo {q(BUILD_PHASE + 'installing into ' + dest)}")
    for binary in src.binaries:
        lines.append(f"install -m 755 {built}/{q(binary)} out/bin/")
    lines += [
        f"printf '%s' {q(stamp_text(src, nccl))} > out/{STAMP}",
        'rm -rf "$dest.new" && cp -a out "$dest.new" && chown -R root:root "$dest.new"',
        'rm -rf "$dest" && mv "$dest.new" "$dest"',
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunSpec:
    """One tool invocation: ``label`` is ``p2p_on`` / ``p2p_off`` (all-reduce),
    ``<collective>:p2p_on`` / ``:p2p_off`` (all-gather, all-to-all) or ``matrix``
    (p2pBandwidthLatencyTest)."""

    tool: str
    binary: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""


def run_label(collective: str, env_label: str) -> str:
    return env_label if collective == "all_reduce" else f"{collective}:{env_label}"


def run_plan(nccl_bin: str, p2p_bin: str, gpus: int, driver_p2p: str | None,
             virtualization: str | None = None,
             collectives: Iterable[str] = ALL_REDUCE_ONLY) -> list[RunSpec]:
    """The runs of one measurement: each collective (all-reduce first) with P2P off
    always, with P2P on only where the driver reports P2P (else it is not a candidate),
    and the P2P matrices once (they measure P2P=Enabled and =Disabled themselves).

    A VM guest counts too: its driver reports P2P only where the hypervisor gave its GPUs
    a P2P clique (QEMU x-nv-gpudirect-clique), and whether that path works and is faster
    is exactly what the runs tell (a hang is killed at the timeout and keeps P2P off).
    ``virtualization`` is kept for the callers' record."""
    envs: list[tuple[dict[str, str], str]] = []
    if driver_p2p == "ok":
        envs.append(({}, "p2p_on"))
    envs.append(({"NCCL_P2P_DISABLE": "1"}, "p2p_off"))
    args = ("-g", str(gpus), *ALL_REDUCE_ARGS)
    wanted = set(collectives) | {"all_reduce"}
    runs = [RunSpec(f"{c}_perf", f"{nccl_bin}/{c}_perf", args, dict(env), run_label(c, label))
            for c in COLLECTIVES if c in wanted for env, label in envs]
    runs.append(RunSpec("p2pBandwidthLatencyTest", f"{p2p_bin}/p2pBandwidthLatencyTest", (),
                        {}, "matrix"))
    return runs


def measure_script(runs: Iterable[RunSpec], timeout_s: float, ld_library_path: str) -> str:
    """Each run under ``timeout`` (then KILL 10 s later), stdin closed, stderr with stdout,
    followed by ``<MARKER> <index> <status>``."""
    q = shlex.quote
    parts = []
    for i, run in enumerate(runs):
        env = " ".join(f"{k}={q(v)}" for k, v in sorted(run.env.items()))
        argv = " ".join(q(a) for a in (run.binary, *run.args))
        parts.append(
            f"LD_LIBRARY_PATH={q(ld_library_path)} {env} timeout -k 10 {timeout_s:g} "
            f"{argv} </dev/null 2>&1; echo \"{MARKER} {i} $?\"")
    return "\n".join(parts)


@dataclass(frozen=True)
class RunOutcome:
    spec: RunSpec
    status: int | None  # None: the script ended before this run reported
    text: str
    timeout_s: float

    @property
    def hung(self) -> bool:
        return self.status in HANG_STATUSES

    def summary(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"tool": self.spec.tool, "label": self.spec.label,
                               "argv": [self.spec.binary.rsplit("/", 1)[-1], *self.spec.args],
                               "env": dict(self.spec.env), "status": self.status}
        if self.hung:
            doc["hang"] = {"timeout_s": self.timeout_s}
        return doc


def split_runs(lines: Iterable[str], runs: list[RunSpec], timeout_s: float) -> list[RunOutcome]:
    """The measure script's output, one outcome per run (in order)."""
    chunks: dict[int, tuple[int, list[str]]] = {}
    current: list[str] = []
    for line in lines:
        if line.startswith(MARKER + " "):
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit() and parts[2].lstrip("-").isdigit():
                chunks[int(parts[1])] = (int(parts[2]), current)
                current = []
                continue
        current.append(line)
    outcomes = []
    for i, spec in enumerate(runs):
        status, text = chunks.get(i, (None, []))
        outcomes.append(RunOutcome(spec, status, "\n".join(text), timeout_s))
    return outcomes


# ----------------------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    """What one measurement decided: the NCCL choice, verdicts, the record, report lines."""

    choice: gates.NcclChoice | None
    topology: str | None
    figures: dict[str, float]
    verdicts: list[gates.GateVerdict]
    record: dict[str, Any]
    lines: list[str]
    problems: list[str]  # why the host is not ready; empty when it is

    @property
    def ready(self) -> bool:
        return not self.problems


def _all_reduce(outcome: RunOutcome | None, size: int, problems: list[str]
                ) -> tuple[gates.Measurement | gates.Hang | None, NcclTestsResult | None]:
    if outcome is None:
        return None, None
    env = dict(outcome.spec.env)
    if outcome.hung:
        return gates.Hang(outcome.spec.tool, outcome.timeout_s, env), None
    try:
        result = parse_nccl_tests(outcome.text)
        m = gates.measurement_from(result, size, env)
    except (ParseError, InputError) as e:
        problems.append(f"{outcome.spec.tool} ({_env_label(env)}) exited {outcome.status} "
                        f"without a usable result: {e}")
        return None, None
    if outcome.status not in (0, None):
        problems.append(f"{outcome.spec.tool} ({_env_label(env)}) exited {outcome.status}")
    return m, result


def _env_label(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "NCCL defaults"


def gate_size(exp: gates.Expectations, topology: str | None) -> int:
    """The busbw gate size of the class (the largest all_reduce_busbw size it names)."""
    sizes = [c.size_bytes for c in exp.classes.get(topology or "", ())
             if c.metric == "all_reduce_busbw" and c.size_bytes]
    return max(sizes) if sizes else 2147483648


def evaluate(
    outcomes: list[RunOutcome], *, host: str, timestamp: str, facts: Mapping[str, Any],
    driver_p2p: str | None, exp: gates.Expectations,
    sources: Mapping[str, gates.ToolSource], records: Iterable[Mapping[str, Any]] = (),
) -> Evaluation:
    """Choose the NCCL env from the runs, judge the figures, build the record (GPUs:
    ``facts["gpus"]``, as nvidia-smi lists them).

    The topology class is first taken from the driver's view to know the gate size;
    then again with the measured P2P (a P2P path that hung or lost is judged as
    PCIe without P2P)."""
    gpus, problems, lines = len(facts["gpus"]), [], []
    by_label = {o.spec.label: o for o in outcomes}
    size = gate_size(exp, gates.topology_class(facts))
    on, on_result = _all_reduce(by_label.get("p2p_on"), size, problems)
    off, off_result = _all_reduce(by_label.get("p2p_off"), size, problems)
    matrix = by_label.get("matrix")
    report: P2PBandwidthReport | None = None
    if matrix is not None and not matrix.hung:
        try:
            report = parse_p2p_bandwidth(matrix.text)
        except ParseError as e:
            problems.append(f"p2pBandwidthLatencyTest exited {matrix.status} without "
                            f"matrices: {e}")
    choice: gates.NcclChoice | None = None
    if off is not None:
        choice = gates.choose_nccl_env(driver_p2p, on, off, exp.p2p_margin)
        p2p_hangs = [o for o in outcomes if o.hung and (
            o.spec.label == "matrix" or o.spec.label.endswith(":p2p_on"))]
        if choice.p2p and p2p_hangs:
            what = p2p_hangs[0]
            with_p2p = "" if what.spec.label == "matrix" else " with P2P on"
            choice = gates.NcclChoice(
                False, {"NCCL_P2P_DISABLE": "1"}, True,
                f"{what.spec.tool} hung{with_p2p} (killed after {what.timeout_s:g} s): P2P "
                f"off although all_reduce_perf was faster with P2P", choice.numbers)
        if not choice.ready:
            problems.append(choice.reason)
    else:
        problems.append("all_reduce_perf with NCCL_P2P_DISABLE=1 gave no result: no NCCL "
                        "env could be chosen from measurement")
    topology = gates.topology_class(facts, None if choice is None else choice.p2p)
    chosen = on_result if choice is not None and choice.p2p else off_result
    others = _other_collectives(outcomes, choice, problems)
    verdicts: list[gates.GateVerdict] = []
    figures: dict[str, float] = {}
    if topology is not None:
        figures = gates.gate_figures(exp.classes[topology], chosen, report, others)
        verdicts = gates.judge_class(exp, topology, figures, records=records, host=host,
                                     gpus=gpus)
    for name, result in sorted(others.items()):
        # recorded at the gate size and small sizes; judged only where expectations.yaml
        # names them (gate_figures above)
        figures.update(gates.collective_figures(name, result, size))
    if chosen is not None:
        verdicts.append(gates.judge_gpus(chosen, gpus))
    if report is not None and choice is not None:
        verdicts.append(_matrix_verdict(report, choice, exp))
    hangs = [o for o in outcomes if o.hung]
    for o in hangs:
        hang = gates.Hang(o.spec.tool, o.timeout_s, dict(o.spec.env))
        verdicts.append(gates.judge_hang(hang))
        lines.append(f"gates: {o.spec.tool} ({_env_label(o.spec.env)}) hung: killed after "
                     f"{o.timeout_s:g} s")
    for v in verdicts:
        failed = v.status in (gates.GateStatus.FAIL, gates.GateStatus.MISSING)
        if failed and not v.check.endswith(":no_hang"):
            problems.append(f"{v.check}: {v.message}")
    if choice is not None:
        lines.append(f"gates: NCCL env chosen from measurement: {choice.reason}")
    for v in verdicts:
        lines.append(f"gates: {v.check}: {v.status}: {v.message}")
    nccl = gates.nccl_version("\n".join(o.text for o in outcomes
                                         if o.spec.tool == "all_reduce_perf"))
    record = gates.measure_record(
        gates.RecordHeader(host, timestamp, topology, sources, nccl),
        runs=[o.summary() for o in outcomes], figures=figures, choice=choice,
        verdicts=verdicts)
    return Evaluation(choice, topology, figures, verdicts, record, lines, problems)


def _other_collectives(outcomes: list[RunOutcome], choice: gates.NcclChoice | None,
                       problems: list[str]) -> dict[str, NcclTestsResult]:
    """All-gather and all-to-all (EP hosts) under the chosen env, parsed. A hang or a run
    without a result on the chosen path is a problem: EP would move its tokens there."""
    if choice is None:
        return {}
    label = "p2p_on" if choice.p2p else "p2p_off"
    results: dict[str, NcclTestsResult] = {}
    for o in outcomes:
        name, _, env_label = o.spec.label.partition(":")
        if env_label != label or name not in COLLECTIVES:
            continue
        where = f"{o.spec.tool} ({_env_label(o.spec.env)}, the chosen path)"
        if o.hung:
            problems.append(f"{where} hung: killed after {o.timeout_s:g} s")
            continue
        try:
            results[name] = parse_nccl_tests(o.text)
        except ParseError as e:
            problems.append(f"{where} exited {o.status} without a usable result: {e}")
            continue
        if o.status not in (0, None):
            problems.append(f"{where} exited {o.status}")
    return results


def _matrix_verdict(report: P2PBandwidthReport, choice: gates.NcclChoice,
                    exp: gates.Expectations) -> gates.GateVerdict:
    """The P2P matrices against the choice. P2P kept on must be real P2P on every pair
    (a fail otherwise). P2P kept off is safe whatever the matrices say: copies can work
    over P2P while NCCL's P2P transport hangs or loses (rtx6kpro#15), so working pairs
    are said, not failed."""
    verdict = gates.judge_p2p_matrix(report, choice.p2p, exp)
    if choice.p2p or verdict.passed:
        return verdict
    return gates.GateVerdict(
        verdict.check, gates.GateStatus.SKIP, f"P2P copies work ({verdict.measured:g} GPU "
        "pairs behave as P2P) but NCCL's P2P path was measured slower or hung: kept off",
        measured=verdict.measured, expected=verdict.expected)


# ----------------------------------------------------------------------------- host state


@dataclass(frozen=True)
class MeasuredOn:
    """The host a measurement ran on, as far as its figures depend on it: the GPUs (by
    UUID), the driver, the driver's P2P verdict and the virtualization."""

    gpu_uuids: tuple[str, ...]
    driver: str | None
    driver_p2p: str | None = None
    virtualization: str | None = None


def fingerprint(sources: Mapping[str, gates.ToolSource], nccl: NcclLib | None,
                on: MeasuredOn, settings_timeout: float, expectations_text: str,
                collectives: Iterable[str] = ALL_REDUCE_ONLY) -> str:
    """What a measurement depends on: when it is unchanged, the last one still holds and
    the stage measures nothing (host data ``gates_remeasure: true`` forces it). The
    driver's P2P verdict counts: it decides whether the P2P path is measured at all (an
    ACS or IOMMU change shows there first). So do the collectives run (an EP profile
    adds all-gather and all-to-all); all-reduce alone leaves the fingerprint as it was
    before they existed, so hosts measured then are not measured again for nothing."""
    doc = {"tools": {n: [s.commit, s.sha256] for n, s in sorted(sources.items())},
           "nccl": None if nccl is None else [nccl.origin, nccl.lib],
           "gpus": sorted(on.gpu_uuids), "driver": on.driver, "timeout": settings_timeout,
           "driver_p2p": on.driver_p2p, "virtualization": on.virtualization,
           "expectations": hashlib.sha256(expectations_text.encode()).hexdigest()}
    wanted = [c for c in COLLECTIVES if c in set(collectives) | {"all_reduce"}]
    if wanted != list(ALL_REDUCE_ONLY):
        doc["collectives"] = wanted
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def measured_json(ev: Evaluation, fp: str) -> str:
    """``/etc/gpuserve/measured.json``: the last measurement's choice and figures, read by
    roles/nccl (nccl.env and host.json follow it), by tests/host and, gathered with the
    host-facts document, by the doctor (verdicts carry their numbers: measured, expected
    or baseline, limit). No timestamp, so
    the same measurement writes the same bytes and a rerun changes nothing."""
    doc = {"schema": "gpuserve.measured/1", "fingerprint": fp,
           "topology_class": ev.topology,
           "choice": ev.choice.to_dict() if ev.choice else None,
           "figures": dict(sorted(ev.figures.items())),
           "ready": ev.ready, "problems": list(ev.problems),
           "verdicts": [{"check": v.check, "status": v.status, "message": v.message,
                         "measured": v.measured, "expected": v.expected, "limit": v.limit,
                         "unit": v.unit, "reference": v.reference} for v in ev.verdicts]}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def read_measured(text: str | None, source: str = MEASURED_JSON) -> dict[str, Any] | None:
    """``measured.json`` back; None when absent or not ours (then the driver's verdict
    rules, as before any measurement)."""
    if not text or not text.strip():
        return None
    from gpuserve import safeload

    doc = safeload.loads_json(text, source, safeload.CONFIG)
    if not isinstance(doc, dict) or doc.get("schema") != "gpuserve.measured/1":
        raise InputError(source, "schema", "must be 'gpuserve.measured/1'")
    choice = doc.get("choice")
    if choice is not None and not (isinstance(choice, dict)
                                   and isinstance(choice.get("p2p"), bool)
                                   and isinstance(choice.get("env"), dict)):
        raise InputError(source, "choice", "must be an object with p2p and env")
    return doc
