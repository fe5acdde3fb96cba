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


#: The lines of a uv install (the bootstrap's pip, then uv 0.13's summaries, printed by
#: crates/uv/src/commands/pip/operations.rs: "Resolved N packages in", "Prepared N
#: packages in", "Installed N packages in"); uv prints nothing per wheel without a tty.
UV_LINES = (r"^(Collecting uv==|Successfully installed uv-|Resolved [0-9]+ package|"
            r"Prepared [0-9]+ package|Installed [0-9]+ package)")


def uv_progress(lines: list[str], lock: Lock, elapsed_s: float) -> str:
    """``fetching and unpacking 19 packages (3.40 GiB by the lock), 45 s``, or the step
    before or after it, from the lines so far (those matching :data:`UV_LINES`)."""
    count = len(lock.packages)
    total = sum(int(p.size or 0) for p in lock.packages) / GIB
    last = lines[-1] if lines else ""
    if last.startswith("Installed "):
        return f"installed {count} packages ({total:.2f} GiB), {elapsed_s:.0f} s"
    if last.startswith("Prepared "):
        return f"all {count} packages fetched ({total:.2f} GiB), installing, {elapsed_s:.0f} s"
    if last.startswith("Resolved "):
        return (f"fetching and unpacking {count} packages ({total:.2f} GiB by the lock), "
                f"{elapsed_s:.0f} s")
    if last.startswith("Collecting uv=="):
        return f"installing the pinned uv, {elapsed_s:.0f} s"
    return f"creating the venv, {elapsed_s:.0f} s"


#: apt-get's lines the progress of a package install is read from (apt 2.x:
#: apt-private/private-install.cc "%lu upgraded, %lu newly installed, ..." and "Need to
#: get %sB of archives."; apt-pkg/acquire-worker "Get:%lu %s [%sB]"; dpkg's "Unpacking
#: %s" and "Setting up %s"). Sizes are SI (apt's SizeToStr divides by 1000).
APT_LINES = r"^([0-9]+ upgraded, |Need to get |Get:[0-9]+ |Unpacking |Setting up )"
_COUNTS = re.compile(r"^(\d+) upgraded, (\d+) newly installed")
_NEED = re.compile(r"^Need to get ([\d.,]+) (B|kB|MB|GB)(?:/([\d.,]+) (B|kB|MB|GB))?")
_GOT = re.compile(r"\[([\d.,]+) (B|kB|MB|GB)\]$")
_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}


def _bytes(number: str, unit: str) -> int:
    return int(float(number.replace(",", "")) * _UNITS[unit])


def _si(n: int) -> str:
    """Bytes as apt prints them (SI units)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def apt_progress(lines: list[str], elapsed_s: float) -> str:
    """``5 of 12 packages fetched (12.3 MB of 456.0 MB), 3 unpacked, 1 set up, 40 s`` from
    apt-get's lines so far (an ``apt-get update`` before the install: ``updating``)."""
    start = next((i for i, line in enumerate(lines) if _COUNTS.match(line)), None)
    if start is None:
        return f"updating the package lists, {elapsed_s:.0f} s"
    counts = _COUNTS.match(lines[start])
    total = int(counts.group(1)) + int(counts.group(2))
    rest = lines[start + 1:]
    need = next((m for line in rest if (m := _NEED.match(line))), None)
    # "Need to get 12 MB/456 MB": 12 MB still to fetch of 456 MB (some were cached)
    need_bytes = _bytes(*need.group(1, 2)) if need else 0
    got = [m for line in rest if line.startswith("Get:") and (m := _GOT.search(line))]
    got_bytes = sum(_bytes(*m.group(1, 2)) for m in got)
    unpacked = sum(line.startswith("Unpacking ") for line in rest)
    set_up = sum(line.startswith("Setting up ") for line in rest)
    return (f"{len(got)} of {total} packages fetched ({_si(got_bytes)} of "
            f"{_si(need_bytes)} to fetch), {unpacked} unpacked, {set_up} set up, "
            f"{elapsed_s:.0f} s")
