"""The weights step of the serve deploy, decided at prepare time (pure but for the
callables that read the host and the Hub).

For a profile with ``model.hf`` (gpuserve/launch/hf_source.py): the commit (a floating
revision resolved and compared with what the host recorded), whether its directory on
the host is complete (a fact reading the marker: a rerun with it present makes no Hub
call), else the Hub's file list and every shard's header, which the preflight plans from
(one planner, gpuserve/memory/remote.py), and the disk check: bytes still to fetch
against the free bytes at the models directory, refused with the numbers before any
host change. roles/weights fetches with what this decides. docs/weights.md.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.host import mirrors
from gpuserve.launch.hf_source import HfSource
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.launch.profiles import Profile
from gpuserve.memory.remote import RemoteCheckpoint, Where, hub_module
from gpuserve.serve.secret import validate_secret

DEFAULTS = {
    # the Hub (or a mirror answering like it: docs/weights.md) model.hf sources are read
    # from and fetched from, e.g. https://hf-mirror.internal; None: https://huggingface.co.
    # Plain http only for a mirror listed in trusted_mirrors (or on loopback); no
    # credentials (hf_token)
    # accepts: str (an http(s) URL) or None
    "hf_endpoint": None,
    # the endpoint the controller reads the file list and headers from at prepare time,
    # when it cannot reach the host's hf_endpoint under that URL (a mirror on the host's
    # network, or on the controller's own loopback); None: hf_endpoint. Both must serve
    # the same commits
    # accepts: str (an http(s) URL) or None
    "hf_plan_endpoint": None,
    # where model.hf revisions live on the host: <models_dir>/<org>--<name>/<commit>/
    # (None: <sglang_home>/models)
    # accepts: str (an absolute path) or None
    "models_dir": None,
    # accept that a floating model.hf revision (a branch) moved since this host recorded
    # it, and fetch the new commit (one run: --data hf_revision_update=true)
    # accepts: bool
    "hf_revision_update": False,
    # seconds the revision's listing (on the controller and the host) and the download
    # may take before the host fails (the partial files stay and the next run resumes them)
    # accepts: number of seconds
    "weights_timeout": 86_400,
    # seconds a download may bring fewer than 64 KiB (a silent or dripping server)
    # before it stops with a clear error; the partial file stays and a rerun resumes it
    # accepts: number of seconds
    "weights_stall_timeout": 120,
    # bytes per second a download or Hub request must average over each 30 s window:
    # a server dripping its body (progress, but too little to ever finish) stops with a
    # clear error within a window; the partial file stays and a rerun resumes it
    # (0: no floor, the stall timeout alone)
    # accepts: number of bytes per second
    "weights_min_rate": 4096,
    # files the host downloads at once, each hashed as its bytes arrive
    # accepts: int
    "weights_workers": 8,
    # files a revision's listing may name (more is refused: a model is not a dataset)
    # accepts: int
    "weights_max_files": 10_000,
}
#: Seconds between two polls of the background download, and between progress lines.
POLL_S = 2.0
REPORT_S = 10.0


@dataclass(frozen=True)
class WeightsPlan:
    """What roles/weights does for one ``model.hf`` profile."""

    repo_id: str
    commit: str
    target: str  # the immutable revision directory (the unit's --model-path)
    repo_dir: str
    models_dir: str
    endpoint: str | None
    complete: bool  # the marker is there and intact: nothing to do
    total_bytes: int
    to_fetch: int
    files: int
    user: str
    timeout: float
    has_token: bool
    ref_record: str | None  # where a floating revision's commit is recorded
    record: bool = False  # write the commit there (new, or a move accepted)
    stall_timeout: float = 120.0
    max_files: int = 10_000
    min_rate: float = 4096.0
    workers: int = 8

    @property
    def run_dir(self) -> str:
        return f"{self.target}.run"


#: Directories models_dir may be neither, nor lie under: the system's, and other
#: services' homes (the fetch runs as the service user and removes files it refetches).
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
               "/proc", "/root", "/run", "/sbin", "/sys", "/usr", "/var/lib", "/var/log",
               "/var/spool", "/var/mail", "/var/run", "/var/cache", "/var/www")
#: Directories models_dir may not be (but may lie under, as <dir>/models).
SHARED_DIRS = ("/home", "/opt", "/srv", "/mnt", "/media", "/tmp", "/var", "/var/tmp",
               "/usr/local")


def models_dir_of(data: dict, source: str, home: str) -> str:
    """Host data ``models_dir``: an absolute directory of its own (the checks of
    ``sglang_home``), neither a system directory nor in one, nor another part of
    ``sglang_home`` than its ``models``."""
    from gpuserve.serve.install import validate_home

    value = data.get("models_dir") or posixpath.join(home, "models")
    try:
        value = validate_home(value, source)
    except InputError as exc:
        raise InputError(source, "models_dir", exc.message.replace("sglang_home",
                                                                   "models_dir")) from None
    inside = [d for d in SYSTEM_DIRS if value == d or value.startswith(d + "/")]
    if inside or value in SHARED_DIRS:
        raise InputError(source, "models_dir", f"{value!r} is "
                         + (f"in the system directory {inside[0]}" if inside else
                            "a shared directory") + ": name a directory of its own "
                         f"(the default is {home}/models)")
    mine = posixpath.join(home, "models")
    if (value == home or value.startswith(home + "/") or home.startswith(value + "/")) \
            and not (value == mine or value.startswith(mine + "/")):
        raise InputError(source, "models_dir", f"{value!r} overlaps sglang_home {home!r} "
                         f"(its venvs, cache and scripts): use {mine} or a directory "
                         "outside it")
    return value


def endpoint_of(data: dict, source: str, key: str = "hf_endpoint") -> str | None:
    """Host data ``hf_endpoint`` (or ``hf_plan_endpoint``): an http(s) URL without
    credentials, whitespace or control characters; http only for a mirror in
    ``trusted_mirrors``."""
    value = data.get(key)
    if value is None or value == "":
        return None
    problem = hub_module().endpoint_problem(value)
    if problem:
        raise InputError(source, key, problem if "credentials" in problem else
                         f"{problem}, got {ascii(value)[:80]}")
    parsed = urlparse(value)
    prefixes = mirrors.validate_trusted_mirrors(data.get("trusted_mirrors") or [], source)
    if parsed.hostname not in LOOPBACK:  # over loopback nothing crosses a network
        mirrors.require_https(value, key, prefixes, source)
    return value.rstrip("/")


#: Hosts of an endpoint on the machine itself (plain http allowed: no network crossed).
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def stall_of(data: dict, source: str) -> float:
    value = data.get("weights_stall_timeout", DEFAULTS["weights_stall_timeout"])
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            1 <= value <= 86_400):
        raise InputError(source, "weights_stall_timeout", "must be a number of seconds in "
                         f"[1, 86400], got {value!r:.40}")
    return float(value)


def min_rate_of(data: dict, source: str) -> float:
    """Host data ``weights_min_rate``: bytes/s in [0, 1 GiB/s] (0: no floor)."""
    value = data.get("weights_min_rate", DEFAULTS["weights_min_rate"])
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 <= value <= 1 << 30):
        raise InputError(source, "weights_min_rate", "must be a number of bytes per "
                         f"second in [0, 1073741824] (0: no floor), got {value!r:.40}")
    return float(value)


def workers_of(data: dict, source: str) -> int:
    """Host data ``weights_workers``: files downloaded at once, in [1, 64]."""
    value = data.get("weights_workers", DEFAULTS["weights_workers"])
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise InputError(source, "weights_workers", "must be a whole number of files in "
                         f"[1, 64], got {value!r:.40}")
    return value


def max_files_of(data: dict, source: str) -> int:
    value = data.get("weights_max_files", DEFAULTS["weights_max_files"])
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
        raise InputError(source, "weights_max_files", "must be a whole number in "
                         f"[1, 10000000], got {value!r:.40}")
    return value


def one_line(text: object, secrets: tuple = (), limit: int = 300) -> str:
    """Server text for a status line, the journal or pyinfra's output: one line,
    bounded, tokens and Authorization/Bearer material redacted (hub_client's rule)."""
    return hub_module().one_line("" if text is None else text, secrets, limit)


def timeout_of(data: dict, source: str) -> float:
    value = data.get("weights_timeout", DEFAULTS["weights_timeout"])
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value <= 30 * 86_400):
        raise InputError(source, "weights_timeout", "must be a number of seconds in "
                         f"(0, 2592000], got {value!r:.40}")
    return float(value)


@dataclass(frozen=True)
class HostWeights:
    """The WeightsState fact's document."""

    complete: bool
    free_bytes: int
    staged_bytes: int
    recorded: str | None

    @classmethod
    def parse(cls, text: str | None, source: str) -> HostWeights:
        doc = safeload.loads_json(text or "{}", source) if text else {}
        if not isinstance(doc, dict) or doc.get("schema") != "gpuserve.weights/1":
            raise InputError(source, None, "the weights state read on the host is not a "
                             "gpuserve.weights/1 document (python3 missing?)")
        return cls(bool(doc.get("complete")), int(doc.get("free_bytes") or 0),
                   int(doc.get("staged_bytes") or 0),
                   doc.get("recorded") if isinstance(doc.get("recorded"), str) else None)


def where_of(profile: Profile, source: str, data: dict) -> Where:
    """Whom the Hub's errors name: the profile's model.hf, and the endpoint key the
    controller read (hf_plan_endpoint when set, else hf_endpoint)."""
    origin = profile.where("model.hf")
    label = f"{origin.file}:{origin.line}" if origin.line else origin.file
    plan = endpoint_of(data, source, "hf_plan_endpoint")
    if plan is not None:
        return Where(label, "model.hf", source, "hf_plan_endpoint", plan)
    return Where(label, "model.hf", source, "hf_endpoint", endpoint_of(data, source))


def check_data(data: dict, source: str, home: str) -> None:
    """The weights step's host data, checked without reading the host or the Hub."""
    models_dir_of(data, source, home)
    endpoint_of(data, source)
    endpoint_of(data, source, "hf_plan_endpoint")
    validate_secret(data.get("hf_token"), "hf_token", source)
    timeout_of(data, source)
    stall_of(data, source)
    min_rate_of(data, source)
    workers_of(data, source)
    max_files_of(data, source)
    if not isinstance(data.get("hf_revision_update", False), bool):
        raise InputError(source, "hf_revision_update", "must be true or false")


@dataclass(frozen=True)
class WeightsStep:
    """What :func:`plan_weights` found before the preflight; :meth:`finish` (after the
    memory fit passed) lists the revision's files and checks the disk."""

    plan: WeightsPlan
    profile: Profile  # pointed at the revision directory
    found: RemoteCheckpoint | None  # read from the Hub (None: complete, nothing read)
    free_bytes: int
    staged_bytes: int
    where: Where
    token: str | None
    remote: Callable[..., RemoteCheckpoint]

    def finish(self) -> WeightsPlan:
        """The plan with the bytes to fetch; PreflightError when the disk is too small.
        The file list is read only now: a profile that cannot fit costs its headers."""
        if self.plan.complete:
            return self.plan
        pinned = HfSource(self.plan.repo_id, self.plan.commit)
        listed = self.remote(pinned, self.where, self.token, headers=False, files=True,
                             max_files=self.plan.max_files, timeout=self.plan.timeout)
        total = listed.total_bytes
        plan = dataclasses.replace(self.plan, total_bytes=total, files=len(listed.files),
                                   to_fetch=max(total - self.staged_bytes, 0))
        check_disk(plan, self.free_bytes, self.where)
        return plan


def plan_weights(data: dict, source: str, profile: Profile, *, home: str, user: str,
                 host_state: Callable[[str, str, str], str | None],
                 remote: Callable[..., RemoteCheckpoint], want_headers: bool) -> WeightsStep:
    """The commit, the host's state of its directory and, unless complete, the Hub's
    headers for the preflight (``want_headers``). ``host_state(target, ref,
    models_dir)`` is the WeightsState fact; ``remote(source, where, token, headers=,
    files=)`` gpuserve.memory.remote.read_remote."""
    hf = profile.model.source
    assert hf is not None
    check_data(data, source, home)
    models_dir = models_dir_of(data, source, home)
    endpoint = endpoint_of(data, source)
    token = validate_secret(data.get("hf_token"), "hf_token", source)
    update = bool(data.get("hf_revision_update", False))
    where = where_of(profile, source, data)
    ref = None if hf.pinned else hf.ref_record(models_dir)
    commit = hf.revision
    if not hf.pinned:
        commit = remote(hf, where, token, headers=False, files=False).commit
    target = hf.revision_dir(models_dir, commit)
    state = HostWeights.parse(host_state(target, ref or "", models_dir),
                              f"{target} (weights state)")
    if ref and state.recorded and state.recorded != commit and not update:
        raise PreflightError(
            f"{where.source_file}: model.hf: {hf.spec} now resolves to {commit}, but this "
            f"host recorded {state.recorded} ({ref}); pin a commit, or deploy with --data "
            "hf_revision_update=true to fetch the new one; nothing on the host was changed")
    found = None
    if not state.complete and want_headers:
        found = remote(HfSource(hf.repo_id, commit), where, token, headers=True, files=False)
    plan = WeightsPlan(hf.repo_id, commit, target, hf.repo_dir(models_dir), models_dir,
                       endpoint, state.complete, 0, 0, 0, user, timeout_of(data, source),
                       bool(token), ref, record=bool(ref) and state.recorded != commit,
                       stall_timeout=stall_of(data, source),
                       max_files=max_files_of(data, source),
                       min_rate=min_rate_of(data, source), workers=workers_of(data, source))
    model = dataclasses.replace(profile.model, path=target)
    return WeightsStep(plan, dataclasses.replace(profile, model=model), found,
                       state.free_bytes, state.staged_bytes, where, token, remote)


#: Bytes kept free beyond the download (the host script's DISK_RESERVE).
DISK_RESERVE = 1 << 30


def check_disk(plan: WeightsPlan, free: int, where: Where) -> None:
    """Refuse, with the numbers, a download the models directory cannot hold."""
    if plan.to_fetch + DISK_RESERVE <= free:
        return
    gib = 1 << 30
    raise PreflightError(
        f"disk: {plan.models_dir} has {free / gib:.2f} GiB ({free:,} bytes) free; "
        f"{plan.repo_id}@{plan.commit[:12]} needs {plan.to_fetch / gib:.2f} GiB "
        f"({plan.to_fetch:,} bytes) more of {plan.total_bytes:,} in all, plus "
        f"{DISK_RESERVE / gib:.0f} GiB kept free; free space or set host data models_dir "
        f"({where.endpoint_file}); nothing was downloaded and nothing on the host was changed")


def progress_line(host: str, repo: str, doc: dict) -> str:
    """``<host>: weights: org/name: 1.2 GiB of 3.4 GiB (35%), 110 MiB/s, ETA 21 s``."""
    gib, mib = 1 << 30, 1 << 20
    done, total = int(doc.get("bytes") or 0), int(doc.get("total") or 0)
    phase = doc.get("phase") or doc.get("state")
    if phase in ("verify", "refetch", "plan", "present"):
        extra = f": {', '.join(doc.get('bad') or [])} differ, fetched again" \
            if phase == "refetch" else ""
        return f"{host}: weights: {repo}: {phase}{extra} ({total / gib:.2f} GiB)"
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    rate = float(doc.get("rate") or 0)
    eta = doc.get("eta_s")
    eta_text = f", ETA {float(eta):.0f} s" if eta is not None else ""
    return (f"{host}: weights: {repo}: {done / gib:.2f} GiB of {total / gib:.2f} GiB{pct}, "
            f"{rate / mib:.1f} MiB/s{eta_text}")
