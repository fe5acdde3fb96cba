"""A Hub checkpoint described from its safetensors headers, before any weight is fetched.

The reads huggingface_hub's ``get_safetensors_metadata`` makes (a HEAD for
``model.safetensors`` or the index, the index, a ranged GET of about 100 KB per shard
header), made through hub_client.py, the stdlib module the host script carries too:
caps on every document and header, timeouts on every request, the token to the
endpoint's origin alone. The file list (sizes and hashes) is judged by the same listing
rule on the controller and on the host. The headers become the very scan document
``checkpoint_scan.py`` prints for a local directory (its ``scan_headers``), so
``gpuserve.memory.preflight.check_fit`` plans a Hub checkpoint and a downloaded one with
one code path: the serve deploy's preflight and ``gpuserve plan --hf`` both call
:func:`read_remote`.

Every failure becomes one ``InputError`` naming the file and field to fix: the profile's
``model.hf`` (no such repository, revision, access, no safetensors), the Hub file (an
index naming a missing shard, a truncated header) or the endpoint's key (anything the
server did wrong: refused, timed out, redirected off HTTP, a refused listing, a 404
without ``X-Error-Code``), with the endpoint and ``repo@revision``. docs/weights.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from gpuserve.errors import InputError
from gpuserve.launch.hf_source import COMMIT, HfSource
from gpuserve.memory.checkpoint import scan_module
from gpuserve.paths import SCRIPTS_DIR

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass(frozen=True)
class Where:
    """Whom an error names: the profile's source field, and the endpoint's."""

    source_file: str  # the profile file (or "--hf" on the command line)
    source_field: str  # "model.hf"
    endpoint_file: str  # the inventory (or "--hf-endpoint")
    endpoint_field: str  # "hf_endpoint"
    endpoint: str | None = None


@dataclass(frozen=True)
class RepoFile:
    """One file of a revision: its size and the hash it is verified against."""

    path: str
    size: int
    sha256: str | None  # LFS files
    git_sha1: str  # every file's git blob id


@dataclass(frozen=True)
class RemoteCheckpoint:
    source: HfSource
    commit: str
    files: tuple[RepoFile, ...]
    scan: dict | None  # the checkpoint_scan document (None: headers not read)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def scan_json(self) -> str:
        return json.dumps(self.scan)


def hub_module() -> ModuleType:
    """hub_client.py (stdlib; the host carries the same file beside weights_fetch.py),
    imported once under the name the host script imports it by."""
    name = "gpuserve_hub_client"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS_DIR / "hub_client.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def hub_api(endpoint: str | None, token: str | None, where: Where | None = None):
    """A Hub client for ``endpoint`` (None: the public Hub) with ``token`` (never a
    token file of the controller's user); a bad endpoint URL names its key."""
    hub = hub_module()
    try:
        return hub.Client(endpoint, token)
    except hub.HubError as e:
        where = where or Where("--hf-endpoint", None, "--hf-endpoint", "hf_endpoint")
        raise InputError(where.endpoint_file, where.endpoint_field,
                         str(e).removeprefix("hf_endpoint ")) from None


#: What to do, by the kind of failure (hub_client.HubError.kind).
_ADVICE = {
    "network": "check that the endpoint is reachable from here and retry",
    "timeout": "the server is hung or too slow; retry, or raise host data "
               "weights_stall_timeout (or lower weights_min_rate)",
    "redirect": "the server is not a Hub API one can trust; check the endpoint",
    "listing": "the server's file list is refused as a whole; use the Hub or a mirror "
               "you trust (nothing was downloaded)",
    "document": "the server sent a document gpuserve does not read; check the endpoint",
    "body": "the server's answer does not match its own listing; retry, or use another "
            "mirror",
    "endpoint": "fix the URL",
}


@contextlib.contextmanager
def hub_errors(where: Where, source: HfSource, file: str | None = None) -> Iterator[None]:
    """hub_client's HubError as InputErrors naming what to fix: the profile's model.hf
    (no repository, revision, access), the Hub file (a header), or the endpoint's key
    (everything the server did wrong), one line, the endpoint and repo@revision named."""
    hub = hub_module()
    label = f"hf:{source.repo_id}@{source.revision}"
    try:
        yield
    except hub.HubError as e:
        raise _input_error(e, where, source, label, file) from None


def _input_error(e, where: Where, source: HfSource, label: str,
                 file: str | None) -> InputError:
    at = f"{_endpoint(where)}: {source.repo_id}@{source.revision}"
    if e.kind == "header":
        return InputError(f"{label}/{file or '?'}", "header",
                          f"safetensors header unreadable: {e}")
    if e.kind != "http":
        return InputError(where.endpoint_file, where.endpoint_field,
                          f"{at}{'/' + file if file else ''}: {e}; "
                          f"{_ADVICE.get(e.kind, 'check the endpoint')}")
    if e.code == "GatedRepo":
        return InputError(where.source_file, where.source_field, f"{source.repo_id} is "
                          "gated: accept its terms on the Hub and set host data hf_token")
    if e.code == "RepoNotFound":
        return InputError(where.source_file, where.source_field, f"no repository "
                          f"{source.repo_id} at {_endpoint(where)} (or it is private: set "
                          "hf_token)")
    if e.code == "RevisionNotFound":
        return InputError(where.source_file, where.source_field, f"no revision "
                          f"{source.revision!r} in {source.repo_id} at {_endpoint(where)}")
    if e.code == "EntryNotFound":
        return InputError(f"{label}/{file or '?'}", None, "not in the repository at this "
                          "revision")
    if e.status == 404:
        return InputError(where.endpoint_file, where.endpoint_field,
                          f"{_endpoint(where)} answered 404 without X-Error-Code ({at}): "
                          "not a Hugging Face Hub API, or not this repository's; check "
                          "the endpoint (a mirror must answer like the Hub)")
    if e.status in (401, 403):
        return InputError(where.source_file, where.source_field, f"{_endpoint(where)} "
                          f"refused access ({e.status}) to {source.repo_id}: set or check "
                          "host data hf_token")
    return InputError(where.endpoint_file, where.endpoint_field,
                      f"{at}: {_endpoint(where)} answered {e}; retry later or check the "
                      "endpoint")


def _endpoint(where: Where) -> str:
    return where.endpoint or "https://huggingface.co"


def resolve_commit(api, source: HfSource, where: Where) -> str:
    """The commit ``source.revision`` names (itself when it is one; else one Hub call)."""
    if source.pinned:
        return source.revision
    with hub_errors(where, source):
        sha = api.commit_of(source.repo_id, source.revision)
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise InputError(where.endpoint_file, where.endpoint_field, f"{_endpoint(where)} "
                         f"resolved {source.spec} to {api.say(repr(sha), 60)}, not a commit")
    return sha


def list_files(api, source: HfSource, commit: str, where: Where,
               max_files: int | None = None,
               deadline: float | None = None) -> tuple[RepoFile, ...]:
    """Every file of the revision with size and hashes, judged by hub_client's listing
    rule (the host script applies the same one to its own listing), within ``deadline``
    (time.monotonic)."""
    with hub_errors(where, HfSource(source.repo_id, commit)):
        files = api.list_tree(source.repo_id, commit, max_files or hub_module().MAX_FILES,
                              deadline)
    return tuple(RepoFile(f["path"], f["size"], f["sha256"], f["git_sha1"]) for f in files)


def _json_file(api, source: HfSource, commit: str, name: str, where: Where) -> dict:
    label = f"hf:{source.repo_id}@{commit}/{name}"
    with hub_errors(where, HfSource(source.repo_id, commit), name):
        doc = api.get_json(api.resolve_url(source.repo_id, commit, name), name)
    if not isinstance(doc, dict):
        raise InputError(label, None, "not a JSON object")
    return doc


def _optional_json(api, source: HfSource, commit: str, name: str, where: Where) -> dict | None:
    """A small JSON file of the revision, None when the repository has none."""
    return _json_file(api, source, commit, name, where) \
        if _exists(api, source, commit, name, where) else None


def _exists(api, source: HfSource, commit: str, name: str, where: Where) -> bool:
    with hub_errors(where, HfSource(source.repo_id, commit), name):
        return bool(api.exists(source.repo_id, commit, name))


def read_headers(api, source: HfSource, commit: str, where: Where) -> dict:
    """The scan document of the revision from its config and safetensors headers only:
    as huggingface_hub's get_safetensors_metadata finds them (``model.safetensors``, else
    the index and the shards it names), each header one ranged GET. No file list and no
    weight is read: a misfit is refused for the price of the headers."""
    label = f"hf:{source.repo_id}@{commit}"
    index = None
    if not _exists(api, source, commit, SINGLE, where):
        if not _exists(api, source, commit, INDEX, where):
            raise InputError(where.source_file, where.source_field, f"{source.repo_id}@"
                             f"{commit} has neither {SINGLE} nor {INDEX}: gpuserve serves "
                             "safetensors checkpoints only")
        index = _json_file(api, source, commit, INDEX, where)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{label}/{INDEX}", "weight_map", "missing or empty")
        _check_shards(weight_map, label)
    config = _optional_json(api, source, commit, "config.json", where)
    quant = _optional_json(api, source, commit, "hf_quant_config.json", where)
    shards = sorted({str(v) for v in index["weight_map"].values()}) if index else [SINGLE]
    metas = _parse_headers(api, source, commit, shards, where, index is not None)
    return scan_document(label, config, quant, index, dict(zip(shards, metas, strict=True)))


def _check_shards(weight_map: dict, label: str) -> None:
    """The index's shard names under the listing rule (a name a server sends)."""
    hub = hub_module()
    for name in {v for v in weight_map.values()}:
        problem = hub.path_problem(name)
        if problem:
            raise InputError(f"{label}/{INDEX}", "weight_map",
                             f"shard name {hub.shown(name)} {problem}")
    if len(set(weight_map.values())) > hub.MAX_FILES:
        raise InputError(f"{label}/{INDEX}", "weight_map",
                         f"names more than {hub.MAX_FILES} shards")


def scan_document(label: str, config: dict | None, quant: dict | None, index: dict | None,
                  shards: dict) -> dict:
    """checkpoint_scan.py's document from the shards' raw headers (``{file: header
    dict}``): each tensor's dtype, shape and data offsets go through the local scan's own
    checks and grouping (``scan_headers``). A ranged read does not give a file's size:
    each file counts as its 8-byte length and its data (its header's bytes are not
    counted)."""
    headers = []
    for name, header in sorted(shards.items()):
        ends = [t.get("data_offsets") for k, t in header.items()
                if k != "__metadata__" and isinstance(t, dict)]
        end = max((o[1] for o in ends if isinstance(o, list) and len(o) == 2
                   and isinstance(o[1], int) and not isinstance(o[1], bool)), default=0)
        headers.append((name, 8 + max(end, 0), header, 0))
    return scan_module().scan_headers(label, config, quant, index, headers)


#: Shard headers read at once (huggingface_hub's own thread map uses 8 workers too).
PARALLEL_HEADERS = 8


def _parse_headers(api, source: HfSource, commit: str, shards: list[str], where: Where,
                   indexed: bool):
    """Each shard's header (hub_client.header_of: one ranged GET of 100 KB, a second
    only for a larger header, more than asked refused), the first failure in shard order
    raised naming its shard (or the index, for a shard the repository does not have)."""
    from concurrent.futures import ThreadPoolExecutor

    hub = hub_module()

    def one(name: str):
        try:
            return hub.header_of(api, source.repo_id, commit, name), None
        except hub.HubError as e:
            return None, e

    with ThreadPoolExecutor(max_workers=PARALLEL_HEADERS) as pool:
        results = list(pool.map(one, shards))
    label = f"hf:{source.repo_id}@{commit}"
    for name, (_, error) in zip(shards, results, strict=True):
        if error is None:
            continue
        if indexed and error.code == "EntryNotFound":
            raise InputError(f"{label}/{INDEX}", "weight_map", f"names shard "
                             f"{hub.shown(name)}, which the repository does not have at "
                             "this revision")
        raise _input_error(error, where, HfSource(source.repo_id, commit), label, name)
    return [meta for meta, _ in results]


def read_remote(source: HfSource, where: Where, token: str | None, headers: bool = True,
                files: bool = True, max_files: int | None = None,
                timeout: float | None = None) -> RemoteCheckpoint:
    """Resolve ``source``; read every shard's header (``headers``) and the file list
    with sizes and hashes (``files``)."""
    api = hub_api(where.endpoint, token, where)
    commit = resolve_commit(api, source, where)
    scan = read_headers(api, source, commit, where) if headers else None
    deadline = time.monotonic() + timeout if timeout else None
    listed = list_files(api, source, commit, where, max_files, deadline) if files else ()
    return RemoteCheckpoint(source, commit, listed, scan)
