"""A Hub checkpoint described from its safetensors headers, before any weight is fetched.

huggingface_hub's ``get_safetensors_metadata`` reads every shard's header with ranged
GETs (about 100 KB a shard, plus the index); ``list_repo_tree`` gives each file's size
and hash. The headers become the very scan document ``checkpoint_scan.py`` prints for a
local directory (its ``scan_headers``), so ``gpuserve.memory.preflight.check_fit`` plans
a Hub checkpoint and a downloaded one with one code path: the serve deploy's preflight
and ``gpuserve plan --hf`` both call :func:`read_remote`.

Every huggingface_hub error becomes an ``InputError`` naming the file and field to fix:
the profile's ``model.hf`` (no such repository, revision, no safetensors), the Hub file
(an index naming a missing shard, a truncated header) or the endpoint's key (a server
answering 404 without ``X-Error-Code`` is not a Hub API: huggingface_hub cannot tell a
missing file from a wrong URL then).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.launch.hf_source import COMMIT, HfSource
from gpuserve.memory.checkpoint import _scan_module

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: Seconds each Hub request may take (huggingface_hub's default is 10).
TIMEOUT = 30.0


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


def hub_api(endpoint: str | None, token: str | None):
    """A huggingface_hub client for ``endpoint`` (None: the public Hub) with ``token``
    (False, not None, without one: never a token file of the controller's user)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token or False, library_name="gpuserve")


@contextlib.contextmanager
def hub_errors(where: Where, source: HfSource, file: str | None = None) -> Iterator[None]:
    """huggingface_hub's exceptions as InputErrors naming what to fix."""
    from huggingface_hub import errors

    label = f"hf:{source.repo_id}@{source.revision}"
    try:
        yield
    except errors.GatedRepoError:
        raise InputError(where.source_file, where.source_field, f"{source.repo_id} is gated: "
                         "accept its terms on the Hub and set host data hf_token") from None
    except errors.RepositoryNotFoundError:
        raise InputError(where.source_file, where.source_field, f"no repository "
                         f"{source.repo_id} at {_endpoint(where)} (or it is private: set "
                         "hf_token)") from None
    except errors.RevisionNotFoundError:
        raise InputError(where.source_file, where.source_field, f"no revision "
                         f"{source.revision!r} in {source.repo_id} at {_endpoint(where)}") from None
    except errors.NotASafetensorsRepoError:
        raise InputError(where.source_file, where.source_field, f"{source.repo_id}@"
                         f"{source.revision} has neither {SINGLE} nor {INDEX}: gpuserve serves "
                         "safetensors checkpoints only") from None
    except errors.SafetensorsParsingError as e:
        raise InputError(f"{label}/{file or '?'}", "header",
                         f"safetensors header unreadable: {_short(e)}") from None
    except errors.RemoteEntryNotFoundError:
        raise InputError(f"{label}/{file or '?'}", None, "not in the repository at this "
                         "revision") from None
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status == 404:
            raise InputError(where.endpoint_file, where.endpoint_field,
                             f"{_endpoint(where)} answered 404 without X-Error-Code "
                             f"({_url(e)}): not a Hugging Face Hub API, or not this "
                             "repository's; check the endpoint (a mirror must answer like "
                             "the Hub)") from None
        if status in (401, 403):
            raise InputError(where.source_file, where.source_field, f"{_endpoint(where)} "
                             f"refused access ({status}) to {source.repo_id}: set or check "
                             "host data hf_token") from None
        raise InputError(where.endpoint_file, where.endpoint_field,
                         f"{_endpoint(where)} answered {status}: {_short(e)}") from None
    except (OSError, ValueError) as e:  # connection refused, timeout, bad URL
        raise InputError(where.endpoint_file, where.endpoint_field, f"could not read "
                         f"{label} from {_endpoint(where)}: {_short(e)}") from None


def _endpoint(where: Where) -> str:
    return where.endpoint or "https://huggingface.co"


def _short(e: BaseException) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def _url(e) -> str:
    try:
        return str(e.response.request.url)[:160]
    except (AttributeError, RuntimeError):
        return "?"


def resolve_commit(api, source: HfSource, where: Where) -> str:
    """The commit ``source.revision`` names (itself when it is one; else one Hub call)."""
    if source.pinned:
        return source.revision
    with hub_errors(where, source):
        sha = api.model_info(source.repo_id, revision=source.revision, timeout=TIMEOUT).sha
    if not sha or not COMMIT.fullmatch(sha):
        raise InputError(where.endpoint_file, where.endpoint_field, f"{_endpoint(where)} "
                         f"resolved {source.spec} to {sha!r}, not a commit")
    return sha


def list_files(api, source: HfSource, commit: str, where: Where) -> tuple[RepoFile, ...]:
    """Every file of the revision with size and hashes (``list_repo_tree``, recursive)."""
    with hub_errors(where, source):
        entries = list(api.list_repo_tree(source.repo_id, recursive=True, revision=commit))
    files = []
    for e in entries:
        if not hasattr(e, "size") or not hasattr(e, "blob_id"):
            continue  # a folder
        lfs = getattr(e, "lfs", None)
        files.append(RepoFile(e.path, int(e.size), lfs["sha256"] if lfs else None, e.blob_id))
    return tuple(sorted(files, key=lambda f: f.path))


def _json_file(api, source: HfSource, commit: str, name: str, where: Where) -> dict:
    with hub_errors(where, source, name):
        path = api.hf_hub_download(source.repo_id, name, revision=commit)
    label = f"hf:{source.repo_id}@{commit}/{name}"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(label, None, f"not JSON: {_short(e)}") from None
    if not isinstance(doc, dict):
        raise InputError(label, None, "not a JSON object")
    return doc


def _optional_json(api, source: HfSource, commit: str, name: str, where: Where) -> dict | None:
    """A small JSON file of the revision, None when the repository has none."""
    return _json_file(api, source, commit, name, where) \
        if _exists(api, source, commit, name, where) else None


def _exists(api, source: HfSource, commit: str, name: str, where: Where) -> bool:
    with hub_errors(where, source, name):
        return bool(api.file_exists(source.repo_id, name, revision=commit))


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
    config = _optional_json(api, source, commit, "config.json", where)
    quant = _optional_json(api, source, commit, "hf_quant_config.json", where)
    shards = sorted({str(v) for v in index["weight_map"].values()}) if index else [SINGLE]
    metas = _parse_headers(api, source, commit, shards, where, index is not None)
    return scan_document(label, config, quant, index, dict(zip(shards, metas, strict=True)))


def scan_document(label: str, config: dict | None, quant: dict | None, index: dict | None,
                  shards: dict) -> dict:
    """checkpoint_scan.py's document from huggingface_hub's parsed headers
    (``{file: SafetensorsFileMetadata}``): each tensor's dtype, shape and data offsets go
    through the local scan's own checks and grouping (``scan_headers``). A ranged read
    does not give a file's size: each file counts as its 8-byte length and its data
    (its header's bytes are not counted)."""
    headers = []
    for name, fm in sorted(shards.items()):
        header = {t: {"dtype": i.dtype, "shape": list(i.shape),
                      "data_offsets": list(i.data_offsets)} for t, i in fm.tensors.items()}
        end = max((i.data_offsets[1] for i in fm.tensors.values()), default=0)
        headers.append((name, 8 + end, header, 0))
    return _scan_module().scan_headers(label, config, quant, index, headers)


#: Shard headers read at once (huggingface_hub's own thread map uses 8 workers too).
PARALLEL_HEADERS = 8


def _parse_headers(api, source: HfSource, commit: str, shards: list[str], where: Where,
                   indexed: bool):
    """Each shard's header (huggingface_hub's parse_safetensors_file_metadata: one ranged
    GET of 100 KB, a second only for a larger header), the first failure in shard order
    raised naming its shard (or the index, for a shard the repository does not have)."""
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub import errors

    def one(name: str):
        try:
            return api.parse_safetensors_file_metadata(source.repo_id, name, revision=commit,
                                                       timeout=TIMEOUT), None
        except Exception as e:  # noqa: BLE001 - re-raised below, in shard order
            return None, e

    with ThreadPoolExecutor(max_workers=PARALLEL_HEADERS) as pool:
        results = list(pool.map(one, shards))
    label = f"hf:{source.repo_id}@{commit}"
    for name, (_, error) in zip(shards, results, strict=True):
        if error is None:
            continue
        if indexed and isinstance(error, errors.RemoteEntryNotFoundError):
            raise InputError(f"{label}/{INDEX}", "weight_map", f"names shard {name!r:.120}, "
                             "which the repository does not have at this revision") from None
        response = getattr(error, "response", None)
        if getattr(response, "status_code", None) == 416:
            # the header's own range lies past the end of the file
            raise InputError(f"{label}/{name}", "header", "truncated: the file ends before "
                             "the header its first 8 bytes announce (HTTP 416 for the "
                             "header's range)") from None
        with hub_errors(where, source, name):
            raise error
    return [meta for meta, _ in results]


def read_remote(source: HfSource, where: Where, token: str | None, headers: bool = True,
                files: bool = True) -> RemoteCheckpoint:
    """Resolve ``source``; read every shard's header (``headers``) and the file list
    with sizes and hashes (``files``)."""
    api = hub_api(where.endpoint, token)
    commit = resolve_commit(api, source, where)
    scan = read_headers(api, source, commit, where) if headers else None
    listed = list_files(api, source, commit, where) if files else ()
    return RemoteCheckpoint(source, commit, listed, scan)
