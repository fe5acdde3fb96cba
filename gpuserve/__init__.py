"""gpuserve: turn a box of GPUs into a tuned SGLang server and prove it.

Pure logic lives here (parsers, profiles, flag dialects, planner, doctor, CLI).
Only ``gpuserve.facts`` imports pyinfra; nothing here imports ``roles`` or ``deploy``.
"""

__version__ = "0.1.0"
