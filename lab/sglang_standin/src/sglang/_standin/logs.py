"""SGLang's log line format, so the lab's journal reads like a real server's.

prepare_server_args sets ``[%(asctime)s] %(message)s`` (datefmt %Y-%m-%d %H:%M:%S);
scheduler processes add their rank, e.g. ``[2026-01-01 10:00:00 TP0] ...``
(srt/utils/common.py::configure_logger). uvicorn prints ``INFO:     ...``.
"""

from __future__ import annotations

import sys
import threading
import time

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_lock = threading.Lock()
_threshold = 20


def set_level(name: str) -> None:
    global _threshold
    _threshold = _LEVELS.get(str(name).lower(), 20)


def log(message: str, rank: str | None = None, level: str = "info") -> None:
    if _LEVELS.get(level, 20) < _threshold:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    prefix = f" {rank}" if rank else ""
    with _lock:
        sys.stderr.write(f"[{stamp}{prefix}] {message}\n")
        sys.stderr.flush()


def uvicorn(message: str, level: str = "info") -> None:
    if _LEVELS.get(level, 20) < _threshold:
        return
    with _lock:
        sys.stderr.write(f"{level.upper() + ':':<9} {message}\n")
        sys.stderr.flush()
