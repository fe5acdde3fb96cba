"""The SGLang stand-in: a standard-library ``sglang`` wheel for the lab host.

Why: the lab VM has no GPU, yet the serve deploy must install ``sglang`` with pip,
start it under systemd, wait for /health and benchmark it. The stand-in is a real
wheel (distribution ``sglang``, versions ``<X>+lab`` for every committed flag
catalog) whose ``sglang serve`` / ``python -m sglang.launch_server`` accepts exactly
the launch flags of version X (the bundled catalog, parsed by gpuserve's own
stdlib-only parser module, vendored into the wheel), logs SGLang's real start-up
lines and serves SGLang's HTTP API with simulated memory and decode speed.

Each wheel requires the torch and kernel wheel its real release pins
(``Requires-Dist: torch==2.14.1+lab``, ``sglang-kernel==0.4.10+lab`` for 0.5.23;
lab/torch_standin/versions.yaml), so resolving ``sglang==0.5.23+lab`` from the mirror
gives the lab's whole stack, as a lock generator resolves the real one.

``python -m sglang.benchmark.serving`` is SGLang's benchmark client: the wheel also
bundles that version's client catalog (gpuserve/data/bench/, tools/gen_bench_catalog.py),
so the stand-in client accepts exactly the real client's command line.

``publish(mirror_root)`` writes the wheels to ``mirror_root/"wheels"`` (pip
find-links) and skips the build when none of its inputs changed (lab/wheelfile.py).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from gpuserve.launch.catalog import available_versions
from gpuserve.paths import PACKAGE_DIR
from lab import torch_standin, wheelfile

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
LOCAL = "lab"


SURFACE_SOURCE = HERE.parent / "surface.py"
SURFACES_DIR = HERE.parent / "surfaces"


def _surface_files() -> dict[str, bytes]:
    """lab/surface.py verbatim (one implementation for the lab and the server) and the
    shipped surfaces, so GPUSERVE_LAB_STANDIN_SURFACE can name one (``field-notes``)."""
    files = {"sglang/_standin/surface.py": SURFACE_SOURCE.read_bytes()}
    for path in sorted(SURFACES_DIR.glob("*.yaml")):
        files[f"sglang/_standin/surfaces/{path.name}"] = path.read_bytes()
    return files


def _flagparser_source() -> bytes:
    return (PACKAGE_DIR / "launch" / "flagparser.py").read_bytes()


def _catalog_bytes(base_version: str) -> bytes:
    return (resources.files("gpuserve") / "data" / "flags" / f"sglang-{base_version}.json"
            ).read_bytes()


def _bench_catalog_bytes(base_version: str) -> bytes | None:
    """The benchmark client's catalog (tools/gen_bench_catalog.py), when one is committed."""
    path = resources.files("gpuserve") / "data" / "bench" / f"sglang-{base_version}-serving.json"
    return path.read_bytes() if path.is_file() else None


def standin_versions() -> list[str]:
    """``0.5.19+lab``, ``0.5.23+lab``: one per committed flag catalog that the lab's CUDA
    stack stand-ins cover (a row in lab/torch_standin/versions.yaml). The CUDA 12 release
    0.5.10.post1 has a catalog and PyPI locks but no lab stand-in: the lab's stack is
    CUDA 13 only (docs/lab.md)."""
    covered = torch_standin.covered_sglang_versions()
    return [f"{v}+{LOCAL}" for v in available_versions() if v in covered]


def wheel_name(version: str) -> str:
    return wheelfile.wheel_name("sglang", version)


def requirements(version: str) -> list[str]:
    """``torch==2.14.1+lab``, ``sglang-kernel==0.4.10+lab`` for ``0.5.23+lab``: the pins of
    the real release, on the lab's stand-ins (lab/torch_standin/versions.yaml)."""
    return [f"torch=={torch_standin.torch_for_sglang(version)}",
            f"sglang-kernel=={torch_standin.kernel_for_sglang(version)}",
            # real SGLang downloads through huggingface_hub; the lab mirror carries the real
            # wheel and its closure (lab/locks.py, publish_hub_client)
            "huggingface_hub"]


def _package_files(version: str) -> dict[str, bytes]:
    """Every file of the ``sglang`` package in the wheel, by archive path."""
    files = wheelfile.source_files(SRC, "sglang")
    base = version.split("+", 1)[0]
    files["sglang/version.py"] = (
        '"""Version of this SGLang stand-in (the local part marks the lab build)."""\n\n'
        f'__version__ = "{version}"\n'
        f"__version_tuple__ = {tuple(int(p) for p in base.split('.'))!r}\n"
    ).encode()
    files["sglang/_standin/flagparser.py"] = _flagparser_source()
    files.update(_surface_files())
    files["sglang/_standin/flags.json"] = _catalog_bytes(base)
    bench = _bench_catalog_bytes(base)
    if bench is not None:  # python -m sglang.benchmark.serving parses with it
        files["sglang/_standin/bench.json"] = bench
    return files


def _metadata(version: str) -> bytes:
    # Like the real wheel, sglang pins the exact torch and kernel wheel it was built with.
    return wheelfile.metadata(
        "sglang", version, license="Apache-2.0", requires=requirements(version),
        summary="SGLang stand-in for the gpuserve lab (simulated GPUs; not SGLang)")


def build_wheel_bytes(version: str) -> bytes:
    """The wheel as bytes; identical inputs give identical bytes (fixed timestamps)."""
    return wheelfile.wheel_bytes(
        "sglang", version, _package_files(version), _metadata(version),
        entry_points=b"[console_scripts]\nsglang = sglang.cli.main:main\n",
        top_level="sglang", generator="gpuserve lab/sglang_standin")


def _inputs_digest(version: str) -> str:
    return wheelfile.inputs_digest(version, Path(__file__).read_bytes(), _metadata(version),
                                   files=_package_files(version))


def build_wheel(version: str, out_dir: Path) -> Path:
    """Write the wheel for ``version`` into ``out_dir`` unless it is up to date."""
    return wheelfile.build_wheel(out_dir, wheel_name(version), _inputs_digest(version),
                                 lambda: build_wheel_bytes(version))


def publish(mirror_root: Path) -> None:
    """Put the stand-in wheels into ``mirror_root/wheels`` (pip --find-links)."""
    out = Path(mirror_root) / "wheels"
    for version in standin_versions():
        build_wheel(version, out)
    from lab.sglang_standin import mooncake  # the PD fleet's transfer engine (lab/locks.py)

    mooncake.build_wheel(out)
