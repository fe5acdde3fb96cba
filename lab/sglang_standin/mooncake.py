"""A ``mooncake-transfer-engine`` stand-in wheel for the lab's PD fleet (not Mooncake).

SGLang's PD servers with the mooncake backend import ``mooncake.engine`` when they set up
their KV manager (0.5.23: srt/distributed/device_communicators/mooncake_transfer_engine.py
line 120), so a PD lock pins the engine (gpuserve/data/disaggregation/backends.yaml) and
the serve deploy refuses a lock without it. This wheel is that package on the lab mirror:
its ``TransferEngine`` moves nothing (the SGLang stand-in hands KV bytes over TCP itself,
lab/sglang_standin/src/sglang/_standin/pd.py). Version: the real 0.3.11.post1 with the
lab's local label.
"""

from __future__ import annotations

from pathlib import Path

from lab import wheelfile

VERSION = "0.3.11.post1+lab"
NAME = "mooncake-transfer-engine"
_ENGINE = b'''"""mooncake.engine stand-in (gpuserve lab): importable, moves nothing."""


class TransferEngine:
    """The real engine moves KV caches over RDMA or TCP; this one refuses to."""

    def initialize(self, *args, **kwargs) -> int:
        raise RuntimeError("mooncake stand-in (gpuserve lab): no transfer engine")
'''
FILES = {"mooncake/__init__.py": b'"""Mooncake stand-in (gpuserve lab)."""\n',
         "mooncake/engine.py": _ENGINE}


def wheel_name() -> str:
    return wheelfile.wheel_name(NAME, VERSION)


def _metadata() -> bytes:
    return wheelfile.metadata(NAME, VERSION, summary="Mooncake transfer engine stand-in for "
                              "the gpuserve lab (moves nothing; not Mooncake)")


def build_wheel(out_dir: Path) -> Path:
    """Write the wheel into ``out_dir`` unless it is up to date."""
    digest = wheelfile.inputs_digest(VERSION, Path(__file__).read_bytes(), _metadata(),
                                     files=FILES)
    return wheelfile.build_wheel(out_dir, wheel_name(), digest, lambda: wheelfile.wheel_bytes(
        NAME, VERSION, FILES, _metadata(), top_level="mooncake",
        generator="gpuserve lab/sglang_standin/mooncake.py"))
