"""Launch profiles: YAML files that say how one model should be served on one kind of box.

A profile is checked completely when it is loaded, because deploy scripts load it at
prepare time and must refuse bad input before any host is changed. Every error names the
file and line the offending value came from, which with ``extends:`` may be a parent
file, so the YAML is composed into nodes (``start_mark.line``) rather than just loaded.

Schema: docs/architecture.md ("Profiles"). Sections are dataclasses; their annotations
are the type schema, so the table in the docs and this module cannot drift apart silently
(``tests/unit/launch/test_profiles.py`` checks every documented key exists here).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import ipaddress
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuserve import paths, safeload
from gpuserve.env_names import reserved_env
from gpuserve.errors import InputError
from gpuserve.launch.bench import BenchSpec, parse_bench
from gpuserve.launch.disaggregation import DisaggregationSpec, parse_disaggregation
from gpuserve.launch.hf_source import TOKEN_SHAPE, HfSource, parse_source, source_problem
from gpuserve.launch.quality_spec import QualitySpec, parse_quality
from gpuserve.launch.secrets import is_secret_env_name
from gpuserve.terminal import escaped_key, non_ascii_note

PROFILES_DIR = paths.PROFILES_DIR

# A profile is a committed, world-readable file and its args end up in argv (visible in
# ``ps``), so secrets must come from host data (``hf_token`` / ``sglang_api_key``), which
# the serve role writes to 0600 files. Secret env names and secret *flags* are both
# judged by gpuserve.launch.secrets (one rule for every place that asks).
#: ``Profile.name`` (the file stem) goes into the unit, the env file and record names.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Origin:
    """Where a value came from: the file (parent or child) and the 1-based line."""

    file: str
    line: int | None


# ---------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class ModelSection:
    # the model: an absolute directory on the host (a local or NFS checkpoint put there
    # ahead of time); this or model.hf. The server runs offline, so the serve deploy and
    # gpuserve check refuse a Hub id here
    path: str = ""
    # a Hub repository pinned to a commit, org/name@<40-hex commit>: the serve deploy
    # plans from its safetensors headers, fetches and verifies it (docs/weights.md)
    hf: str | None = None
    # let model.hf name a branch or tag: resolved once and recorded on the host; a later
    # move is refused unless host data hf_revision_update is true
    allow_floating_revision: bool = False
    # the model name clients send in requests (default: SGLang's, the path)
    served_name: str | None = None
    # a model record in gpuserve/data/models/ for the memory planner and the preflight
    # (not passed to SGLang)
    arch: str | None = None
    # let SGLang run the model repository's own Python code
    trust_remote_code: bool = False
    # SGLang's quantization method (e.g. modelopt_fp4); default: from the checkpoint
    quantization: str | None = None

    @property
    def source(self) -> HfSource | None:
        """The Hub source of ``hf`` (checked at load), None for a path."""
        return parse_source(self.hf, self.allow_floating_revision) if self.hf else None


@dataclass(frozen=True)
class ServerSection:
    # the address the server listens on when host data gives an API key (else 127.0.0.1:
    # see host data listen_address); SGLang's own default is 127.0.0.1, a served box is
    # polled from elsewhere
    host: str = "0.0.0.0"
    # the HTTP port the server listens on (1..65535)
    port: int = 30000


@dataclass(frozen=True)
class ParallelSection:
    # tensor-parallel size: GPUs one copy of the model spans (across all nodes)
    tp: int = 1
    # expert-parallel size for MoE layers; must divide tp
    ep: int = 1
    # data-parallel replicas (GPUs used: tp x dp)
    dp: int = 1
    # data-parallel attention within the tp group (at most tp, must divide it)
    attention_dp: int = 1
    # nodes of one launch; over 1, the hosts of host data sglang_nodes_group in rank order
    nnodes: int = 1
    # this host's rank, set by gpuserve from the inventory group's order
    # (gpuserve/fleet/multinode.py), never in a profile
    node_rank: int = 0
    # node 0's address:port, set by gpuserve from the group, never in a profile
    dist_init_addr: str | None = None
    # the port node 0 listens on for the other nodes (the port of --dist-init-addr)
    dist_init_port: int = 20000


@dataclass(frozen=True)
class MemorySection:
    # fraction of GPU memory for weights and KV cache, in (0, 1); "auto" or unset:
    # SGLang's choice
    mem_fraction_static: float | None = None  # None = SGLang's auto choice ("auto" in YAML)
    # largest decode batch captured as a CUDA graph
    cuda_graph_max_bs: int | None = None
    # tokens per prefill chunk; -1 turns chunking off
    chunked_prefill_size: int | None = None
    # the model's maximum context length, overriding its config
    context_length: int | None = None
    # KV cache data type (e.g. fp8_e4m3); default: the model's
    kv_cache_dtype: str | None = None
    # most requests decoded at once (bench scenarios' concurrency may not exceed it)
    max_running_requests: int | None = None


@dataclass(frozen=True)
class MoeSection:
    # MoE all-to-all backend (e.g. deepep); adds all-gather/all-to-all to the host's
    # measured gates
    a2a_backend: str | None = None
    # MoE kernel backend
    runner_backend: str | None = None
    # extra expert replicas for expert-parallel load balance (0 or more)
    num_redundant_experts: int | None = None
    # keep shared experts out of the fused MoE kernel
    disable_shared_experts_fusion: bool = False


@dataclass(frozen=True)
class AttentionSection:
    # attention kernel backend for prefill and decode
    backend: str | None = None
    # attention backend for prefill only
    prefill_backend: str | None = None
    # attention backend for decode only
    decode_backend: str | None = None
    # sparse-attention (DSA/NSA) backend for prefill
    dsa_prefill_backend: str | None = None
    # sparse-attention (DSA/NSA) backend for decode
    dsa_decode_backend: str | None = None


@dataclass(frozen=True)
class SpeculativeSection:
    # speculative decoding algorithm (e.g. EAGLE3, NEXTN); the other fields need it
    algorithm: str | None = None
    # the draft model's directory or hub id
    draft_model: str | None = None
    # the draft model's record (gpuserve/data/models/drafts/), which sizes its weights, KV
    # and CUDA graphs for the memory planner when its checkpoint is not scanned
    draft_arch: str | None = None
    # draft steps per verification (num_steps, eagle_topk, num_draft_tokens: all three
    # or none, when SGLang picks them)
    num_steps: int | None = None
    # candidates kept per draft step
    eagle_topk: int | None = None
    # draft tokens verified per step
    num_draft_tokens: int | None = None


@dataclass(frozen=True)
class CommunicationSection:
    # use NCCL's all-reduce instead of SGLang's custom kernel whatever the host measured
    # (the host deploy adds it by itself where P2P does not work: host.json); needs insist
    disable_custom_all_reduce: bool = False
    # SGLang's PCIe IPC all-reduce (an environment switch; versions before 0.5.23 lack it)
    pcie_ipc_allreduce: bool = False
    # why this profile overrides the host's measured transport choice (custom all-reduce
    # off, or an env NCCL_P2P_DISABLE, NCCL_P2P_LEVEL or NCCL_SHM_DISABLE); required with
    # them, refused without them
    insist: str | None = None


#: The NCCL transport settings the host deploy decides from its measured gates
#: (gpuserve/host/nccl_env.py, /etc/gpuserve/nccl.env): a profile that sets one in env
#: overrides the host's verdict, so it must say why (communication.insist).
HOST_TRANSPORT_ENV = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE")


SECTIONS: dict[str, type] = {
    # what to serve
    "model": ModelSection,
    # where the server listens
    "server": ServerSection,
    # how the model is split over GPUs and nodes
    "parallel": ParallelSection,
    # GPU memory, CUDA graphs, batch and context limits
    "memory": MemorySection,
    # mixture-of-experts kernels and expert parallelism
    "moe": MoeSection,
    # attention kernel backends
    "attention": AttentionSection,
    # speculative decoding
    "speculative": SpeculativeSection,
    # all-reduce between the GPUs
    "communication": CommunicationSection,
}
TOP_LEVEL: dict[str, Any] = {
    # a parent profile (path relative to this file), deep-merged under this one; null in
    # this file removes a parent's value
    "extends": str,
    # one line about the profile
    "description": str | None,
    # the SGLang releases this profile must render for (default: every catalog)
    "sglang_versions": list[str],
    # environment of the server (NCCL_*, SGLANG_*, ...); no secrets: those come from host
    # data
    "env": dict[str, str],
    # further SGLang flags, validated against the version's flag catalog; no secret flags
    "extra_args": list[str],
    # the throughput checks the serve deploy runs after its smoke completion
    "bench": BenchSpec,  # gpuserve.launch.bench.parse_bench
    # prefill-decode disaggregation: transfer_backend, bootstrap_port, and per-role
    # profile fields (prefill:, decode:); the hosts' roles come from the inventory
    # (docs/disaggregation.md)
    "disaggregation": DisaggregationSpec,  # gpuserve.launch.disaggregation
    # the output-quality check of this profile's launches (docs/quality.md)
    "quality": QualitySpec,  # gpuserve.launch.quality_spec.parse_quality
}


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    description: str | None = None
    sglang_versions: list[str] = field(default_factory=list)
    model: ModelSection = field(default_factory=ModelSection)
    server: ServerSection = field(default_factory=ServerSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    memory: MemorySection = field(default_factory=MemorySection)
    moe: MoeSection = field(default_factory=MoeSection)
    attention: AttentionSection = field(default_factory=AttentionSection)
    speculative: SpeculativeSection = field(default_factory=SpeculativeSection)
    communication: CommunicationSection = field(default_factory=CommunicationSection)
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    bench: BenchSpec = field(default_factory=BenchSpec)
    disaggregation: DisaggregationSpec | None = None
    quality: QualitySpec = field(default_factory=QualitySpec)
    locations: dict[str, Origin] = field(default_factory=dict, repr=False, compare=False)

    def get(self, dotted: str) -> Any:
        """The value of a dotted field (``memory.cuda_graph_max_bs``)."""
        value: Any = self
        for part in dotted.split("."):
            value = getattr(value, part)
        return value

    def is_set(self, dotted: str) -> bool:
        """Whether the YAML (this file or a parent) set the field, as opposed to a default."""
        return dotted in self.locations

    def where(self, dotted: str) -> Origin:
        """Origin of a field; falls back to its section, then to the profile file."""
        probe = dotted
        while probe:
            if probe in self.locations:
                return self.locations[probe]
            probe = probe.rpartition(".")[0]
        return Origin(str(self.source), None)

    def error(self, dotted: str, message: str) -> InputError:
        """An InputError pointing at the file and line that set ``dotted``."""
        origin = self.where(dotted)
        return InputError(origin.file, escaped_key(dotted), message, origin.line)

    @property
    def gpus(self) -> int:
        """GPUs this profile occupies on one node (dp replicas x tp; pp is not modelled)."""
        return self.parallel.tp * self.parallel.dp // max(self.parallel.nnodes, 1)


# ---------------------------------------------------------------------------- loading


PROFILE_SUFFIXES = (".yaml", ".yml")


def profile_ref_problem(name_or_path: str | Path) -> str | None:
    """Why ``name_or_path`` cannot name a profile, or None.

    A bare name must match :data:`NAME_PATTERN`; anything with a slash must be a path
    ending in ``.yaml``/``.yml``. Why: ``profile`` comes from host data and ``--data``,
    and ``../../etc/shadow`` was read as a profile, its first line echoed in the "unknown
    key" message (a password hash in a CI log). A profile is a YAML file, so a path to
    anything else is refused before it is opened; the message repeats at most 80
    characters of the reference and never the file's contents.
    """
    text = str(name_or_path)
    if "/" in text or text.endswith(PROFILE_SUFFIXES):
        if not text.endswith(PROFILE_SUFFIXES):
            return (f"{text!r:.80} is a path but not a .yaml or .yml file: give a profile "
                    "name (profiles/<name>.yaml) or the path of a profile's YAML file")
        return None
    if not NAME_PATTERN.fullmatch(text):
        return (f"{text!r:.80} is not a profile name (letters, digits, '.', '_', '-'; at "
                "most 64 characters) nor a path ending in .yaml")
    return None


def resolve_profile_path(name_or_path: str | Path, profiles_dir: Path | None = None) -> Path:
    """A bare name means ``profiles/<name>.yaml``; anything with a slash or suffix is a path
    (which must end in .yaml/.yml: :func:`profile_ref_problem`)."""
    text = str(name_or_path)
    problem = profile_ref_problem(text)
    if problem:
        shown = text[:80] if text and text.isprintable() else ascii(text)[:80]
        raise InputError(shown, "profile", problem)
    if "/" in text or text.endswith(PROFILE_SUFFIXES):
        return Path(text)
    return (profiles_dir or PROFILES_DIR) / f"{text}.yaml"


def load_profile(name_or_path: str | Path, profiles_dir: Path | None = None) -> Profile:
    """Load, merge (``extends``) and validate a profile; raises InputError on any bad input."""
    path = resolve_profile_path(name_or_path, profiles_dir)
    if not path.exists():
        known = sorted(p.stem for p in (profiles_dir or PROFILES_DIR).glob("*.yaml"))
        raise InputError(path, None, f"no such profile (known: {', '.join(known) or 'none'})")
    safeload.regular_file(path)  # a FIFO, a device, a directory: named, never opened
    _check_name(path)
    data, locs = _resolve(path.resolve(), ())
    profile = _build(path.resolve(), data, locs)
    _check_cross_fields(profile)
    _check_arch(profile)
    _check_catalog(profile)
    return profile


def load_profile_with(path: str | Path, overrides: dict[str, Any],
                      origins: dict[str, Origin], name: str) -> Profile:
    """The profile at ``path`` with ``overrides`` merged on top as a child file named
    ``name`` would be (a nested mapping; None removes the parent's value), validated like
    :func:`load_profile`. ``origins`` (dotted field -> where the override was written, e.g.
    a tune file's line) makes every error about an override name that place.

    Why: the tuner checks each candidate launch against the version's catalog while
    parsing its search space, before any candidate file exists (gpuserve/tune/space.py)."""
    base = Path(path).resolve()
    if not base.is_file():
        raise InputError(base, None, "no such profile")
    data, locs = _resolve(base, ())
    data, locs = _merge(data, overrides, locs, dict(origins), "")
    profile = _build(base.with_name(f"{name}.yaml"), data, locs)
    _check_cross_fields(profile)
    _check_arch(profile)
    _check_catalog(profile)
    return profile


def list_profiles(profiles_dir: Path | None = None) -> list[str]:
    """Names of the concrete profiles (``profiles/*.yaml``; ``base/`` holds parents only)."""
    return sorted(p.stem for p in (profiles_dir or PROFILES_DIR).glob("*.yaml"))


def read_with_origins(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    """A profile file's values and each one's origin, composed once per version of the
    file (its stat) in a process: a tune reads the same profiles for every candidate.
    The caller gets its own copy to change."""
    version = safeload.file_version(path)
    if version is None:
        return _read_with_origins(path)  # the reader's own error names the file
    data, locs = _read_once(Path(path), version)
    return copy.deepcopy(data), dict(locs)


@functools.lru_cache(maxsize=64)
def _read_once(path: Path, _version: tuple[int, int, int]
               ) -> tuple[dict[str, Any], dict[str, Origin]]:
    return _read_with_origins(path)


def _read_with_origins(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    # Bounded (size, depth, alias expansion): see gpuserve/safeload.py. Non-finite floats
    # are left to the typed checks (_coerce, parse_bench), whose messages say what the
    # field wants ("seconds", "a number in (0, 1)").
    limits = safeload.CONFIG.but(finite=False)
    loader, node = safeload.compose_yaml(safeload.read_bytes(path), path, limits)
    try:
        locs: dict[str, Origin] = {}
        if node is None:
            return {}, locs
        if not isinstance(node, yaml.MappingNode):
            line = node.start_mark.line + 1
            raise InputError(path, None, "a profile must be a YAML mapping", line)
        data = _walk(node, "", str(path), loader, locs)
        return data, locs
    finally:
        loader.dispose()


def _walk(
    node: yaml.Node, path: str, file: str, loader: safeload.BoundedLoader, locs: dict
) -> Any:
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = safeload.construct(loader, key_node)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise InputError(file, path or None, f"keys must be strings, got {key!r}", line)
            child = f"{path}.{key}" if path else key
            if key in result:
                raise InputError(file, child, "duplicate key", line)
            locs[child] = Origin(file, line)
            result[key] = _walk(value_node, child, file, loader, locs)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = f"{path}[{index}]"
            locs[child] = Origin(file, item.start_mark.line + 1)
            items.append(_walk(item, child, file, loader, locs))
        return items
    try:
        return safeload.construct(loader, node)
    except InputError as exc:  # e.g. ".nan": the loader knows the line, we know the field
        raise InputError(file, exc.field or path or None, exc.message, exc.line) from exc


def _resolve(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Origin]]:
    data, locs = read_with_origins(path)
    parent = data.pop("extends", None)
    extends_at = locs.pop("extends", Origin(str(path), None))
    if parent is None:
        return data, locs
    if not isinstance(parent, str):
        raise InputError(path, "extends", "must be a file name (string)", extends_at.line)
    if not parent.endswith(PROFILE_SUFFIXES):  # a profile's parent is YAML, never /etc/...
        raise InputError(path, "extends", f"{parent!r:.80} is not a .yaml or .yml file",
                         extends_at.line)
    parent_path = (path.parent / parent).resolve()
    if parent_path in (*chain, path):
        loop = " -> ".join(str(p) for p in (*chain, path, parent_path))
        raise InputError(path, "extends", f"extends cycle: {loop}", extends_at.line)
    if not parent_path.exists():
        raise InputError(path, "extends", f"no such file: {parent_path}", extends_at.line)
    safeload.regular_file(parent_path)
    base, base_locs = _resolve(parent_path, (*chain, path))
    return _merge(base, data, base_locs, locs, "")


def _merge(
    base: dict[str, Any],
    over: dict[str, Any],
    base_locs: dict[str, Origin],
    over_locs: dict[str, Origin],
    prefix: str = "",
) -> tuple[dict[str, Any], dict[str, Origin]]:
    """Deep-merge ``over`` (child) onto ``base`` (parent): mappings merge, anything else
    replaces, and a null in the child removes the parent's value (back to the default).
    Locations follow the values, so an error about an inherited value names the parent."""
    if not prefix:
        base_locs, over_locs = dict(base_locs), dict(over_locs)
    result = dict(base)
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key], _ = _merge(result[key], value, base_locs, over_locs, f"{dotted}.")
            continue
        for stale in [k for k in base_locs
                      if k == dotted or k.startswith((f"{dotted}.", f"{dotted}["))]:
            del base_locs[stale]
        if value is None:
            result.pop(key, None)
            over_locs.pop(dotted, None)
        else:
            result[key] = value
    return result, {**base_locs, **over_locs}


# ---------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _type_name(inner[0]) if len(inner) == 1 else " or ".join(map(_type_name, inner))
    if typing.get_origin(tp) is list:
        return "a list of strings"
    if typing.get_origin(tp) is dict:
        return "a mapping of strings"
    return names.get(tp, str(tp))


def _coerce(value: Any, tp: Any, dotted: str, locs: dict[str, Origin], src: Path) -> Any:
    """Check ``value`` against annotation ``tp``; YAML's own types must already match
    (``tp: "8"`` is an error, not a silent int), except that ints are valid floats."""

    def fail(message: str, at: str = dotted) -> InputError:
        origin = locs.get(at) or locs.get(dotted) or Origin(str(src), None)
        return InputError(origin.file, at, message, origin.line)

    origin_type = typing.get_origin(tp)
    if origin_type in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], dotted, locs, src)
    if origin_type is list:
        if not isinstance(value, list):
            raise fail(f"must be {_type_name(tp)}, got {_yaml_type(value)}")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise fail(f"must be a string, got {_yaml_type(item)}", f"{dotted}[{index}]")
        return list(value)
    if origin_type is dict:
        if not isinstance(value, dict):
            raise fail(f"must be {_type_name(tp)}, got {_yaml_type(value)}")
        out: dict[str, str] = {}
        for key, item in value.items():
            # Env values are strings; YAML turns NCCL_P2P_DISABLE: 1 into an int, which is
            # unambiguous, but true/false would be rendered as "True": make the user quote.
            if isinstance(item, bool) or not isinstance(item, str | int):
                got = _yaml_type(item)
                raise fail(f"must be a string (quote it), got {got}", f"{dotted}.{key}")
            out[key] = str(item)
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise fail(f"must be true or false, got {_yaml_type(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"must be an integer, got {_yaml_type(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail(f"must be a number, got {_yaml_type(value)}")
        # NaN passes every range check (all comparisons are false) and inf breaks the
        # planner's arithmetic; a 400-digit int overflows float(). The loader already
        # refuses .nan/.inf; this keeps the schema itself honest.
        if isinstance(value, int) and abs(value) > 2**63 or not math.isfinite(value):
            raise fail(f"must be a finite number, got {value!r:.40}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise fail(f"must be a string, got {_yaml_type(value)} (quote it)")
        return value
    raise TypeError(f"unsupported schema type {tp!r}")  # pragma: no cover - schema bug


def _yaml_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a mapping"}
    return f"{names.get(type(value), type(value).__name__)} ({value!r})"


def _unknown(key: str, valid: typing.Iterable[str], dotted: str, locs: dict, src: Path):
    origin = locs.get(dotted) or Origin(str(src), None)
    return InputError(origin.file, escaped_key(dotted), f"unknown key{non_ascii_note(key)} "
                      f"(valid: {', '.join(sorted(valid))})", origin.line)


def _build(src: Path, data: dict[str, Any], locs: dict[str, Origin]) -> Profile:
    kwargs: dict[str, Any] = {"name": src.stem, "source": src, "locations": locs}
    _refuse_tokens(data, locs, src)  # first: an unknown key's message would echo nothing
    for key, value in data.items():
        if key in SECTIONS:
            kwargs[key] = _build_section(SECTIONS[key], key, value, locs, src)
        elif key == "bench":
            continue  # below: its checks need the memory section
        elif key == "disaggregation":
            kwargs[key] = parse_disaggregation(value, error_at(locs, src))
        elif key == "quality":
            kwargs[key] = parse_quality(value, error_at(locs, src))
        elif key in TOP_LEVEL and key != "extends":
            kwargs[key] = _coerce(value, TOP_LEVEL[key], key, locs, src)
        else:
            valid = [*SECTIONS, *TOP_LEVEL]
            raise _unknown(key, valid, key, locs, src)
    kwargs["model"] = _model_source(kwargs.get("model"), locs, src)
    if "bench" in data:
        memory = kwargs.get("memory") or MemorySection()
        kwargs["bench"] = parse_bench(data["bench"], error_at(locs, src),
                                      memory.max_running_requests)
    return Profile(**kwargs)


#: Keys that would carry a Hub token in a profile (refused with where it belongs).
TOKEN_KEYS = ("token", "hf_token", "use_auth_token", "api_key")


def _refuse_tokens(data: Any, locs: dict[str, Origin], src: Path, dotted: str = "") -> None:
    """A Hub token anywhere in a profile (a committed, world-readable file) is refused,
    naming the field: tokens belong in host data ``hf_token`` (a 0600 file on the host)."""
    if isinstance(data, dict):
        for key, value in data.items():
            child = f"{dotted}.{key}" if dotted else str(key)
            if dotted == "model" and key in TOKEN_KEYS:
                origin = locs.get(child) or Origin(str(src), None)
                raise InputError(origin.file, child, "a token in a profile file is refused: "
                                 "set host data hf_token (kept in a 0600 file on the host, "
                                 "never on a command line)", origin.line)
            _refuse_tokens(value, locs, src, child)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            _refuse_tokens(item, locs, src, f"{dotted}[{index}]")
    elif isinstance(data, str) and TOKEN_SHAPE.search(data):
        origin = locs.get(dotted) or Origin(str(src), None)
        raise InputError(origin.file, escaped_key(dotted), "holds what looks like a Hugging "
                         "Face token: a profile is a committed file; set host data hf_token "
                         "(the value is not shown)", origin.line)


def _model_source(model: ModelSection | None, locs: dict[str, Origin],
                  src: Path) -> ModelSection:
    """``model.path`` or ``model.hf`` (exactly one); a Hub source is checked here, and
    its repository id stands in for the path until the serve deploy knows the revision's
    directory on the host (and names the served model unless ``served_name`` does)."""
    origin = locs.get("model") or Origin(str(src), None)
    if model is None or not (model.path or model.hf):
        raise InputError(origin.file, "model.path", "required: a local directory or hub id "
                         "(model.path), or a pinned Hub source (model.hf: org/name@<commit>)",
                         origin.line)
    if model.hf is None:
        if model.allow_floating_revision:
            at = locs.get("model.allow_floating_revision") or origin
            raise InputError(at.file, "model.allow_floating_revision", "applies to model.hf "
                             "only (model.path is used as given)", at.line)
        return model
    at = locs.get("model.hf") or origin
    if model.path:
        raise InputError(at.file, "model.hf", "set model.hf or model.path, not both (the "
                         "deploy points --model-path at the fetched revision)", at.line)
    problem = source_problem(model.hf, model.allow_floating_revision)
    if problem:
        raise InputError(at.file, "model.hf", problem, at.line)
    repo = model.hf.partition("@")[0]
    return dataclasses.replace(model, path=repo, served_name=model.served_name or repo)


def error_at(locs: dict[str, Origin], src: Path):
    """``error(dotted, message)`` naming the file and line that set ``dotted`` (or the
    nearest enclosing key that has a location)."""

    def error(dotted: str, message: str) -> InputError:
        probe = dotted
        while probe and probe not in locs:
            shorter = re.sub(r"(\[\d+\]|\.[^.\[]*)$", "", probe)
            probe = "" if shorter == probe else shorter
        origin = locs.get(probe) or Origin(str(src), None)
        return InputError(origin.file, escaped_key(dotted), message, origin.line)

    return error


def _build_section(cls: type, name: str, value: Any, locs: dict, src: Path) -> Any:
    if not isinstance(value, dict):
        origin = locs.get(name) or Origin(str(src), None)
        raise InputError(origin.file, name, f"must be a mapping, got {_yaml_type(value)}",
                         origin.line)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, item in value.items():
        dotted = f"{name}.{key}"
        if key not in fields:
            raise _unknown(key, fields, dotted, locs, src)
        if dotted == "memory.mem_fraction_static" and item == "auto":
            kwargs[key] = None
            continue
        kwargs[key] = _coerce(item, hints[key], dotted, locs, src)
    return cls(**kwargs)


def _check_cross_fields(p: Profile) -> None:
    """Constraints SGLang enforces at start-up (or silently rewrites); failing here means
    failing before a host is touched."""
    par = p.parallel
    for name in ("tp", "ep", "dp", "attention_dp", "nnodes"):
        if getattr(par, name) < 1:
            raise p.error(f"parallel.{name}", "must be at least 1")
    # tp = ep x moe_dp x moe_tp (sglang/srt/.../runtime_context.py), so ep must divide tp.
    if par.tp % par.ep:
        raise p.error("parallel.ep", f"ep={par.ep} must divide tp={par.tp}")
    # attn_tp = tp / attn_dp_size (sglang server_args: attention DP adds no GPUs).
    if par.attention_dp > par.tp:
        raise p.error("parallel.attention_dp", f"attention_dp={par.attention_dp} exceeds "
                      f"tp={par.tp} (attention DP splits the TP group, it adds no GPUs)")
    if par.tp % par.attention_dp:
        raise p.error("parallel.attention_dp",
                      f"attention_dp={par.attention_dp} must divide tp={par.tp}")
    for name in ("node_rank", "dist_init_addr"):
        # one way: the inventory group says who is node 0 and where it is (a hand-written
        # rank in a shared profile gives every host the same one)
        if p.is_set(f"parallel.{name}"):
            raise p.error(f"parallel.{name}", "is set by gpuserve from the inventory group "
                          "(host data sglang_nodes_group, private_address); set "
                          "parallel.nnodes and parallel.dist_init_port only")
    if not 0 < par.dist_init_port < 65536:
        raise p.error("parallel.dist_init_port", "must be in 1..65535")
    if par.nnodes > 1 and par.dist_init_port == p.server.port:
        raise p.error("parallel.dist_init_port", f"{par.dist_init_port} is also server.port: "
                      "node 0 serves HTTP there")
    if not 0 < p.server.port < 65536:
        raise p.error("server.port", "must be in 1..65535")
    problem = host_problem(p.server.host)
    if problem:
        raise p.error("server.host", problem)

    mem = p.memory
    if mem.mem_fraction_static is not None and not 0 < mem.mem_fraction_static < 1:
        raise p.error("memory.mem_fraction_static",
                      f"must be in (0, 1) or auto, got {mem.mem_fraction_static}")
    for name in ("cuda_graph_max_bs", "context_length", "max_running_requests"):
        value = getattr(mem, name)
        if value is not None and value < 1:
            raise p.error(f"memory.{name}", "must be at least 1")
    if mem.chunked_prefill_size is not None and mem.chunked_prefill_size < 1 \
            and mem.chunked_prefill_size != -1:
        raise p.error("memory.chunked_prefill_size", "must be positive, or -1 to disable")
    if p.moe.num_redundant_experts is not None and p.moe.num_redundant_experts < 0:
        raise p.error("moe.num_redundant_experts", "must not be negative")

    spec = p.speculative
    set_spec = [f.name for f in dataclasses.fields(spec)
                if f.name != "algorithm" and getattr(spec, f.name) is not None]
    if set_spec and not spec.algorithm:
        raise p.error(f"speculative.{set_spec[0]}",
                      "speculative settings need speculative.algorithm (e.g. EAGLE3, NEXTN)")
    # SGLang picks (steps, topk, draft_tokens) itself only when all three are unset and
    # asserts otherwise (srt/arg_groups/speculative_hook.py::_auto_choose_speculative_params).
    trio = ("num_steps", "eagle_topk", "num_draft_tokens")
    given = [n for n in trio if getattr(spec, n) is not None]
    if given and len(given) != len(trio):
        missing = [n for n in trio if n not in given]
        raise p.error(f"speculative.{given[0]}",
                      f"set all of num_steps, eagle_topk, num_draft_tokens or none "
                      f"(missing: {', '.join(missing)})")
    for name in trio:
        value = getattr(spec, name)
        if value is not None and value < 1:
            raise p.error(f"speculative.{name}", "must be at least 1")

    _check_secret_args(p)
    _check_env_names(p)
    _check_host_verdicts(p)


def _check_env_names(p: Profile) -> None:
    """The profile's env names: valid, not reserved by the unit, not a secret's."""
    for key in p.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            # systemd's EnvironmentFile= (and a shell) cannot carry it
            raise p.error(f"env.{key}", "not a valid environment variable name"
                          f"{non_ascii_note(key)}")
        reserved = reserved_env(key)
        if reserved:
            raise p.error(f"env.{key}", reserved)
        if is_secret_env_name(key):
            raise p.error(f"env.{key}", "looks like a secret: set it in host data (hf_token / "
                          "sglang_api_key / sglang_extra_env), not in a committed profile")


def _check_host_verdicts(p: Profile) -> None:
    """A profile carries no host verdict unless it says why: the NCCL transport and the
    custom all-reduce choice are the host's, from its measured gates (docs/gpu-gates.md);
    the profile's env is read after the host's nccl.env, so a value there would outrank
    what the host measured (restoring P2P would change nothing)."""
    insist = p.communication.insist
    overrides = [f"env.{k}" for k in HOST_TRANSPORT_ENV if k in p.env]
    if p.communication.disable_custom_all_reduce:
        overrides.insert(0, "communication.disable_custom_all_reduce")
    if insist is not None and (not insist.strip() or "\n" in insist):
        raise p.error("communication.insist", "must be one line saying why this profile "
                      "overrides the host's measured transport choice")
    if overrides and insist is None:
        raise p.error(overrides[0], "is the host's verdict: deploy/host.py measures P2P and "
                      "writes the NCCL env (/etc/gpuserve/nccl.env) and custom all-reduce "
                      "choice (/etc/gpuserve/host.json) the server runs with; remove it, or "
                      "say why this profile overrides the host in communication.insist")
    if insist is not None and not overrides:
        raise p.error("communication.insist", "overrides nothing: set it only with "
                      "communication.disable_custom_all_reduce or an env "
                      f"{', '.join(HOST_TRANSPORT_ENV)} that the profile insists on")


#: One hostname label (RFC 1123 section 2.1): letters, digits and inner hyphens.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def host_problem(host: str) -> str | None:
    """Why ``host`` is neither an IP address nor a hostname (RFC 1123), else None.

    Why: ``server.host`` becomes the server's ``--host`` and is printed by ``gpuserve
    check`` and the deploy (``listens on 0.0.0.0; rm -rf /:30000`` was accepted)."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if name and len(name) <= 253 and all(_LABEL.fullmatch(x) for x in name.split(".")):
        return None
    return (f"{host!r:.80} is neither an IP address nor a hostname (letters, digits and "
            "'-' in dot-separated labels of at most 63 characters; RFC 1123)")


def _check_name(path: Path) -> None:
    """The profile's name (its file stem) is written into the server's env file, the
    rollback record and result file names: a newline there would add env assignments
    (or unit directives), so only a plain name is accepted."""
    for stem in dict.fromkeys((path.stem, path.resolve().stem)):
        if not NAME_PATTERN.fullmatch(stem):
            raise InputError(path, "name", f"profile name {stem!r} must match "
                             f"{NAME_PATTERN.pattern} (letters, digits, '.', '_', '-'; at most "
                             "64 characters, starting with a letter or digit); rename the file")


def _check_secret_args(p: Profile) -> None:
    """A secret flag in ``extra_args`` (``--api-key``, or any abbreviation argparse
    accepts, such as ``--api-k``) would land on the server's command line (``ps``), in
    the journal and in the records. Judged with every catalog the profile targets; the
    message names the option, never the value."""
    from gpuserve.launch import catalog, secrets

    available = catalog.available_versions()
    targets = [catalog.load_catalog(v) for v in (p.sglang_versions or available)
               if v in available] or [None]
    for target in targets:
        for hit in secrets.secret_flags(p.extra_args, target):
            spelled = (f"{hit.given} (an abbreviation of {hit.flag})" if hit.abbreviated
                       else hit.flag)
            raise p.error(f"extra_args[{hit.index}]", f"{spelled} carries a secret: set it "
                          "in host data (sglang_api_key / hf_token), never on the command line")


def _check_arch(p: Profile) -> None:
    """``model.arch`` names a model record (gpuserve/data/models/) the planner and the
    doctor read, ``speculative.draft_arch`` a draft record (models/drafts/); a typo would
    silently switch those checks off."""
    names = paths.model_record_names()
    if p.model.arch is not None and names and p.model.arch not in names:
        raise p.error("model.arch", f"no model record {p.model.arch!r} "
                      f"(known: {', '.join(names)})")
    drafts = paths.draft_record_names()
    if p.speculative.draft_arch is not None and p.speculative.draft_arch not in drafts:
        raise p.error("speculative.draft_arch", f"no draft record "
                      f"{p.speculative.draft_arch!r} (known: {', '.join(drafts) or 'none'})")


def _check_catalog(p: Profile) -> None:
    """Target versions must have a committed flag catalog, and extra_args must parse with
    each of them (done again on the full argv by ``dialect.render_launch``)."""
    try:
        from gpuserve.launch import catalog
    except ImportError:  # pragma: no cover - catalog module not built yet
        return
    available = catalog.available_versions()
    for index, version in enumerate(p.sglang_versions):
        if version not in available:
            raise p.error(f"sglang_versions[{index}]", f"no flag catalog for SGLang {version} "
                          f"(available: {', '.join(available) or 'none'})")
    if not p.extra_args:
        return
    for version in p.sglang_versions or available:
        try:
            catalog.load_catalog(version).validate(["--model-path", p.model.path, *p.extra_args])
        except InputError as exc:
            at = "extra_args"
            for index, arg in enumerate(p.extra_args):
                if arg.split("=", 1)[0] in exc.message:
                    at = f"extra_args[{index}]"
                    break
            raise p.error(at, exc.message) from exc
