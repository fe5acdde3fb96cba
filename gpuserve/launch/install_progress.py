"""Progress of a venv install, read from pip's own output: packages and bytes.

pip prints, for every requirement of a ``-r`` file (src/pip/_internal/operations/
prepare.py and req/req_install.py, pip 23-25), ``Collecting NAME==VERSION (from -r ...)``
before it fetches the wheel, then ``Installing collected packages: a, b, ...`` once every
wheel is there and ``Successfully installed ...`` at the end. The bytes are the lock's:
each package's wheel ``size``, summed over those pip has moved past, so the line says
how far the download is without a second reading of the host.
"""

from __future__ import annotations

import re

from gpuserve.launch.locks import Lock

#: The pip lines the progress is read from (an ERE for grep on the host, too).
PIP_LINES = r"^(Collecting |Installing collected packages|Successfully installed)"
_COLLECTING = re.compile(r"^Collecting ([A-Za-z0-9._-]+)")
GIB = 1 << 30


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_progress(lines: list[str], lock: Lock, elapsed_s: float) -> str:
    """``12 of 19 packages fetched (1.20 of 3.40 GiB by the lock), 45 s``, or the
    install phase, from pip's lines so far (``lines``: those matching :data:`PIP_LINES`)."""
    sizes = {_norm(p.name): int(p.size or 0) for p in lock.packages}
    total_bytes = sum(sizes.values())
    count = len(lock.packages)
    if any(line.startswith("Successfully installed") for line in lines):
        return f"installed {count} packages ({total_bytes / GIB:.2f} GiB), {elapsed_s:.0f} s"
    if any(line.startswith("Installing collected packages") for line in lines):
        return (f"all {count} packages fetched ({total_bytes / GIB:.2f} GiB), installing, "
                f"{elapsed_s:.0f} s")
    seen = list(dict.fromkeys(m.group(1) for line in lines
                              if (m := _COLLECTING.match(line))))
    done = seen[:-1]  # the last one named is still being fetched
    fetched = sum(sizes.get(_norm(name), 0) for name in done)
    current = f"; fetching {seen[-1]}" if seen else "; creating the venv"
    return (f"{len(done)} of {count} packages fetched ({fetched / GIB:.2f} of "
            f"{total_bytes / GIB:.2f} GiB by the lock){current}, {elapsed_s:.0f} s")
