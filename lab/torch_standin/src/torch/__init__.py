"""torch STAND-IN for the gpuserve lab (not PyTorch: no tensors, no kernels).

It carries only what a deploy asks torch before it trusts a venv: ``__version__``,
``torch.version.cuda`` and the device queries of ``torch.cuda``, answered from the lab
box's stand-in ``nvidia-smi`` the way a real CUDA build answers from the driver. See
lab/torch_standin/README.md in the gpuserve repository.
"""

from torch import cuda, version
from torch.version import __version__

__all__ = ["__version__", "cuda", "version"]
