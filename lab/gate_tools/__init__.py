"""Lab stand-ins of the GPU measuring tools, served from the mirror as source archives.

``publish(mirror_root)`` writes ``mirror_root/gates/nccl-tests-lab.tar.gz`` and
``cuda-samples-lab.tar.gz`` (byte-identical for identical inputs) and ``SHA256SUMS``;
inventory/lab.py points host data ``gates_sources`` at them with those digests. Each
archive builds the way the real source does, with the same commands the product runs:

- nccl-tests: ``make CUDA_HOME=.. NCCL_HOME=.. [NVCC_GENCODE=..]`` at the top level puts
  ``all_reduce_perf``, ``all_gather_perf`` and ``alltoall_perf`` in ``build/``; like the
  real link it fails without ``$NCCL_HOME/lib/libnccl.so`` (gpu-gates.md §2, fix 1);
- cuda-samples: ``cmake -S Samples/5_Domain_Specific/p2pBandwidthLatencyTest -B b`` and
  ``cmake --build b`` put ``p2pBandwidthLatencyTest`` in ``b/`` (needs ``Common``).

The binaries are shell scripts that print outputs of the lab's boxes in the tools' real
formats: the files of tests/fixtures/gates (see its SOURCES.md: the 8-GPU all-reduce,
all-gather and all-to-all outputs and the P2P matrices there are *composed* in the real
layout, labelled so in their names; there is no verbatim full capture of these boxes;
all-gather and all-to-all exist for the RTX PRO 6000 boxes only). Which one follows
``/etc/gpuserve-lab/box`` and ``NCCL_P2P_DISABLE``; the reference box with its P2P
clique (``rtxpro6000-kvm-p2p``) prints the P2P-on outputs of the bare-metal box (the same
cards and links; a composition, as every output here is). Switches on the guest:

- ``/etc/gpuserve-lab/gates-hang``: lines ``<tool>`` (always hangs) or ``<tool> p2p``
  (hangs unless ``NCCL_P2P_DISABLE=1``), e.g. ``all_reduce_perf p2p``;
- ``/etc/gpuserve-lab/gates-slow``: a factor, e.g. ``4``: all_reduce times x4, algbw and
  busbw / 4, and p2pBandwidthLatencyTest's P2P=Enabled bandwidths between GPUs / 4 (a
  composed slow box, on ``hgx-h100`` a degraded NVLink: below expectation).

The NVSwitch box ``hgx-h100`` answers with its own figures: eight H100 over NVLink 4
(``all_reduce_h100x8_gate_composed.txt``: its rows up to the 4 GiB the nvlink4
expectation reads, and with ``NCCL_P2P_DISABLE=1`` the host-memory path's figures,
``all_reduce_h100x8_p2p_off_composed.txt``; ``p2p_bw_h100x8_nvlink_composed.txt``: 8x8
matrices near the published 742-749 GB/s bidirectional pairs).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "gates"
SUBDIR = "gates"
EPOCH = 1767225600  # 2026-01-01: fixed mtimes inside the archives
P2P_SUBDIR = "Samples/5_Domain_Specific/p2pBandwidthLatencyTest"

#: output name -> fixture file (all composed: see tests/fixtures/gates/SOURCES.md)
OUTPUTS = {
    "ar_h200": "all_reduce_h200x8_gate_composed.txt",
    "ar_h100": "all_reduce_h100x8_gate_composed.txt",
    "ar_h100_off": "all_reduce_h100x8_p2p_off_composed.txt",
    "ar_pro_on": "all_reduce_pro6000x8_p2p_on_composed.txt",
    "ar_pro_off": "all_reduce_pro6000x8_p2p_off_composed.txt",
    "ag_pro_on": "all_gather_pro6000x8_p2p_on_composed.txt",
    "ag_pro_off": "all_gather_pro6000x8_p2p_off_composed.txt",
    "a2a_pro_on": "alltoall_pro6000x8_p2p_on_composed.txt",
    "a2a_pro_off": "alltoall_pro6000x8_p2p_off_composed.txt",
    "p2p_on": "p2p_bw_pro6000x2_p2p_on_composed.txt",
    "p2p_none": "p2p_bw_full_composed.txt",
    "p2p_nvlink": "p2p_bw_h100x8_nvlink_composed.txt",
}

_SCRIPT_HEAD = r'''#!/bin/sh
# gpuserve lab stand-in for @TOOL@ (not NVIDIA's tool): prints outputs of the lab's
# boxes in the tool's real format. They are composed, not captures (see
# tests/fixtures/gates/SOURCES.md in the gpuserve repository).
tool=@TOOL@
box=$(cat /etc/gpuserve-lab/box 2>/dev/null)
box=${box:-rtxpro6000-kvm}
hang=/etc/gpuserve-lab/gates-hang
if [ -f "$hang" ]; then
  while read -r t when; do
    [ "$t" = "$tool" ] || continue
    if [ -z "$when" ] || { [ "$when" = p2p ] && [ "${NCCL_P2P_DISABLE:-0}" != 1 ]; }; then
      exec sleep 86400
    fi
  done < "$hang"
fi
slow=$(cat /etc/gpuserve-lab/gates-slow 2>/dev/null)
emit() {
  if [ -n "$slow" ] && [ "$tool" = all_reduce_perf ]; then
    awk -v f="$slow" '$1 ~ /^[0-9]+$/ && NF >= 13 {
      $6 = sprintf("%.1f", $6 * f); $7 = sprintf("%.2f", $7 / f); $8 = sprintf("%.2f", $8 / f)
      $10 = sprintf("%.1f", $10 * f); $11 = sprintf("%.2f", $11 / f); $12 = sprintf("%.2f", $12 / f)
    } { print }'
  elif [ -n "$slow" ] && [ "$tool" = p2pBandwidthLatencyTest ]; then
    # the P2P=Enabled bandwidths between GPUs / factor (a degraded link), self cells kept
    awk -v f="$slow" '
      /^(Unidirectional|Bidirectional) P2P=Enabled/ { sec = 1; print; next }
      /Matrix/ { sec = 0 }
      sec && $1 ~ /^[0-9]+$/ {
        row = sprintf("%6d", $1)
        for (k = 2; k <= NF; k++) row = row sprintf(" %6.2f", (k - 2 == $1) ? $k : $k / f)
        print row " "; next
      }
      { print }'
  else
    cat
  fi
}
'''

_SCRIPT_TAIL = r'''
case "$tool" in
  all_reduce_perf)
    case "$box" in
      h200-nvlink) out_ar_h200 | emit ;;
      hgx-h100)
        if [ "${NCCL_P2P_DISABLE:-0}" = 1 ]; then out_ar_h100_off | emit
        else out_ar_h100 | emit; fi ;;
      rtxpro6000-baremetal|rtxpro6000-kvm-p2p)  # P2P on bare metal or in a clique
        if [ "${NCCL_P2P_DISABLE:-0}" = 1 ]; then out_ar_pro_off | emit
        else out_ar_pro_on | emit; fi ;;
      *) out_ar_pro_off | emit ;;  # a VM without P2P: NCCL uses SHM either way
    esac ;;
  all_gather_perf|alltoall_perf)
    # EP hosts' collectives (recorded for the RTX PRO 6000 boxes only)
    c=ag; [ "$tool" = alltoall_perf ] && c=a2a
    case "$box" in
      h200-nvlink)
        echo "$tool: the gpuserve lab has no recorded output of this tool for box $box" >&2
        exit 1 ;;
      rtxpro6000-baremetal|rtxpro6000-kvm-p2p)
        if [ "${NCCL_P2P_DISABLE:-0}" = 1 ]; then out_${c}_pro_off; else out_${c}_pro_on; fi ;;
      *) out_${c}_pro_off ;;
    esac ;;
  p2pBandwidthLatencyTest)
    case "$box" in
      hgx-h100) out_p2p_nvlink | emit ;;
      h200-nvlink|rtxpro6000-baremetal|rtxpro6000-kvm-p2p) out_p2p_on | emit ;;
      *) out_p2p_none | emit ;;
    esac ;;
  *)
    echo "$tool: the gpuserve lab has no recorded output of this tool for box $box" >&2
    exit 1 ;;
esac
'''


def standin_script() -> str:
    """The one script every stand-in binary is (``@TOOL@`` filled in by the build)."""
    parts = [_SCRIPT_HEAD]
    for name, fixture in OUTPUTS.items():
        text = (FIXTURES / fixture).read_text()
        if "GPUSERVE_EOF" in text:
            raise ValueError(f"{fixture} contains the heredoc delimiter")
        parts.append(f"out_{name}() {{\ncat <<'GPUSERVE_EOF'\n{text.rstrip()}\nGPUSERVE_EOF\n}}\n")
    parts.append(_SCRIPT_TAIL)
    return "".join(parts)


NCCL_MAKEFILE = r'''# gpuserve lab stand-in of NVIDIA nccl-tests' top-level Makefile: the same
# variables and the same outputs (build/<tool>), no compiler. Like the real link, it needs
# $(NCCL_HOME)/lib/libnccl.so and $(NCCL_HOME)/include/nccl.h.
BUILDDIR ?= build
NCCL_HOME ?= /usr
CUDA_HOME ?= /usr/local/cuda
BINS := all_reduce_perf all_gather_perf alltoall_perf
NO_LIB := /usr/bin/ld: cannot find -lnccl: No such file or directory
NO_HEADER := src/common.h: fatal error: nccl.h: No such file or directory

default: $(BINS)

$(BINS):
	@test -e $(NCCL_HOME)/lib/libnccl.so || { echo "$(NO_LIB)" >&2; exit 1; }
	@test -e $(NCCL_HOME)/include/nccl.h || { echo "$(NO_HEADER)" >&2; exit 1; }
	@mkdir -p $(BUILDDIR)
	sed 's/@TOOL@/$@/' src/standin.sh > $(BUILDDIR)/$@
	chmod 755 $(BUILDDIR)/$@

.PHONY: default $(BINS)
'''

P2P_CMAKE = r'''# gpuserve lab stand-in of cuda-samples' p2pBandwidthLatencyTest project: no CUDA
# compiler used; the build directory gets the stand-in as p2pBandwidthLatencyTest.
cmake_minimum_required(VERSION 3.20)
project(p2pBandwidthLatencyTest LANGUAGES NONE)
if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/../../../Common/helper_cuda.h)
  message(FATAL_ERROR "Common/helper_cuda.h not found: build from a whole checkout")
endif()
file(READ ${CMAKE_CURRENT_SOURCE_DIR}/standin.sh script)
string(REPLACE "@TOOL@" "p2pBandwidthLatencyTest" script "${script}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/stage/p2pBandwidthLatencyTest "${script}")
file(COPY ${CMAKE_CURRENT_BINARY_DIR}/stage/p2pBandwidthLatencyTest
     DESTINATION ${CMAKE_CURRENT_BINARY_DIR}
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                      WORLD_READ WORLD_EXECUTE)
'''


def _archive(top: str, files: dict[str, tuple[str, int]]) -> bytes:
    """A .tar.gz with fixed mtimes, owners and order: the same inputs, the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        dirs = sorted({str(Path(top, p).parent) for p in files} | {top})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            tar.addfile(info)
        for path in sorted(files):
            text, mode = files[path]
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def archives() -> dict[str, bytes]:
    script = standin_script()
    return {
        "nccl-tests-lab.tar.gz": _archive("nccl-tests-2.19.6-lab", {
            "Makefile": (NCCL_MAKEFILE, 0o644),
            "src/standin.sh": (script, 0o644),
            "README.gpuserve-lab": ("Lab stand-in of NVIDIA nccl-tests (lab/gate_tools).\n",
                                    0o644),
        }),
        "cuda-samples-lab.tar.gz": _archive("cuda-samples-13.0-lab", {
            f"{P2P_SUBDIR}/CMakeLists.txt": (P2P_CMAKE, 0o644),
            f"{P2P_SUBDIR}/standin.sh": (script, 0o644),
            "Common/helper_cuda.h": ("/* gpuserve lab stand-in */\n", 0o644),
            "README.gpuserve-lab": ("Lab stand-in of NVIDIA cuda-samples (lab/gate_tools).\n",
                                    0o644),
        }),
    }


def publish(mirror_root: Path) -> None:
    """Write the archives and SHA256SUMS under ``mirror_root/gates/`` (only on a change)."""
    out = Path(mirror_root) / SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    sums = []
    for name, data in sorted(archives().items()):
        path = out / name
        if not path.exists() or path.read_bytes() != data:
            tmp = path.with_name(f".{name}.new")
            tmp.write_bytes(data)
            tmp.replace(path)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    text = "".join(sums)
    sums_path = out / "SHA256SUMS"
    if not sums_path.exists() or sums_path.read_text() != text:
        sums_path.write_text(text)


def archive_sha256(mirror_root: Path | str, name: str) -> str | None:
    """The published digest of one archive (read by inventory/lab.py); None if absent."""
    path = Path(mirror_root) / SUBDIR / "SHA256SUMS"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        digest, _, file = line.partition("  ")
        if file == name:
            return digest
    return None
