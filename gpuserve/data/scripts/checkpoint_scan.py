#!/usr/bin/env python3
"""Describe a safetensors checkpoint without reading its weights.

Uploaded to GPU hosts and run as root with the host's python3 (stdlib only, Python >= 3.8),
and imported on the controller (gpuserve.memory.checkpoint): one implementation of the format.

    python3 checkpoint_scan.py --dir /models/GLM-5-NVFP4 \
        [--cache /var/cache/gpuserve/checkpoint-scan --salt ID]

It prints ONE JSON document on stdout and always exits 0: every problem is an entry of
"errors" so the controller reports it with the file's name.
Only config.json, hf_quant_config.json, model.safetensors.index.json and, of each
*.safetensors file, the 8-byte header length and the JSON header are read.

Output (schema "gpuserve.checkpoint_scan/1"):
    {"schema", "dir", "config": {...} | null, "hf_quant_config": {...} | null,
     "index_total_size": int | null,
     "files": [{"name", "size", "tensors", "header_bytes"}],
     "tensors": [[pattern, dtype, count, total_bytes, shape_of_first], ...],
     "errors": [{"file", "field", "error"}], "elapsed_s"}
Tensor names that differ only in the expert index are one entry (".experts.<N>." ->
".experts.*."), so a 230k-tensor MoE checkpoint stays a few thousand rows; layer indices stay.

With ``--cache DIR`` a clean scan is kept in DIR (one file per checkpoint directory, 0600)
with the stat of every file it read (size, mtime, ctime, inode) and ``--salt`` (the
controller passes a hash of this script): a rerun whose files did not change prints the
kept document ("cache": "hit") instead of reading a few hundred headers again, which took
14 s of every serve rerun on the lab host. ctime cannot be set by a user, so a shard
rewritten in place with its old mtime is still seen. The cache is best-effort: one that
cannot be read or written only costs the scan ("cache": "miss").
"""

import argparse
import contextlib
import hashlib
import json
import os
import struct
import sys
import time

SCHEMA = "gpuserve.checkpoint_scan/1"
# safetensors' own limit (safetensors/src/tensor.rs: MAX_HEADER_SIZE = 100_000_000).
MAX_HEADER = 100000000
# Bits per element, as safetensors' Dtype::bitsize (0.7/0.8, incl. FP4/FP6 and FNUZ fp8).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}
_EXPERTS = ".experts."


def pattern_of(name):
    """``model.layers.5.mlp.experts.17.up_proj.weight`` -> ``...experts.*.up_proj.weight``."""
    i = name.find(_EXPERTS)
    if i < 0:
        return name
    start = i + len(_EXPERTS)
    end = name.find(".", start)
    if end < 0 or not name[start:end].isdigit():
        return name
    return name[:start] + "*" + name[end:]


def tensor_bytes(dtype, shape):
    """Bytes of one tensor from dtype x shape; None when the dtype is unknown."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    n = 1
    for d in shape:
        n *= d
    return (n * bits + 7) // 8


def read_header(path, size):
    """(header dict, header bytes) or raise ValueError with the reason."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError("file shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise ValueError(f"header length {n} exceeds safetensors' limit {MAX_HEADER}")
        if 8 + n > size:
            raise ValueError(f"header length {n} larger than the file ({size} bytes)")
        text = f.read(n)
    if len(text) < n:
        raise ValueError(f"truncated header: {len(text)} of {n} bytes")
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, n


def _check_tensor(name, info, data_size):
    """(dtype, shape, nbytes) of a header entry, or raise ValueError naming the tensor."""
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name}: entry is not an object")
    dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name}: bad shape {shape!r}")
    nbytes = tensor_bytes(dtype, shape)
    if nbytes is None:
        raise ValueError(f"tensor {name}: unknown dtype {dtype!r}")
    if (
        not isinstance(offs, list) or len(offs) != 2
        or not all(isinstance(o, int) for o in offs) or not 0 <= offs[0] <= offs[1]
    ):
        raise ValueError(f"tensor {name}: bad data_offsets {offs!r}")
    if offs[1] > data_size:
        raise ValueError(
            f"tensor {name}: data_offsets {offs} beyond the file's {data_size} data bytes"
        )
    if offs[1] - offs[0] != nbytes:
        raise ValueError(
            f"tensor {name}: data_offsets span {offs[1] - offs[0]} bytes, "
            f"dtype x shape is {nbytes}"
        )
    return dtype, shape, nbytes


def scan_file(path, groups, order):
    """Add one file's tensors to ``groups`` ({(pattern, dtype): [count, bytes, shape]})."""
    size = os.path.getsize(path)
    header, n = read_header(path, size)
    return add_header(os.path.basename(path), size, header, n, groups, order)


def add_header(name_of_file, size, header, n, groups, order):
    """Add one parsed header's tensors to ``groups``; the file's entry of "files".
    Shared by the local scan and the Hub's (gpuserve.memory.remote), so both describe a
    checkpoint with the same records."""
    data_size = size - 8 - n
    count = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, nbytes = _check_tensor(name, info, data_size)
        key = (pattern_of(name), dtype)
        g = groups.get(key)
        if g is None:
            groups[key] = [1, nbytes, shape]
            order.append(key)
        else:
            g[0] += 1
            g[1] += nbytes
        count += 1
    return {"name": name_of_file, "size": size, "tensors": count, "header_bytes": n}


def scan_headers(label, config, quant, index, headers):
    """The scan document of a checkpoint read elsewhere (the Hub): ``headers`` is a list
    of (file name, file size, header dict, header length); ``index`` the index JSON or
    None. Errors name the file as the local scan does."""
    doc = {"schema": SCHEMA, "dir": label, "config": config, "hf_quant_config": quant,
           "index_total_size": None, "files": [], "tensors": [], "errors": []}
    meta = (index or {}).get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("total_size"), int):
        doc["index_total_size"] = meta["total_size"]
    if config is None:
        doc["errors"].append({"file": "config.json", "field": None, "error": "missing"})
    groups, order = {}, []
    for name, size, header, n in headers:
        try:
            doc["files"].append(add_header(name, size, header, n, groups, order))
        except ValueError as exc:
            doc["errors"].append({"file": name, "field": "header", "error": str(exc)})
    doc["tensors"] = [[k[0], k[1], groups[k][0], groups[k][1], groups[k][2]] for k in order]
    return doc


def _json_file(path, errors):
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        errors.append({"file": os.path.basename(path), "field": None, "error": str(exc)})
        return None
    if not isinstance(data, dict):
        errors.append({"file": os.path.basename(path), "field": None,
                       "error": "not a JSON object"})
        return None
    return data


def scan(directory):
    """The scan document (a dict) of one checkpoint directory."""
    t0 = time.time()
    doc = {"schema": SCHEMA, "dir": directory, "config": None, "hf_quant_config": None,
           "index_total_size": None, "files": [], "tensors": [], "errors": []}
    errors = doc["errors"]
    if not os.path.isdir(directory):
        errors.append({"file": directory, "field": "dir", "error": "no such directory"})
        doc["elapsed_s"] = round(time.time() - t0, 3)
        return doc
    doc["config"] = _json_file(os.path.join(directory, "config.json"), errors)
    if doc["config"] is None and not errors:
        errors.append({"file": "config.json", "field": None, "error": "missing"})
    doc["hf_quant_config"] = _json_file(os.path.join(directory, "hf_quant_config.json"), errors)
    index = _json_file(os.path.join(directory, "model.safetensors.index.json"), errors)
    if index is not None:
        meta = index.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("total_size"), int):
            doc["index_total_size"] = meta["total_size"]
    names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    if not names:
        errors.append({"file": directory, "field": "*.safetensors",
                       "error": "no *.safetensors files"})
    groups, order = {}, []
    for name in names:
        path = os.path.join(directory, name)
        try:
            doc["files"].append(scan_file(path, groups, order))
        except (OSError, ValueError) as exc:
            errors.append({"file": name, "field": "header", "error": str(exc)})
    doc["tensors"] = [[k[0], k[1], groups[k][0], groups[k][1], groups[k][2]] for k in order]
    doc["elapsed_s"] = round(time.time() - t0, 3)
    return doc


_READ_JSON = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")


def stat_key(directory, salt):
    """A digest of what a scan of ``directory`` reads: every file's name, size, mtime,
    ctime and inode (a file that changed in any way changes it), and ``salt``."""
    real = os.path.realpath(directory)
    names = sorted(n for n in os.listdir(real) if n.endswith(".safetensors"))
    parts = [SCHEMA, salt, real]
    for name in (*_READ_JSON, *names):
        try:
            st = os.stat(os.path.join(real, name))
        except FileNotFoundError:
            parts.append([name])
            continue
        parts.append([name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def cached_scan(directory, cache_dir, salt):
    """The scan document, from ``cache_dir`` when nothing it read has changed."""
    try:
        key = stat_key(directory, salt)
    except OSError:
        return scan(directory)  # the scan reports the directory's problem
    real = os.path.realpath(directory)
    path = os.path.join(cache_dir, hashlib.sha256(real.encode()).hexdigest()[:32] + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            kept = json.load(f)
        if kept.get("key") == key and isinstance(kept.get("doc"), dict):
            doc = kept["doc"]
            doc["cache"] = "hit"
            return doc
    except (OSError, ValueError, AttributeError):
        pass
    doc = scan(directory)
    doc["cache"] = "miss"
    if doc["errors"]:
        return doc  # never keep a failed scan: the fix may not touch a file it stats
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"key": key, "doc": doc}, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return doc


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="checkpoint directory")
    p.add_argument("--cache", help="directory that keeps clean scans, keyed by the files' stat")
    p.add_argument("--salt", default="", help="part of the cache key (the script's hash)")
    p.add_argument("--stamp", help="after a clean scan, keep the output as STAMP.out and "
                                   "the --stamp-taken file as STAMP.stamp")
    p.add_argument("--stamp-taken", help="the shell's stat of the files, taken before this "
                                         "ran (a name of this run's own)")
    a = p.parse_args(argv)
    try:
        doc = cached_scan(a.dir, a.cache, a.salt) if a.cache else scan(a.dir)
    except Exception as exc:  # never a traceback: the controller reads one JSON document
        doc = {"schema": SCHEMA, "dir": a.dir, "files": [], "tensors": [],
               "errors": [{"file": a.dir, "field": None,
                           "error": f"{type(exc).__name__}: {exc}"}]}
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    if a.stamp and a.stamp_taken:
        keep_for_shell(doc, a.stamp, a.stamp_taken)
    return 0


def keep_for_shell(doc, base, new_stamp):
    """Keep a clean scan's output where the fact's shell finds it without starting
    Python (gpuserve.facts.host.ModelCheckpoint): the output first, then the stamp this
    run's shell took before it started (``new_stamp``, a name of its own: two runs at
    once never swap stamps), so that a stamp never names an output older than itself."""
    if doc["errors"]:
        with contextlib.suppress(OSError):
            os.unlink(new_stamp)
        return
    tmp = f"{base}.out.{os.getpid()}.tmp"
    try:
        os.stat(new_stamp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({**doc, "cache": "hit"}, separators=(",", ":")) + "\n")
        os.replace(tmp, base + ".out")
        os.replace(new_stamp, base + ".stamp")
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


if __name__ == "__main__":
    sys.exit(main())
