"""A stand-in CUDA kernel library: an ELF64 file whose ``.nv_fatbin`` lists cubins.

The real sglang-kernel wheel's ``sgl_kernel/.../common_ops.abi3.so`` carries its GPU
code in a ``.nv_fatbin`` section: a fat-binary header (magic 0xBA55ED50, u16 version,
u16 header size, u64 payload size) followed by entries (u16 kind: 1 PTX, 2 cubin; u32
entry header size at 4; u64 padded payload size at 8; u32 SM number at 28). That is
what ``cuobjdump --list-elf`` lists and what tools/gen_lock.py reads a lock's
``cuda_archs`` from. This writes the smallest such file: an ELF header, the section and
its name table, no code (nothing loads it; the lab's SGLang stand-in never imports
``sgl_kernel``). The payload of each entry is a text label, not a cubin.
"""

from __future__ import annotations

import struct

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_CUBIN = 2
ENTRY_HEADER = 64


def _align(data: bytes, to: int = 8) -> bytes:
    return data + b"\0" * (-len(data) % to)


def fatbin(sass: list[int], ptx: list[int] = ()) -> bytes:
    """A fat binary with one cubin entry per SM in ``sass`` and one PTX per ``ptx``."""
    entries = b""
    for kind, archs in ((KIND_CUBIN, sass), (KIND_PTX, ptx)):
        for arch in archs:
            payload = _align(f"gpuserve lab stand-in: no code for sm_{arch}\n".encode())
            header = struct.pack("<HHIQIIII", kind, 0x0101, ENTRY_HEADER, len(payload),
                                 len(payload), 0, 0, arch)
            entries += header + b"\0" * (ENTRY_HEADER - len(header)) + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(entries)) + entries


def elf_with_fatbin(sass: list[int], ptx: list[int] = ()) -> bytes:
    """An x86-64 ELF64 shared object holding only a ``.nv_fatbin`` section."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    body = _align(fatbin(sass, ptx))
    fat_off = 64
    str_off = fat_off + len(body)
    sh_off = str_off + len(_align(names))
    sections = [
        b"\0" * 64,
        struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, fat_off, len(body), 0, 0, 8, 0),
        struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, str_off, len(names), 0, 0, 1, 0),
    ]
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64,
                                 len(sections), 2)
    return header + body + _align(names) + b"".join(sections)
