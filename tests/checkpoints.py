"""Real-format checkpoints composed at test time (tools/compose_checkpoint.py: real tensor
names, dtypes, shapes and data offsets from a model record; sparse data), shared by the
tests that scan, plan or preflight one."""

from __future__ import annotations

import atexit
import copy
import functools
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

import yaml

from gpuserve.memory.models import MODELS_DIR

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def compose_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose", REPO / "tools/compose_checkpoint.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def compose_record(name: str, out: Path, shards: int = 1, source: str = "",
                   **config: object) -> Path:
    """The checkpoint of model record ``name`` (gpuserve/data/models/<name>.yaml) in
    ``shards`` files under ``out``; ``config`` overrides fields of its config.json,
    ``source`` names it in the composed checkpoint (default: the record)."""
    data = yaml.safe_load((MODELS_DIR / f"{name}.yaml").read_text())
    compose_tool().compose({**data["config"], **config}, out, shards=shards,
                           quant=data.get("quantization_config"), source=source or name)
    return out


_COMPOSED: dict[tuple[str, int], Path] = {}
_SCANS: dict[tuple[str, int], tuple[Path, dict]] = {}


def _composed(name: str, shards: int) -> Path:
    """The process's one composed checkpoint of record ``name`` in ``shards`` files (in a
    temporary directory kept until the process ends; nobody writes into it)."""
    key = (name, shards)
    if key not in _COMPOSED or not _COMPOSED[key].is_dir():
        root = Path(tempfile.mkdtemp(prefix="gpuserve-composed-"))
        atexit.register(shutil.rmtree, root, True)
        _COMPOSED[key] = compose_record(name, root / name, shards=shards)
    return _COMPOSED[key]


def compose_record_once(name: str, out: Path, shards: int = 1) -> Path:
    """:func:`compose_record`'s checkpoint, composed once per test process and hard-linked
    into ``out`` (a directory of its own: files added there stay there). For tests that
    only read it: composing GLM-5's 20 shards took 40-60 s on a busy 2-core machine, and
    five modules each composed their own."""
    shutil.copytree(_composed(name, shards), out, copy_function=os.link)
    return out


def scan_doc_once(name: str, shards: int = 1) -> dict:
    """The host scanner's document (checkpoint_scan.py, what ``scan_directory`` reads) of
    the process's one composed checkpoint of record ``name``, scanned once per process;
    each call gets its own copy. The memory and tune modules composed and scanned GLM-5
    seven times in one process (5 s CPU each on an idle machine)."""
    from gpuserve.memory.checkpoint import scan_module

    key = (name, shards)
    if key not in _SCANS:
        directory = _composed(name, shards)
        _SCANS[key] = (directory, scan_module().scan(str(directory)))
    return copy.deepcopy(_SCANS[key][1])


def scan_once(name: str, shards: int = 1):
    """``scan_directory`` of the process's one composed checkpoint of record ``name``
    (:func:`scan_doc_once`): the same CheckpointScan, without composing or scanning again."""
    from gpuserve.memory.checkpoint import scan_from_dict

    doc = scan_doc_once(name, shards)
    return scan_from_dict(doc, str(_SCANS[(name, shards)][0]))


_ONCE: dict[str, object] = {}


def once_in_dir(key: str, make):
    """``make(directory)`` once per test process, in a temporary directory kept until the
    process ends; later calls return the first value. For read-only values that cost a
    composed checkpoint and its scan (a tune's host snapshot), which several modules
    built each for itself."""
    if key not in _ONCE:
        root = Path(tempfile.mkdtemp(prefix="gpuserve-once-"))
        atexit.register(shutil.rmtree, root, True)
        _ONCE[key] = make(root)
    return _ONCE[key]
