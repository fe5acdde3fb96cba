"""The lab guest's model directory: a composed GLM-5 NVFP4 checkpoint at /models/GLM-5-NVFP4.

The shipped profile glm5-nvfp4-tp8 serves /models/GLM-5-NVFP4, and the memory preflight
reads that directory's safetensors headers on the host. The lab cannot hold ~440 GB of
weights, so tools/compose_checkpoint.py writes the real-format checkpoint (names, dtypes,
shapes, data_offsets) from the glm-5-nvfp4 record with sparse data, once per input change,
into the instance's state dir. The guest gets config files plus each shard's header only,
then `truncate` restores every shard's full (sparse) size: a few MB cross the ssh pipe.
A stamp with the inputs' digest makes a rerun a no-op.
"""

from __future__ import annotations

import importlib.util
import io
import shlex
import struct
import subprocess
import tarfile
from functools import cache
from pathlib import Path
from types import ModuleType

from lab.sshutil import instance_ssh
from lab.state import InstanceState, instance_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TOOL = REPO_ROOT / "tools" / "compose_checkpoint.py"
MODEL_DIR = "/models/GLM-5-NVFP4"
RECORD = "glm-5-nvfp4"
SHARDS = 80
STAMP = ".gpuserve-composed"
SIZES = ".sizes"


@cache
def compose_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_checkpoint", COMPOSE_TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_cached(
    cache_root: Path, *, record: str = RECORD, shards: int = SHARDS, layers: int | None = None
) -> tuple[Path, str, bool]:
    """(directory, inputs digest, composed now?) of the record's composed checkpoint under
    ``cache_root/models``; rebuilt only when the config, quantization, shard count or the
    tool itself changed."""
    tool = compose_tool()
    config, quant, source = tool.load_record_inputs(record)
    if layers:
        config = {**config, "num_hidden_layers": layers}
    digest = tool.inputs_digest(config, quant, shards)
    out = cache_root / "models" / Path(MODEL_DIR).name
    stamp = out / STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return out, digest, False
    if stamp.exists():
        stamp.unlink()
    tool.compose(config, out, quant=quant, shards=shards, source=source)
    stamp.write_text(digest + "\n")
    return out, digest, True


def upload_archive(src: Path) -> bytes:
    """A tar.gz of the checkpoint as the guest needs it: every small file, each shard cut to
    its 8-byte length + JSON header, and ``.sizes`` ("<bytes> <name>" per shard)."""
    buf = io.BytesIO()
    sizes = []
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(src.iterdir()):
            if path.name == STAMP or not path.is_file():
                continue
            if path.suffix != ".safetensors":
                tar.add(path, arcname=path.name)
                continue
            with open(path, "rb") as f:
                head = f.read(8)
                head += f.read(struct.unpack("<Q", head)[0])
            info = tarfile.TarInfo(path.name)
            info.size = len(head)
            tar.addfile(info, io.BytesIO(head))
            sizes.append(f"{path.stat().st_size} {path.name}\n")
        listing = "".join(sizes).encode()
        info = tarfile.TarInfo(SIZES)
        info.size = len(listing)
        tar.addfile(info, io.BytesIO(listing))
    return buf.getvalue()


def guest_script(dest: str, digest: str) -> str:
    """Shell run on the guest with the archive on stdin: unpack beside ``dest``, restore the
    shards' sparse sizes, stamp, then swap the directory in whole."""
    d, new = shlex.quote(dest), shlex.quote(dest + ".new")
    return (
        f"set -e; rm -rf {new}; mkdir -p {new}; tar -xzf - -C {new}; "
        f'while read -r size name; do truncate -s "$size" {new}/"$name"; done < {new}/{SIZES}; '
        f"rm {new}/{SIZES}; echo {shlex.quote(digest)} > {new}/{STAMP}; "
        f"rm -rf {d}; mv {new} {d}"
    )


def install_models(st: InstanceState, cache_root: Path | None = None) -> str:
    """Compose (cached) and copy the GLM-5 NVFP4 checkpoint to the guest's MODEL_DIR unless
    its stamp already names the same inputs; returns what was done."""
    src, digest, _ = compose_cached(cache_root or instance_dir(st.name))
    ssh = instance_ssh(st)
    stamp = f"{MODEL_DIR}/{STAMP}"
    seen = subprocess.run(
        [*ssh, f"cat {shlex.quote(stamp)} 2>/dev/null || true"],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    if seen == digest:
        return f"{MODEL_DIR}: composed checkpoint up to date"
    subprocess.run(
        [*ssh, guest_script(MODEL_DIR, digest)],
        input=upload_archive(src), check=True, capture_output=True, timeout=600,
    )
    return f"{MODEL_DIR}: composed checkpoint installed ({digest[:12]})"
