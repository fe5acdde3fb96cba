"""Real-format checkpoints composed at test time (tools/compose_checkpoint.py: real tensor
names, dtypes, shapes and data offsets from a model record; sparse data), shared by the
tests that scan, plan or preflight one."""

from __future__ import annotations

import atexit
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


def compose_record_once(name: str, out: Path, shards: int = 1) -> Path:
    """:func:`compose_record`'s checkpoint, composed once per test process and hard-linked
    into ``out`` (a directory of its own: files added there stay there). For tests that
    only read it: composing GLM-5's 20 shards took 40-60 s on a busy 2-core machine, and
    five modules each composed their own."""
    key = (name, shards)
    if key not in _COMPOSED or not _COMPOSED[key].is_dir():
        root = Path(tempfile.mkdtemp(prefix="gpuserve-composed-"))
        atexit.register(shutil.rmtree, root, True)
        _COMPOSED[key] = compose_record(name, root / name, shards=shards)
    shutil.copytree(_COMPOSED[key], out, copy_function=os.link)
    return out


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
