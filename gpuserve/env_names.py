"""Environment names no profile ``env``, host data ``sglang_extra_env`` or ``nccl_env``
may set: one rule for every place that writes the server's EnvironmentFiles.

Why: systemd lets an EnvironmentFile= override the unit's own Environment= lines, so a
profile's ``PYTHONPATH``, ``LD_PRELOAD`` or empty ``PYTHONSAFEPATH`` would load code from
the service's own writable cache instead of the root-owned venv. Refused by name: the
server's arguments variable, the loader's and Python's code-locating names, and the
paths the unit sets for run-time kernel builds.

How: docs/security.md, "gpuserve.env_names: the refused names"
"""

from __future__ import annotations

#: The server's EnvironmentFile variable that carries its arguments (the unit's
#: ExecStart= expands it: gpuserve/serve/render.py).
ARGS_VAR = "GPUSERVE_SGLANG_ARGS"
RESERVED_ENV_MESSAGE = "is reserved: the unit passes the profile's server arguments in it"

_LOADER = "the dynamic loader loads shared objects from it"
_PYTHON = "it changes where Python finds and runs code"
_BUILDS = "the unit sets it for run-time kernel builds, which find and run their compilers there"

#: name -> why it is refused (the ``LD_`` prefix is refused as a whole).
CODE_LOADING_ENV: dict[str, str] = {
    "GCONV_PATH": _LOADER,
    **dict.fromkeys(("PYTHONPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONUSERBASE",
                     "PYTHONSAFEPATH", "PYTHONSTARTUP", "PYTHONINSPECT",
                     "PYTHONPYCACHEPREFIX", "PYTHONBREAKPOINT"), _PYTHON),
    **dict.fromkeys(("PATH", "CUDA_HOME", "CUDA_PATH"), _BUILDS),
}


def reserved_env(name: str) -> str | None:
    """Why ``name`` may not be set in the server's environment, else None."""
    if name == ARGS_VAR:
        return RESERVED_ENV_MESSAGE
    why = _LOADER if name.startswith("LD_") else CODE_LOADING_ENV.get(name)
    if why is None:
        return None
    return (f"is reserved: {why}, and the EnvironmentFile wins over the unit's own "
            "setting; the server runs code only from the root-owned venv")
