"""Prepare-time plan of a serve deploy: host data, the lock, the preflight, the launch.

Everything that can be wrong with the input (host data types, the lock, the profile
file, a flag the target SGLang lacks) is found here and raised as ``InputError``, and
everything that makes the host unfit for the chosen lock (driver, Python, glibc, disk,
CUDA toolkit major) as ``PreflightError``, before deploy/serve.py adds a single
operation. Pure apart from the callables that read the host's facts, so tests drive it
with plain dicts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.fleet import disaggregation as disagg
from gpuserve.fleet.multinode import Member, NodePlacement, place_node
from gpuserve.host.nccl_env import HOST_JSON_PATH, sglang_flags_for_host
from gpuserve.host.proven import proven_on_host
from gpuserve.launch.bench import (
    BenchMode,
    OnRegression,
    client_argv,
    run_fingerprint,
    validate_mode,
    validate_on_regression,
)
from gpuserve.launch.catalog import available_versions, load_catalog
from gpuserve.launch.dialect import Launch, render_launch
from gpuserve.launch.hf_source import offline_path_problem
from gpuserve.launch.interpreter import (
    SGLANG,
    DistroFacts,
    InterpreterChoice,
    ManagedBuild,
    choose_interpreter,
)
from gpuserve.launch.lock_choice import (
    HostRuntime,
    PreflightError,
    choose_lock,
    cuda_home,
    preflight,
    public_version,
    wanted_locks,
)
from gpuserve.launch.locks import Lock, load_locks
from gpuserve.launch.profiles import Profile, load_profile, profile_ref_problem
from gpuserve.launch.secrets import is_secret_env_name, secret_flags
from gpuserve.launch.venvs import venv_path
from gpuserve.measure.bench_catalog import available_bench_versions, load_bench_catalog
from gpuserve.measure.health import health_generates
from gpuserve.measure.results import (
    RecordSpec,
    Served,
    launch_hash,
    record_spec,
    validate_results_dir,
)
from gpuserve.measure.starts import (
    Checkpoint,
    StartRecord,
    StartSpec,
    gpu_of,
    launch_of,
    read_starts,
)
from gpuserve.serve import checks, metrics, service, weights
from gpuserve.serve import install as sglang
from gpuserve.serve.checks import BenchPlan, results_root
from gpuserve.serve.checks import mark_path as bench_mark_path
from gpuserve.serve.preflight import PreflightMode, PreflightReport, run_preflight
from gpuserve.serve.preflight import validate_mode as validate_preflight


@dataclass(frozen=True, kw_only=True)
class ServePlan:
    """What the serve deploy does on one host, decided before any operation: the roles
    take it whole (roles/deploys/serve.py), and ``gpuserve check`` plans the same."""

    input: ServeInput  # the host data and profile it was planned from
    lock: Lock
    version: str  # the release whose flags are rendered (the lock's, without local part)
    runtime: HostRuntime  # what the host brings (GPUs, driver, the chosen interpreter)
    service: service.ServicePlan
    record: RecordSpec | None = None  # where the smoke check records (None: off)
    bench: BenchPlan | None = None  # the throughput checks (None: off)
    preflight: PreflightReport | None = None  # what the preflight printed (it raised errors)
    weights: weights.WeightsPlan | None = None  # a model.hf profile's fetch (roles/weights)
    start: StartSpec | None = None  # where the start's memory figures go (None: off)
    # where the launch's NCCL transport and custom all-reduce choice come from, and
    # whether that is a warning (no host record): transport_note
    transport: tuple[str, bool] = ("", False)
    pd: disagg.PdLaunch | None = None  # this host's role flags in a PD fleet
    notes: tuple[str, ...] = ()  # lines for the deploy's output (the interpreter chosen)

    @property
    def user(self) -> str:
        return self.input.settings.user

    @property
    def home(self) -> str:
        return self.input.settings.home

    @property
    def index_url(self) -> str | None:
        return self.input.settings.index_url

    @property
    def find_links(self) -> str | None:
        return self.input.settings.find_links

    @property
    def trusted_mirrors(self) -> tuple[str, ...]:
        return self.input.settings.trusted

    @property
    def health_timeout(self) -> float:
        return float(self.input.settings.timeout)

    @property
    def keep_venvs(self) -> int:
        return self.input.settings.keep

    @property
    def expect_gpus(self) -> int:
        return self.runtime.gpus

    @property
    def interpreter(self) -> InterpreterChoice | None:
        """The interpreter that builds the venv (None: python3)."""
        return self.runtime.interpreter

    @property
    def node(self) -> NodePlacement | None:
        """This host's part in a multi-node launch."""
        return self.input.placement

    @property
    def serves_http(self) -> bool:
        """False on a multi-node rank > 0: no HTTP there, so no smoke or bench either."""
        return self.node is None or self.node.is_head

    @property
    def served_name(self) -> str:
        return self.service.served_name

    @property
    def smoke_per_start(self) -> bool:
        return self.input.smoke_per_start

    @property
    def secrets(self) -> tuple[str, ...]:
        """The host data's secrets, for the preview's redaction."""
        return self.input.secrets

    @property
    def venv(self) -> str:
        return venv_path(self.home, self.lock, self.interpreter and self.interpreter.path)

    @property
    def python(self) -> str:
        """The venv's interpreter (the weights fetch and the bench run it)."""
        return f"{self.venv}/bin/python"

    @property
    def bin_dir(self) -> str:
        return sglang.bin_dir(self.home)

    @property
    def config_path(self) -> str:
        return service.CONFIG_PATH if self.service.config_text is not None else ""


#: A health gate longer than a day is a typo (or ``inf``), not a slow model.
MAX_HEALTH_TIMEOUT = 86_400


#: Host data of multi-node launches (gpuserve/fleet/multinode.py).
FLEET_DEFAULTS = {
    # the inventory group whose hosts run a profile with parallel.nnodes > 1, in rank order
    # accepts: str (an inventory group) or None
    "sglang_nodes_group": None,
    # the address the nodes reach each other on (node 0's is the dist-init address)
    # accepts: str (an IP address) or None
    "private_address": None,
    # one network interface for NCCL's and Gloo's sockets (NCCL/GLOO_SOCKET_IFNAME)
    # accepts: str (an interface name) or None
    "nccl_socket_ifname": None,
}


def defaults() -> dict:
    merged: dict = {
        # the launch profile to serve: a name in profiles/ or a YAML file's path (required;
        # deploy/host.py reads it too: an EP profile adds collectives to the measurement)
        # accepts: str
        "profile": None,
        **FLEET_DEFAULTS,
        **disagg.PD_DEFAULTS,
    }
    for layer in (sglang.DEFAULTS, service.DEFAULTS, checks.DEFAULTS, weights.DEFAULTS,
                  metrics.DEFAULTS):
        merged.update(layer)
    return merged


def optional_str(data: dict, key: str, source: str) -> str | None:
    """Host data ``key`` as a string, None when unset or empty (also the gateway's plan)."""
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InputError(source, key, f"must be a string, got {value!r:.60}")
    return value


@dataclass(frozen=True)
class _Settings:
    """The host data :func:`plan_serve` checks before it opens any file."""

    profile_ref: str
    pinned: str | None
    locks_dir: str | None
    user: str
    home: str
    keep: int
    index_url: str | None
    find_links: str | None
    timeout: float
    #: the validated ``trusted_mirrors`` (plain-http prefixes pip may trust)
    trusted: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ServeInput:
    """One host's host data and profile, parsed, typed and validated once (before any
    host or Hub read): the serve plan and the reads it needs are derived from this. Bad
    input raises here, naming file and field, in the order :func:`read_input` checks."""

    data: dict  # host data over defaults(), every value bounded
    source: str
    host_name: str
    settings: _Settings
    profile: Profile  # with this host's rank when it is a node of a multi-node launch
    placement: NodePlacement | None
    locks: tuple[Lock, ...]  # every lock the host may choose from (sglang_locks_dir)
    preflight: PreflightMode
    bench: BenchMode
    on_regression: OnRegression | None  # None: the profile's bench.on_regression
    results_dir: str | None  # None: recording off
    metrics: bool  # sglang_metrics
    quality_check: bool  # host data's quality_check
    service: service.ServiceData  # extra env, secrets, listen address, hardening
    python: sglang.PythonWish  # sglang_python, its mirror and the managed-CPython catalog
    pd: disagg.PdPlacement | None = None  # this host's role in a PD fleet (its profile's too)

    @property
    def candidate_locks(self) -> list[Lock]:
        """The locks :func:`plan_serve` will choose among (the profile's versions, the
        host's pin): the deploy reads their venvs in its first batch."""
        return wanted_locks(self.locks,
                            versions=self.profile.sglang_versions or available_versions(),
                            pinned=self.settings.pinned)

    @property
    def weights_target(self) -> tuple[str, str] | None:
        """(revision directory, models_dir) of a profile pinned to a Hub commit, read in
        the first batch; None otherwise (a path, a floating revision)."""
        hf = self.profile.model.source
        if hf is None or not hf.pinned:
            return None
        models_dir = weights.models_dir_of(self.data, self.source, self.settings.home)
        return hf.revision_dir(models_dir, hf.revision), models_dir

    @property
    def checkpoint_path(self) -> str | None:
        """The local checkpoint directory the preflight will scan, read in the first
        batch; None when nothing will be scanned (preflight off, a Hub id not pinned)."""
        if self.preflight == PreflightMode.OFF:
            return None
        if self.profile.model.hf:
            target = self.weights_target
            return target[0] if target else None
        path = self.profile.model.path
        return path if path.startswith("/") else None

    @property
    def launch_env(self) -> dict:
        """The server's environment as far as host data and profile give it: the
        profile's ``env`` under host data's ``sglang_extra_env``."""
        return {**self.profile.env, **self.service.extra_env}

    @property
    def smoke_per_start(self) -> bool:
        """One smoke completion per server start (its ``/health`` generates a token:
        gpuserve/measure/health.py); False: one every run."""
        return health_generates(self.launch_env)

    @property
    def secrets(self) -> tuple[str, ...]:
        """hf_token, sglang_api_key and every secret-named ``sglang_extra_env`` value
        (the rule of :func:`gpuserve.launch.secrets.host_secret_values`)."""
        extra = [v for k, v in self.service.extra_env.items()
                 if is_secret_env_name(k) and isinstance(v, str)]
        return tuple(s for s in (self.service.hf_token, self.service.api_key, *extra) if s)


@dataclass(frozen=True, kw_only=True)
class FirstReads:
    """What the serve deploy's first batch reads, known from the input alone: the
    roles turn it into fact reads (roles/deploys/serve.py), so that a rerun with nothing
    to do needs no second batch."""

    home: str
    user: str
    locks: tuple[Lock, ...]  # the candidate locks: their venvs
    pythons: tuple[str, ...]  # their Python minors: the interpreter facts, apt, builds
    explicit_python: str  # host data's interpreter path ("" unless one)
    builds: tuple[ManagedBuild, ...]  # the managed builds a choice may name
    checkpoint: str | None  # the checkpoint scan (None: none)
    weights: tuple[str, str] | None  # (revision directory, models_dir) of a pinned Hub id
    probe: ProbeRead | None  # the health gate's first probe (None: a multi-node launch)


@dataclass(frozen=True, kw_only=True)
class ProbeRead:
    """The health gate's first probe with its smoke completion, as the checks will ask
    for it (roles/checks/probe.py)."""

    profile_name: str
    port: int
    served_name: str
    config_path: str  # the --config file the smoke reads its key from ("" without one)
    smoke_records: str | None  # results_dir whose newest smoke record's start is skipped


def first_reads(inputs: ServeInput) -> FirstReads:
    """The first batch of the serve deploy, from its parsed input (pure)."""
    locks = tuple(inputs.candidate_locks)
    pythons = tuple(sorted({lk.python for lk in locks}))
    profile = inputs.profile
    probe = None if profile.parallel.nnodes > 1 else ProbeRead(
        profile_name=profile.name, port=profile.server.port,
        served_name=served_name(profile),
        config_path=service.CONFIG_PATH if inputs.service.api_key else "",
        smoke_records=inputs.results_dir if inputs.smoke_per_start else None)
    return FirstReads(
        home=inputs.settings.home, user=inputs.settings.user, locks=locks, pythons=pythons,
        explicit_python=inputs.python.explicit_path,
        builds=tuple(b for b in inputs.python.builds if b.python in pythons),
        checkpoint=inputs.checkpoint_path, weights=inputs.weights_target, probe=probe)


def served_name(profile: Profile) -> str:
    """The model name the server answers to (``--served-model-name``, else its path)."""
    return profile.model.served_name or profile.model.path


def read_input(host_data: dict, source: str, host_name: str = "",
               group_members: Callable[[str], list[Member] | None] = lambda group: None
               ) -> ServeInput:
    """Host data and profile checked, typed and parsed once: the only place the serve
    deploy loads the profile (``load_profile``) and its locks."""
    data = _checked_data(host_data, source)
    settings = _settings(data, source)
    profile, placement = _placed_profile(settings.profile_ref, data["sglang_nodes_group"],
                                         source, host_name, group_members)
    profile, role = disagg.place_role(profile, {**host_data, **data}, host_name, source,
                                      group_members)
    check_offline_model(profile)
    locks = load_locks(settings.locks_dir, source=source, field="sglang_locks_dir")
    preflight_mode = validate_preflight(data["preflight"], source)
    if profile.model.hf:
        weights.check_data(data, source, settings.home)
    return ServeInput(
        data=data, source=source, host_name=host_name, settings=settings, profile=profile,
        placement=placement, locks=tuple(locks), preflight=preflight_mode,
        bench=validate_mode(data["bench"], source),
        on_regression=validate_on_regression(data["on_regression"], source),
        results_dir=validate_results_dir(data["results_dir"], source),
        metrics=_flag(data, "sglang_metrics", source),
        quality_check=_flag(data, "quality_check", source),
        service=service.service_data(
            source, extra_env=data["sglang_extra_env"], hf_token=data["hf_token"],
            api_key=data["sglang_api_key"], listen_address=data["listen_address"],
            hardening_off=data["unit_hardening_off"]),
        python=sglang.python_wish(data, source), pd=role)


def _flag(data: dict, key: str, source: str) -> bool:
    value = data[key]
    if not isinstance(value, bool):
        raise InputError(source, key, f"must be true or false, got {value!r:.40}")
    return value


@dataclass(frozen=True, kw_only=True)
class HostReads:
    """What :func:`plan_serve` reads from the host and the Hub, each a function so that
    the deploy answers from its prefetched facts, ``gpuserve check`` from nothing and
    tests from plain values. None: not read (no preflight scan, no weights step)."""

    runtime: Callable[[str], HostRuntime]  # sglang_home -> what the host brings
    # the interpreter facts (gpuserve/launch/interpreter.py) for the candidate locks'
    # Pythons; None: the runtime's own interpreter (python3 unless it names one)
    interpreter: Callable[[], DistroFacts] | None = None
    host_record: Callable[[], list[str] | None] = lambda: None  # host.json's lines
    checkpoint: Callable[[str], str | None] | None = None  # the checkpoint scan's JSON
    host_facts: Callable[[], dict | None] | None = None  # the doctor's host-facts document
    weights_state: Callable[[str, str, str], str | None] | None = None
    remote: Callable | None = None  # the Hub's reads (gpuserve/memory/remote.py)


@dataclass(frozen=True)
class _Built:
    """One launch as :func:`plan_serve` rendered it, for the service and checks' plans."""

    profile: Profile  # with the weights' revision directory for a model.hf profile
    lock: Lock
    version: str
    runtime: HostRuntime
    launch: Launch
    args: list[str]
    env: dict[str, str]  # the profile's env, with the nodes' socket interface
    venv: str  # the lock's venv, built with the chosen interpreter


def plan_serve(inputs: ServeInput, reads: HostReads) -> ServePlan:
    """Choose the interpreter and the lock for the host, preflight the host against them,
    and render the launch for the lock's SGLang, from the host's :func:`read_input`.

    ``reads.host_record`` gives the host deploy's ``/etc/gpuserve/host.json``: flags the
    host's communication requires (no P2P -> ``--disable-custom-all-reduce``) are added
    when the profile does not set them. ``reads.checkpoint`` (the checkpoint scan's
    JSON) and ``reads.host_facts`` feed the preflight (gpuserve/serve/preflight.py)."""
    source, settings, placement = inputs.source, inputs.settings, inputs.placement
    runtime, notes = _runtime(inputs, reads)
    profile, checkpoint = inputs.profile, reads.checkpoint
    lock, version = _chosen_lock(list(inputs.locks), settings, runtime, profile, source)
    step = _weights(inputs, reads) if profile.model.hf else None
    if step is not None:
        profile = step.profile
        if step.found is not None and step.found.scan is not None:
            checkpoint = _remote_first(step.plan.target, step.found.scan_json(), checkpoint)
    checks_report = run_preflight(
        inputs.preflight, host=runtime.name, profile=profile,
        version=version, gpus=list(runtime.gpu_list), checkpoint=checkpoint,
        host_facts=reads.host_facts, starts=_starts_reader(inputs.results_dir, runtime.name))
    # after the memory fit: a profile that cannot fit costs its headers, not a file list
    weights_plan = step.finish() if step is not None else None
    launch = render_launch(profile, version)
    args = list(launch.args)
    # the nodes' socket interface: after the profile's env, before host data's extra env
    launch_env = {**launch.env, **(placement.env if placement else {})}
    _refuse_unsafe_args(args, launch, profile, version)
    host_json_lines = reads.host_record()
    args = _with_host_flags(args, host_json_lines, version)
    role = disagg.pd_launch(profile, catalog=load_catalog(version), lock_name=lock.name,
                            lock_packages=[p.name for p in lock.packages],
                            host_json_lines=host_json_lines,
                            record_path=HOST_JSON_PATH,
                            ratio=inputs.pd.ratio) if inputs.pd else None
    args += list(role.args) if role else []
    checks_report.warnings.extend(role.warnings if role else ())
    # SGLang's own metrics, on unless host data turns them off (gpuserve/serve/metrics.py)
    args += metrics.metrics_flags(args, inputs.metrics, load_catalog(version), source)
    venv = venv_path(settings.home, lock, runtime.interpreter and runtime.interpreter.path)
    built = _Built(profile, lock, version, runtime, launch, args, launch_env, venv)
    plan = _service_plan(inputs, built)
    # the listen address and hardening choices are printed with the preflight's warnings
    checks_report.warnings.extend(plan.warnings)
    record, bench = _record_and_bench(inputs, built, communication(host_json_lines), plan)
    start = StartSpec(inputs.results_dir, version, checks_report.checkpoint
                      or Checkpoint(profile.model.path), launch_of(profile),
                      gpu_of(list(runtime.gpu_list)),
                      inputs.secrets) if inputs.results_dir else None
    return ServePlan(input=inputs, lock=lock, version=version, runtime=runtime,
                     service=plan, record=record, bench=bench, preflight=checks_report,
                     weights=weights_plan, start=start, notes=notes,
                     transport=transport_note(host_json_lines,
                                              "--disable-custom-all-reduce" in args),
                     pd=role)


def _runtime(inputs: ServeInput, reads: HostReads) -> tuple[HostRuntime, tuple[str, ...]]:
    """The host's runtime with the interpreter its venvs are built with, chosen from the
    interpreter facts (gpuserve/launch/interpreter.py) and said with why; an
    ``InterpreterError`` before any change."""
    runtime = reads.runtime(inputs.settings.home)
    pythons = {lk.python for lk in inputs.candidate_locks}
    if reads.interpreter is None or not pythons:
        return runtime, ()
    facts = reads.interpreter()
    choice = choose_interpreter(facts, pythons, asked=inputs.python.asked,
                                mirror=inputs.python.mirror, home=inputs.settings.home,
                                host=runtime.name, builds=inputs.python.builds, role=SGLANG)
    notes = (f"{SGLANG.label} interpreter: {choice.kind} Python {choice.version} "
             f"({choice.path}): {choice.reason}",
             # how this path is proven on the host's distribution (docs/hosts.md's matrix)
             proven_on_host(facts.os_release, "serve"))
    return dataclasses.replace(runtime, python=choice.version, interpreter=choice), notes


def _starts_reader(results_dir: str | None, host_name: str
                   ) -> Callable[[], list[StartRecord]] | None:
    """The host's recorded starts on the controller (gpuserve/measure/starts.py), read
    when the preflight asks; None when recording is off."""
    if not results_dir or not host_name:
        return None
    return lambda: read_starts(results_root(results_dir), host_name)


def _weights(inputs: ServeInput, reads: HostReads) -> weights.WeightsStep | None:
    """The weights step's plan (gpuserve/serve/weights.py) for a ``model.hf`` profile;
    None with no host and no Hub to read (``gpuserve check``: read_input checked the
    host data)."""
    if reads.weights_state is None or reads.remote is None:
        return None
    return weights.plan_weights(inputs.data, inputs.source, inputs.profile,
                                home=inputs.settings.home, user=inputs.settings.user,
                                host_state=reads.weights_state, remote=reads.remote,
                                want_headers=inputs.preflight != PreflightMode.OFF)


def _remote_first(target: str, scan_json: str, checkpoint):
    """The preflight's checkpoint reader: the Hub's headers for the revision directory
    not fetched yet (the very scan document a local directory gives), else the host's."""
    def read(path: str) -> str | None:
        if path == target:
            return scan_json
        return checkpoint(path) if checkpoint is not None else None
    return read


def _checked_data(host_data: dict, source: str) -> dict:
    """Host data over :func:`defaults`, every value bounded (gpuserve/safeload.py)."""
    data = defaults()
    data.update({k: v for k, v in host_data.items() if k in data})
    for key, value in data.items():  # before any message repeats a value
        safeload.check_value(value, source, key)
    return data


def _settings(data: dict, source: str) -> _Settings:
    """The profile reference, lock pin, account, home, pip URLs and health timeout,
    checked in this order before any file is opened."""
    profile_ref = data["profile"]
    if not profile_ref or not isinstance(profile_ref, str):
        raise InputError(source, "profile",
                         "required: a profile name (profiles/<name>.yaml) or path, "
                         "in host data or as --data profile=NAME")
    problem = profile_ref_problem(profile_ref)  # before any file is opened
    if problem:
        raise InputError(source, "profile", problem)
    pinned = optional_str(data, "sglang_version", source)
    locks_dir = optional_str(data, "sglang_locks_dir", source)
    user = sglang.validate_user(data["sglang_user"], source)
    home = sglang.validate_home(data["sglang_home"], source)
    keep = sglang.validate_keep(data["keep_venvs"], source)
    index_url = optional_str(data, "pip_index_url", source)
    find_links = optional_str(data, "pip_find_links", source)
    # credentials over http, and http to a mirror not in trusted_mirrors, are refused
    # here, before any host is touched
    trusted = sglang.validate_pip_urls(index_url, find_links, data["trusted_mirrors"], source)
    timeout = data["health_timeout"]
    # ``not 0 < t <= max`` rather than ``t <= 0``: NaN compares false with everything, so
    # the old check let ``nan`` (and ``inf``) through and the health gate never timed out.
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
        0 < timeout <= MAX_HEALTH_TIMEOUT
    ):
        raise InputError(source, "health_timeout", "must be a finite number of seconds in "
                         f"(0, {MAX_HEALTH_TIMEOUT}], got {timeout!r:.40}")
    return _Settings(profile_ref, pinned, locks_dir, user, home, keep, index_url, find_links,
                     timeout, tuple(trusted))


def check_offline_model(profile: Profile) -> None:
    """Refuse a ``model.path`` the offline server cannot load (a Hub id, a relative
    path), naming the file that set it; ``gpuserve check`` runs this same code."""
    problem = None if profile.model.hf else offline_path_problem(profile.model.path)
    if problem:
        raise profile.error("model.path", problem)


def _placed_profile(profile_ref: str, group: object, source: str, host_name: str,
                    group_members: Callable[[str], list[Member] | None]
                    ) -> tuple[Profile, NodePlacement | None]:
    """The profile, with this host's rank and the dist-init address set when it is one
    node of a multi-node launch (gpuserve/fleet/multinode.py)."""
    profile = load_profile(profile_ref)
    placement = place_node(
        nnodes=profile.parallel.nnodes, dist_init_port=profile.parallel.dist_init_port,
        profile_source=str(profile.source), group=group,
        members=group_members(group) if isinstance(group, str) and group else None,
        host_name=host_name, source=source)
    if placement is not None:
        profile = dataclasses.replace(profile, parallel=dataclasses.replace(
            profile.parallel, node_rank=placement.rank,
            dist_init_addr=placement.dist_init_addr))
    return profile, placement


def _chosen_lock(locks: list[Lock], settings: _Settings, runtime: HostRuntime,
                 profile: Profile, source: str) -> tuple[Lock, str]:
    """The lock for this host and profile, and the SGLang release it renders for;
    ``PreflightError`` when the host cannot run it."""
    # a profile without sglang_versions renders for every release with a flag catalog
    lock = choose_lock(locks, runtime, versions=profile.sglang_versions or available_versions(),
                       pinned=settings.pinned, profile=profile.name, source=source)
    problems = preflight(lock, runtime)
    if problems:
        raise PreflightError("; ".join(problems) + "; nothing on the host was changed")
    return lock, public_version(lock.sglang)


def _refuse_unsafe_args(args: list[str], launch: Launch, profile: Profile,
                        version: str) -> None:
    """Refuse a server argument that carries a secret or a control character, naming
    the profile field that produced it."""
    for hit in secret_flags(args, load_catalog(version)):
        # resolved like SGLang's parser (--api-k is --api-key): the server's arguments
        # reach ps and the journal
        owner = next((f for f, items in launch.by_field.items() if args[hit.index] in items),
                     "extra_args")
        raise profile.error(owner, f"{hit.given} ({hit.flag}) carries a secret: set it in "
                                   "host data (sglang_api_key / hf_token)")
    for arg in args:
        # systemd cannot carry them in the env file's arguments (render.args_value)
        if any(ord(c) < 32 or ord(c) == 127 for c in arg):
            owner = next((f for f, items in launch.by_field.items() if arg in items),
                         "extra_args")
            raise profile.error(owner, f"{arg!r} contains a control character, which a "
                                       "systemd command line cannot carry")


def _with_host_flags(args: list[str], host_json_lines: list[str] | None,
                     version: str) -> list[str]:
    """``args`` plus the flags the host's communication requires (host.json) that the
    profile does not set, checked against the version's catalog."""
    host_flags = [f for f in sglang_flags_for_host(host_json_lines, HOST_JSON_PATH)
                  if f not in args]
    if host_flags:
        args += host_flags
        load_catalog(version).validate(
            args, source=HOST_JSON_PATH, field="disable_custom_all_reduce"
        )
    return args


def _service_plan(inputs: ServeInput, built: _Built) -> service.ServicePlan:
    """The unit, EnvironmentFile and --config file of this launch (gpuserve/serve/service.py)."""
    home, profile, lock = inputs.settings.home, built.profile, built.lock
    return service.plan_service(service.ServiceLaunch(
        args=built.args, env=built.env, user=inputs.settings.user,
        venv=built.venv, state_dir=sglang.state_dir(home), bin_dir=sglang.bin_dir(home),
        profile_name=profile.name,
        profile_source=str(profile.source), sglang_version=built.version,
        model_path=profile.model.path, port=profile.server.port,
        served_name=served_name(profile), cuda_home=cuda_home(built.runtime, lock),
        lock_name=lock.name, profile_sets_host=profile.is_set("server.host"),
        arg_field=functools.partial(_arg_field, built.launch, profile),
    ), inputs.service)


def _record_and_bench(inputs: ServeInput, built: _Built, host_comm: dict,
                      plan: service.ServicePlan
                      ) -> tuple[RecordSpec | None, BenchPlan | None]:
    """Where the smoke check records, and the throughput checks, of the launch the unit
    really runs (its ``--host`` last)."""
    profile, lock, version = built.profile, built.lock, built.version
    env = {**built.env, **{k: str(v) for k, v in inputs.service.extra_env.items()}}
    args = service.with_host(built.args, plan.host)  # what the unit really runs (--host last)
    record = record_spec(inputs.data["results_dir"], inputs.source,
                         Served(profile=profile.name, sglang_version=version,
                                model=profile.model.path, served_name=served_name(profile),
                                profile_hash=profile_hash(profile), lock=lock.name),
                         args=args, env=env, context=run_context(built.runtime, lock, host_comm))
    return record, _bench_plan(inputs, built, plan, launch_hash(args, env))


def _arg_field(launch: Launch, profile: Profile, arg: str) -> str:
    """The profile field an argument came from (``extra_args[3]`` for an extra one)."""
    owner = launch.field_of(arg)
    if owner == "extra_args" and arg in profile.extra_args:
        return f"extra_args[{profile.extra_args.index(arg)}]"
    return owner


def profile_hash(profile) -> str:
    """sha256 over the profile file and every parent it extends (path order), so a record
    says exactly which profile text produced it."""
    files = sorted({str(profile.source), *(o.file for o in profile.locations.values())})
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0")
        try:
            digest.update(Path(name).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    return "sha256:" + digest.hexdigest()


def communication(host_json_lines: list[str] | None) -> dict:
    """P2P verdict and NCCL env from the host deploy's host.json ({} without one; a bad
    one is refused by sglang_flags_for_host)."""
    try:  # bounded like every host document (gpuserve/safeload.py)
        doc = safeload.loads_json("\n".join(host_json_lines or []) or "{}", HOST_JSON_PATH)
    except InputError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {"p2p": doc.get("p2p") if isinstance(doc.get("p2p"), str) else None,
            "nccl_env": doc.get("nccl_env") if isinstance(doc.get("nccl_env"), dict) else {}}


def transport_note(host_json_lines: list[str] | None, custom_off: bool) -> tuple[str, bool]:
    """Where this launch's NCCL transport and custom all-reduce choice come from, said at
    every plan: the host's measurement, the driver's verdict (not measured), or nothing
    recorded (a warning: NCCL and SGLang choose for themselves, docs/gpu-gates.md)."""
    custom = "custom all-reduce off" if custom_off else "custom all-reduce left to SGLang"
    if not host_json_lines:
        return (f"NCCL transport: no {HOST_JSON_PATH} (deploy/host.py has not run here): "
                "NCCL and SGLang choose for themselves (NCCL uses SHM where the driver "
                "allows no P2P, SGLang turns custom all-reduce off on more than two "
                f"PCIe-only GPUs or without P2P), {custom}; a P2P path that hangs is "
                "caught only by deploy/host.py's measurement", True)
    try:  # sglang_flags_for_host has refused a malformed record before this is reached
        doc = safeload.loads_json("\n".join(host_json_lines), HOST_JSON_PATH)
    except InputError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    measured = doc.get("measured_nccl")
    env = doc.get("nccl_env") if isinstance(doc.get("nccl_env"), dict) else {}
    env_text = " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "NCCL defaults"
    if isinstance(measured, dict):
        return (f"NCCL transport: measured ({str(measured.get('reason', ''))[:200]}): "
                f"{env_text}, {custom}", False)
    return (f"NCCL transport: from the driver's P2P verdict ({doc.get('p2p') or 'unknown'}), "
            f"not measured: {env_text}, {custom}; deploy/host.py with gates measures it",
            False)


def run_context(runtime: HostRuntime, lock: Lock, comm: dict) -> dict:
    """What produced a recorded run besides the launch (results.CONTEXT_KEYS)."""
    names = sorted({str(g.get("name")) for g in runtime.gpu_list if g.get("name")})
    return {
        "gpus": {"name": " + ".join(names) if names else None, "count": runtime.gpus},
        "driver": runtime.driver,
        "cuda": f"torch CUDA {lock.torch_cuda}, toolkit {runtime.cuda_toolkit or '-'}",
        "nccl_env": comm.get("nccl_env") or {},
        "p2p": comm.get("p2p"),
    }


def _bench_plan(inputs: ServeInput, built: _Built, service_plan: service.ServicePlan,
                launch: str) -> BenchPlan | None:
    """The throughput checks of this deploy (host data ``bench``, ``on_regression``;
    the profile's ``bench`` section); None when ``bench: off``. Each scenario's client
    argv is checked against the catalog of that SGLang version's benchmark client
    (gpuserve/data/bench/), so a flag the host's client lacks fails here, not after a
    ten-minute load."""
    if inputs.bench == BenchMode.OFF:
        return None
    profile, lock, version, home = built.profile, built.lock, built.version, inputs.settings.home
    if version in available_bench_versions():
        catalog = load_bench_catalog(version)
        for s in profile.bench.scenarios:
            argv = client_argv(s, port=profile.server.port, served_name="x", tokenizer="/m",
                               output_file="/r/result.jsonl", tag="t")
            origin = profile.where(f"bench.scenarios.{s.name}")
            catalog.validate(argv, origin.file, f"bench.scenarios.{s.name}", origin.line)
    on_regression = (inputs.on_regression
                     or OnRegression(profile.bench.on_regression or "report"))
    return BenchPlan(
        mode=inputs.bench, spec=profile.bench,
        # the lock's hash too: the same name can pin other wheels (a user's own locks)
        fingerprint=run_fingerprint(launch, f"{lock.name}@{lock.hash}", profile.bench),
        on_regression=on_regression, profile=profile.name,
        python=f"{built.venv}/bin/python", user=inputs.settings.user,
        port=profile.server.port, served_name=service_plan.served_name,
        tokenizer=profile.model.path,
        config_path=service.CONFIG_PATH if service_plan.config_text is not None else "",
        runs_dir=f"{home}/bench", mark_path=bench_mark_path(home),
    )
