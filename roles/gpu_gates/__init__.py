"""Measured P2P and NCCL gates: build the measuring tools, run them, choose the NCCL env.

Why: what the driver reports (``nvidia-smi topo -p2p``) and what the box does differ (a
VM without P2P, RTX PRO 6000 hosts whose P2P transport hangs, custom all-reduce over
PCIe); so once the host is provisioned this stage measures its collectives and
GPU-to-GPU paths and lets the measurement choose the NCCL env (decisions:
gpuserve/measure/gate_runs.py and gates.py).

How: docs/gpu-gates.md, "gpuserve.roles.gpu_gates: build, measure, write"
"""

from __future__ import annotations

import datetime as _dt

from pyinfra import host, logger, state
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Command

from gpuserve.host import defaults as host_defaults
from gpuserve.host import nccl_env
from gpuserve.measure import gate_runs, gates
from gpuserve.measure.results import safe_name
from gpuserve.roles.base import managed, planned, progress
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.prefetch import Read, fact, fact_if_unchanged

DEFAULTS = host_defaults.GPU_GATES

BUILD_PACKAGES = ["build-essential", "cmake"]
SYSTEM_NCCL_PACKAGES = ["libnccl2", "libnccl-dev"]
CUDA_HOME = "/usr/local/cuda"
#: The longest one tool's build may run before the host fails.
BUILD_TIMEOUT_S = 3600


def _facts():
    from gpuserve.facts import gpu
    from gpuserve.facts import host as host_facts

    return gpu, host_facts


def reads(settings: gate_runs.GateSettings) -> list[Read]:
    """Everything this role reads, for the deploy's prefetch (roles/base/prefetch.py)."""
    if settings.mode == "off":
        return []
    gpu, host_facts = _facts()
    packages = [*BUILD_PACKAGES, *SYSTEM_NCCL_PACKAGES, *_git(settings)]
    return [Read.of(gpu.NvidiaGpus), Read.of(gpu.NvidiaTopology), Read.of(gpu.NvidiaDriver),
            Read.of(host_facts.Virtualization),
            *(Read.of(gpu.NvidiaP2P, mode=m) for m in ("r", "w")),
            Read.of(Command, command=gate_runs.NCCL_LOCATION_COMMAND),
            Read.of(FileContents, path=gate_runs.MEASURED_JSON),
            managed.read(settings.root),
            *(managed.read_package(p) for p in packages)]


def stamp_reads(settings: gate_runs.GateSettings) -> list[Read]:
    """The build stamps ``build_tool`` checks, once the first batch has told where NCCL
    is (the nccl-tests directory is named after it): for the deploy to defer into its
    next batch (roles/base/prefetch.defer), so that a rerun reads them in no command of their
    own. Without an NCCL yet (a first run) that stamp is read when its build runs."""
    if settings.mode == "off":
        return []
    nccl = nccl_location(now=False)
    nccl_dir, p2p_dir = _build_dirs(settings, nccl)
    dirs = [nccl_dir, p2p_dir] if nccl is not None else [p2p_dir]
    return [managed.read(f"{d}/{gate_runs.STAMP}") for d in dirs]


def _git(settings: gate_runs.GateSettings) -> list[str]:
    return ["git"] if any(s.sha256 is None for s in settings.sources.values()) else []


def nccl_location(now: bool = True) -> gate_runs.NcclLib | None:
    read = fact_if_unchanged if now else fact
    out = read(Command, command=gate_runs.NCCL_LOCATION_COMMAND) or ""
    return gate_runs.parse_nccl_location(str(out).splitlines())


class GateMeasure(FactBase):
    """Run the measuring tools (gate_runs.measure_script); their output with markers.

    A fact, not an operation command: measuring reads the box and changes nothing, so a
    run that only measures counts as no change (see roles/checks on how pyinfra counts)."""

    def command(self, script: str) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(script))

    def process(self, output: list[str]) -> list[str]:
        return output


def _build_dirs(settings: gate_runs.GateSettings, nccl: gate_runs.NcclLib | None
                ) -> tuple[str, str]:
    return (gate_runs.tool_dir(settings.root, settings.sources[gate_runs.NCCL_TOOL], nccl),
            gate_runs.tool_dir(settings.root, settings.sources[gate_runs.P2P_TOOL]))


@operation()
def build_tool(tool: str, settings: gate_runs.GateSettings):
    """Fetch, verify and build one tool unless its directory holds a finished build.

    Decided at execute time: the toolkit, the NCCL packages and nvidia-smi (for the
    GPUs' architectures) come from earlier operations of a first run."""
    src = settings.sources[tool]
    nccl = nccl_location() if tool == gate_runs.NCCL_TOOL else None
    if tool == gate_runs.NCCL_TOOL and nccl is None:
        yield fail_host(f"gates: no NCCL library on {host.name} to build nccl-tests against "
                        "(neither the SGLang venv's nvidia-nccl wheel nor libnccl2)", [])
        return
    dest = gate_runs.tool_dir(settings.root, src, nccl)
    stamp = fact_if_unchanged(managed.PathState, path=f"{dest}/{gate_runs.STAMP}")  # deferred
    if stamp is not None and stamp.kind == "file" and stamp.user == "root":
        host.noop(f"{tool} already built in {dest}")
        return
    gpu, _ = _facts()
    caps = [g.get("compute_cap") for g in fact_if_unchanged(gpu.NvidiaGpus) or []]
    script = gate_runs.build_script(src, dest, CUDA_HOME, nccl, gate_runs.gencode(caps))
    # detached, polled with a progress line every 10 s (roles/base/progress.py)
    run_dir = progress.fresh_dir(f"build-{tool}")
    yield progress.start_command(run_dir, script)
    if not state.is_executing:
        return
    job = progress.wait(run_dir, f"^{gate_runs.BUILD_PHASE}", gate_runs.build_progress,
                        label=f"gates: build {tool}", timeout=BUILD_TIMEOUT_S)
    if job.rc != 0:
        yield fail_host(f"gates: building {tool} failed ({job.outcome(BUILD_TIMEOUT_S)}):",
                        job.tail)
        return
    yield StringCommand("rm", "-rf", QuoteString(run_dir))


def _results_root(results_dir: str):
    from gpuserve.serve.checks import results_root

    return results_root(results_dir)


@operation(is_idempotent=True)
def measure(settings: gate_runs.GateSettings, nccl_overrides: dict[str, str],
            results_dir: str):
    """Measure (unless the last measurement still holds), choose, write, record, judge."""
    if not state.is_executing:
        return
    gpu, host_facts = _facts()
    gpus = fact_if_unchanged(gpu.NvidiaGpus) or []
    if len(gpus) < 2:
        if settings.mode == "on":
            yield fail_host(f"gates: {host.name} has {len(gpus)} GPU(s) visible to "
                            "nvidia-smi; gates: on needs two or more", [])
        else:
            host.noop(f"gates: {len(gpus)} GPU(s): nothing between GPUs to measure")
        return
    nccl = nccl_location()
    driver = (fact_if_unchanged(gpu.NvidiaDriver) or {}).get("version")
    virtualization = fact_if_unchanged(host_facts.Virtualization)
    verdict = nccl_env.combined_verdict(
        *(fact_if_unchanged(gpu.NvidiaP2P, mode=m) for m in ("r", "w")))
    on = gate_runs.MeasuredOn(tuple(str(g.get("uuid")) for g in gpus), driver, verdict,
                              virtualization)
    fp = gate_runs.fingerprint(settings.sources, nccl, on, settings.timeout_s,
                               gates.EXPECTATIONS_PATH.read_text(), settings.collectives)
    current = gate_runs.read_measured(
        "\n".join(fact_if_unchanged(FileContents, path=gate_runs.MEASURED_JSON) or []))
    if current is not None and current.get("fingerprint") == fp and not settings.remeasure:
        logger.info(f"{host.name}: gates: the last measurement still holds ({fp}; "
                    f"{(current.get('choice') or {}).get('reason', 'no choice')})")
        yield from _write_files(nccl_overrides, current.get("choice"), None)
        if not current.get("ready", False):
            yield fail_host(f"gates: {host.name} is not ready (last measurement):",
                            list(current.get("problems") or []))
        return
    nccl_dir, p2p_dir = _build_dirs(settings, nccl)
    runs = gate_runs.run_plan(f"{nccl_dir}/bin", f"{p2p_dir}/bin", len(gpus), verdict,
                              virtualization, settings.collectives)
    ld_path = ":".join(p for p in (nccl.lib if nccl else "", f"{CUDA_HOME}/lib64") if p)
    logger.info(f"{host.name}: gates: measuring {len(runs)} runs on {len(gpus)} GPUs "
                f"(driver P2P verdict {verdict or 'unknown'}, timeout "
                f"{settings.timeout_s:g} s per run)")
    output = host.get_fact(GateMeasure, script=gate_runs.measure_script(
        runs, settings.timeout_s, ld_path)) or []
    outcomes = gate_runs.split_runs(output, runs, settings.timeout_s)
    root = _results_root(results_dir) if results_dir else None
    host_dir = root / safe_name(host.name) if root else None
    records = gates.read_measure_records(host_dir) if host_dir and host_dir.is_dir() else []
    facts_doc = {"gpus": gpus, "virtualization": virtualization,
                 "topology": {"links": (fact_if_unchanged(gpu.NvidiaTopology) or {})
                              .get("links"), "p2p": verdict}}
    ev = gate_runs.evaluate(
        outcomes, host=host.name, timestamp=_dt.datetime.now(_dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"), facts=facts_doc, driver_p2p=verdict,
        exp=gates.load_expectations(), sources=settings.sources, records=records)
    for line in ev.lines:
        logger.info(f"{host.name}: {line}")
    if root is not None:
        try:
            path = gates.write_measure_record(root, ev.record)
            logger.info(f"{host.name}: gates: recorded {path}")
        except OSError as e:
            logger.warning(f"{host.name}: gates: result not recorded: {e}")
    choice = ev.choice.to_dict() if ev.choice else None
    yield from _write_files(nccl_overrides, choice, gate_runs.measured_json(ev, fp))
    if not ev.ready:
        yield fail_host(f"gates: {host.name} is not ready (measured vs expected):",
                        ev.problems)


def _write_files(overrides: dict[str, str], choice: dict | None, measured: str | None):
    """measured.json (when given), then nccl.env and host.json as roles/nccl renders them
    from this choice; each only where the host's file differs."""
    from gpuserve.roles import nccl

    wanted = []
    if measured is not None:
        wanted.append((gate_runs.MEASURED_JSON, measured))
    plan = nccl.current_plan(overrides, measured=choice)
    wanted += [(nccl_env.NCCL_ENV_PATH, nccl_env.render_env_file(plan)),
               (nccl_env.HOST_JSON_PATH, nccl_env.host_json(plan))]
    changed = yield from managed.write_changed(wanted)
    if not changed:
        host.noop("measured.json, NCCL env and host.json are up to date")


def note_builds(settings: gate_runs.GateSettings) -> None:
    """The builds a dry run's preview lists: each tool whose directory holds no
    finished build (the stamps the deploy's second batch read)."""
    dirs = _build_dirs(settings, nccl_location(now=False))
    for tool, dest in zip((gate_runs.NCCL_TOOL, gate_runs.P2P_TOOL), dirs, strict=True):
        stamp = managed.state(f"{dest}/{gate_runs.STAMP}")
        if not (stamp.kind == "file" and stamp.user == "root"):
            planned.action(f"build {tool} {settings.sources[tool].version} into {dest}")


@deploy("Measured GPU gates")
def measure_gpu_gates(settings: gate_runs.GateSettings, nccl_overrides: dict[str, str],
                      results_dir: str):
    if settings.mode == "off":
        return
    managed.packages(name="build tools for the measuring tools ("
                     + ", ".join(BUILD_PACKAGES + _git(settings)) + ")",
                     packages=BUILD_PACKAGES + _git(settings))
    if nccl_location(now=False) is None:
        # no SGLang venv yet (a first host deploy) and no system NCCL: NVIDIA's packages
        managed.packages(name="system NCCL (libnccl2, libnccl-dev) for nccl-tests",
                         packages=SYSTEM_NCCL_PACKAGES)
    managed.directory(name=f"{settings.root} (measuring tools)", path=settings.root,
                      user="root", group="root", mode="755")
    if planned.collecting():
        note_builds(settings)
    for tool in (gate_runs.NCCL_TOOL, gate_runs.P2P_TOOL):
        src = settings.sources[tool]
        build_tool(name=f"build {tool} {src.version} ({(src.commit or src.sha256)[:12]})",
                   tool=tool, settings=settings)
    planned.action("measure all-reduce and P2P unless the last measurement still holds "
                   "(a read; its choice writes nccl.env and host.json as noted above)",
                   changes=False)
    measure(name="measure all-reduce and P2P; choose the NCCL env",
            settings=settings, nccl_overrides=nccl_overrides, results_dir=results_dir)
