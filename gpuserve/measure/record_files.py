"""Files under the controller's results directory: safe path components and
append-only writes. Below results.py and gates.py, which both write their records so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNSAFE_PATH_CHARS = re.compile(r"[^A-Za-z0-9._@+-]")


def safe_name(text: str) -> str:
    """A path component from a host or profile name (no separators, never . or ..)."""
    name = _UNSAFE_PATH_CHARS.sub("_", text) or "_"
    return "_" + name if name.startswith(".") else name


def write_new_file(path: Path, text: str) -> Path:
    """Write ``text`` as a new file at ``path`` (``-2``, ``-3`` ... when it exists: records
    are append-only), via a hidden temporary file renamed into place, so a reader never
    sees half a file; when writing fails (a full disk) the temporary file is removed and
    the error raised, naming the record it was for (a failed ``write`` carries no file
    name, and "No space left on device" alone does not say what was lost). Returns the
    path written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    final, n = path, 1
    while final.exists():
        n += 1
        final = path.with_name(f"{path.stem}-{n}{path.suffix}")
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, final)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(final)) from e
    return final
