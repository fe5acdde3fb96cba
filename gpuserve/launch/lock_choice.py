"""Which lock a host installs, and whether the host can run it: decided before any change.

A lock (``gpuserve.launch.locks``) is one exact, hash-pinned SGLang stack for one
Python minor and one CUDA major. pip never looks at the host's driver, so the choice is
ours: the profile says which SGLang releases it renders for, the host's driver, Python
and glibc say which stacks can start at all, and the newest lock that satisfies both
wins. Every refusal names the host, the lock and the way out, because the alternative
is a 4 GiB download that fails at the health gate (sglang-install.md §0: on an R570/R575
driver pip succeeds and torch then cannot start CUDA).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuserve import versions as pep440
from gpuserve.errors import GpuserveError
from gpuserve.launch.interpreter import InterpreterChoice
from gpuserve.launch.locks import Lock

# Free space a venv needs beyond its wheels: uv unpacks into its cache beside the venvs
# (hard-linked into the venv, one copy) and installed trees are larger than the wheels
# that carry them (torch's 0.5 GiB wheel unpacks to about 1.6 GiB). Twice the wheels
# plus 2 GiB, checked against the lock size.
DISK_FACTOR = 2.0
DISK_MARGIN_BYTES = 2 * 1024**3


class PreflightError(GpuserveError):
    """The host cannot run the chosen (or any) lock; nothing on it has changed."""


@dataclass(frozen=True)
class HostRuntime:
    """What the host brings to an install, read by facts before any operation."""

    name: str
    python: str | None  # "3.11" (major.minor of the python3 that builds the venv)
    glibc: str | None  # "2.36"
    driver: str | None  # "580.126.20" (what nvidia-smi or the installed module says)
    cuda_toolkit: str | None  # "13.0": the toolkit lane flashinfer's JIT would use
    free_bytes: int | None  # free space where the venvs live
    gpus: int = 0
    # the NvidiaGpus fact's rows (name, memory_total_mib, compute_cap, ...): the memory
    # preflight and the records read them
    gpu_list: tuple[dict, ...] = ()
    # the interpreter that builds the venvs (gpuserve.launch.interpreter); ``python`` is
    # its version. None: the system python3 (``python`` is python3's)
    interpreter: InterpreterChoice | None = None


#: ``0.5.23+lab`` -> ``0.5.23``: a local build of a release has that release's flags.
public_version = pep440.public


def _minor(version: str | None) -> str | None:
    if not version:
        return None
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def _major(version: str) -> int | None:
    """The major of a toolkit version (``13.0`` -> 13); None when it is none."""
    parsed = pep440.loose(version)
    return parsed.major if parsed is not None else None


def driver_ok(lock: Lock, driver: str | None) -> bool:
    """The driver runs the lock's CUDA (unknown drivers are judged by the caller)."""
    return driver is not None and pep440.at_least(driver, lock.driver_min)


def _describe(lock: Lock) -> str:
    return (f"lock {lock.name} (sglang {lock.sglang}, torch {lock.torch} for CUDA "
            f"{lock.torch_cuda}, needs driver >= {lock.driver_min})")


def wanted_locks(locks: Iterable[Lock], *, versions: Sequence[str] | None,
                 pinned: str | None) -> list[Lock]:
    """The locks of the profile's ``versions`` (None: any) and the host's ``pinned``
    ``sglang_version``, before anything about the host is known: :func:`choose_lock`
    picks among them, and the serve deploy reads their venvs in its first batch."""
    return [lk for lk in locks
            if (versions is None or public_version(lk.sglang) in versions)
            and (pinned is None or lk.sglang == pinned
                 or ("+" not in pinned and public_version(lk.sglang) == pinned))]


def no_lock_reason(locks: Sequence[Lock], host: str, *, versions: Sequence[str] | None,
                   pinned: str | None, profile: str, source: str | None) -> str:
    """Why no lock is wanted, by its real cause: a pinned version that has a lock but
    that the profile does not render for (its ``sglang_versions`` exclude it), or a
    version without any lock. Why: "generate one" for a lock that exists sent users to
    tools/gen_lock.py when the profile was what refused."""
    where = f" pinned in {source}" if source else ""
    wanted = ", ".join(versions or ["any"])
    if pinned and versions is not None and wanted_locks(locks, versions=None, pinned=pinned):
        return (f"{host}: sglang_version {pinned}{where} is excluded by profile {profile} "
                f"(its sglang_versions: {wanted}; a lock for {pinned} exists); pin one of "
                f"{wanted}, or choose a profile that lists {public_version(pinned)}")
    what = f"sglang_version {pinned}{where}" if pinned else f"profile {profile}"
    have = pep440.ordered({lk.sglang for lk in locks})
    return (f"{host}: no lock for {what} (SGLang {wanted}; locks exist for "
            f"{', '.join(have) or 'none'}); generate one with tools/gen_lock.py and point "
            "sglang_locks_dir at it")


def choose_lock(locks: Iterable[Lock], host: HostRuntime, *, versions: Sequence[str] | None,
                pinned: str | None, profile: str, source: str | None = None) -> Lock:
    """The newest lock the profile renders for and the host can run, or a refusal.

    ``versions`` are the profile's ``sglang_versions`` (None: any catalog), ``pinned``
    the host's ``sglang_version`` (an exact version, local part allowed), set in the
    inventory ``source`` (named in the refusal, so the pin can be found)."""
    locks = list(locks)
    wanted = wanted_locks(locks, versions=versions, pinned=pinned)
    if not wanted:
        raise PreflightError(no_lock_reason(locks, host.name, versions=versions,
                                            pinned=pinned, profile=profile, source=source))
    by_python = [lk for lk in wanted if host.python is None or lk.python == _minor(host.python)]
    if not by_python:
        have = sorted({lk.python for lk in wanted})
        what = (f"the interpreter {host.interpreter.path}" if host.interpreter
                else "python3")
        raise PreflightError(
            f"{host.name}: {what} is {host.python}, but the locks for profile {profile} are "
            f"for Python {', '.join(have)}; set host data sglang_python=managed (a managed "
            f"CPython {have[-1]} for the SGLang venvs only, python3 stays) or "
            f"sglang_python=/path/to/python{have[-1]}")
    runnable = [lk for lk in by_python if lk.supports(python=_minor(host.python) or lk.python,
                                                      glibc=host.glibc or "99.0") is None]
    if not runnable:
        lk = by_python[0]
        raise PreflightError(f"{host.name}: {lk.supports(python=lk.python, glibc=host.glibc)}; "
                             f"{_describe(lk)} cannot be installed here")
    driven = [lk for lk in runnable if driver_ok(lk, host.driver)]
    if not driven:
        if host.driver is None and host.gpus == 0:
            driven = runnable  # no NVIDIA driver at all: the verification says so later
        else:
            newest = pep440.newest(runnable, key=lambda lk: lk.sglang)
            raise PreflightError(
                f"{host.name}: driver {host.driver or 'unknown'} cannot run "
                f"{_describe(newest)}, the newest lock profile {profile} renders for; "
                f"either install driver branch >= {newest.driver_min.split('.')[0]} "
                f"(pyinfra INVENTORY deploy/host.py --data nvidia_driver_branch="
                f"{newest.driver_min.split('.')[0]}), or choose a profile whose "
                f"sglang_versions include a release built for CUDA {_cuda_for(host.driver)}")
    return pep440.newest(driven, key=lambda lk: lk.sglang)


def _cuda_for(driver: str | None) -> str:
    """The CUDA major a driver runs, by the same table the locks were checked against."""
    if driver is None:
        return "12"
    return "13" if pep440.at_least(driver, "580") else "12"


def preflight(lock: Lock, host: HostRuntime) -> list[str]:
    """Problems that would make the install fail or the server misbehave; [] when fine.

    Checked against the chosen lock: disk for its wheels (with margin), and a CUDA
    toolkit of the same major as torch (flashinfer and sgl-kernel JIT-compile with the
    toolkit CUDA_HOME names: a 12.x nvcc building for a CUDA 13 torch is the untested mix
    sglang-install.md §1 warns about)."""
    problems = []
    for ext in lock.external:
        problems.append(f"{host.name}: {_describe(lock)} pins {ext.name}=={ext.version}, which "
                        f"PyPI has only as a placeholder ({ext.why}); generate the lock with "
                        f"tools/gen_lock.py --extra-index-url {ext.index} into sglang_locks_dir "
                        "so its real wheel is hashed (and add that wheel to your wheelhouse: "
                        "gpuserve wheelhouse --lock ...), or pin another sglang_version")
    need = int(lock.download_bytes * DISK_FACTOR) + DISK_MARGIN_BYTES
    if host.free_bytes is not None and host.free_bytes < need:
        problems.append(f"{host.name}: {host.free_bytes / 1024**3:.1f} GiB free for the venvs, "
                        f"{_describe(lock)} needs {need / 1024**3:.1f} GiB "
                        f"({lock.download_bytes / 1024**3:.2f} GiB of wheels x{DISK_FACTOR:g} "
                        f"+ {DISK_MARGIN_BYTES / 1024**3:.0f} GiB); free space or set "
                        "sglang_home on a larger disk")
    if host.cuda_toolkit and _major(host.cuda_toolkit) != lock.cuda_major:
        problems.append(f"{host.name}: CUDA toolkit {host.cuda_toolkit} does not match "
                        f"{_describe(lock)}: run-time kernel builds would use nvcc "
                        f"{host.cuda_toolkit} for a CUDA {lock.torch_cuda} torch; install "
                        f"toolkit lane {lock.torch_cuda} with deploy/host.py "
                        f"(--data cuda_lane={lock.torch_cuda})")
    return problems


def cuda_home(host: HostRuntime, lock: Lock) -> str | None:
    """The toolkit the server's JIT compilers must use (same major as torch), if any."""
    if host.cuda_toolkit and _major(host.cuda_toolkit) == lock.cuda_major:
        return f"/usr/local/cuda-{host.cuda_toolkit}"
    return None
