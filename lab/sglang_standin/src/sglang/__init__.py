"""SGLang stand-in for the gpuserve lab (not SGLang): same CLI, log lines and HTTP API,
simulated GPUs. See lab/sglang_standin/README.md in the gpuserve repository."""

from sglang.version import __version__

__all__ = ["__version__"]
