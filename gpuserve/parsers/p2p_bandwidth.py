"""cuda-samples ``p2pBandwidthLatencyTest`` output -> devices, peer access and matrices.

Why: the GPU gates decide P2P from what this test measures, not from what the driver
reports; current and older samples title and lay out their matrices differently.

How: docs/gpu-gates.md, "gpuserve.parsers.p2p_bandwidth: the output layout and matrix keys"
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from gpuserve.parsers.common import ParseError, as_lines

_DEVICE_RE = re.compile(
    r"^Device: (\d+), (.+), pciBusID: ([0-9a-fA-F]+), pciDeviceID: ([0-9a-fA-F]+), "
    r"pciDomainID:\s*([0-9a-fA-F]+)\s*$"
)
_PEER_RE = re.compile(r"^Device=(\d+) (CAN|CANNOT) Access Peer Device=(\d+)\s*$")
_BW_TITLE_RE = re.compile(
    r"^(Unidirectional|Bidirectional) P2P=(Enabled|Disabled) Bandwidth "
    r"(?:\(P2P (Writes|Reads)\) )?Matrix \(GB/s\)\s*$"
)
_LAT_TITLE_RE = re.compile(
    r"^P2P=(Enabled|Disabled) Latency (?:\(P2P (Writes|Reads)\) )?Matrix \(us\)\s*$"
)
_CONNECTIVITY_TITLE = "P2P Connectivity Matrix"
_HEADER_RE = re.compile(r"^\s*(D\\D|GPU|CPU)((?:\s+\d+)+)\s*$")


@dataclass
class Device:
    index: int
    name: str
    pci_bus_id: int
    pci_device_id: int
    pci_domain_id: int


@dataclass
class P2PBandwidthReport:
    devices: list[Device] = field(default_factory=list)
    peer_access: dict[str, bool] = field(default_factory=dict)  # "0->1": True
    connectivity: list[list[int]] | None = None
    matrices: dict[str, list[list[float]]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def _section_key(title: str) -> str | None:
    if m := _BW_TITLE_RE.match(title):
        key = f"{m[1].lower()}_{m[2].lower()}"
        return f"{key}_{m[3].lower()}" if m[3] else key
    if m := _LAT_TITLE_RE.match(title):
        key = f"latency_{m[1].lower()}"
        return f"{key}_{m[2].lower()}" if m[2] else key
    if title == _CONNECTIVITY_TITLE:
        return "connectivity"
    return None


def off_diagonal(matrix: list[list[float]]) -> list[float]:
    """The values between different GPUs (what P2P gates judge)."""
    return [v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j]


def parse_p2p_bandwidth(text: str | Iterable[str]) -> P2PBandwidthReport:
    """Parse the full stdout of p2pBandwidthLatencyTest."""
    report = P2PBandwidthReport()
    lines = as_lines(text)
    section: str | None = None  # key of the titled section being read
    table: str | None = None  # matrix key rows go to
    width = 0
    recognised = False
    for line_no, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            table = None  # a matrix ends at a blank line (latency: between GPU and CPU)
            continue
        if m := _DEVICE_RE.match(stripped):
            report.devices.append(
                Device(int(m[1]), m[2], int(m[3], 16), int(m[4], 16), int(m[5], 16))
            )
            recognised = True
            continue
        if m := _PEER_RE.match(stripped):
            report.peer_access[f"{m[1]}->{m[3]}"] = m[2] == "CAN"
            continue
        key = _section_key(stripped)
        if key is not None:
            section, table, recognised = key, None, True
            continue
        if m := _HEADER_RE.match(line):
            if section is None:
                raise ParseError("matrix header outside a titled section", line_no, line)
            columns = [int(c) for c in m[2].split()]
            if columns != list(range(len(columns))):
                raise ParseError("matrix header columns are not 0..n-1", line_no, line)
            width = len(columns)
            label = m[1]
            if section == "connectivity":
                table = "connectivity"
            elif section.startswith("latency"):
                table = f"{section}_{'cpu' if label == 'CPU' else 'gpu'}"
            else:
                table = section
            if table in report.matrices or (table == "connectivity" and report.connectivity):
                raise ParseError(f"second {table} matrix", line_no, line)
            if table == "connectivity":
                report.connectivity = []
            else:
                report.matrices[table] = []
            continue
        tokens = stripped.split()
        if table is not None and re.fullmatch(r"\d+", tokens[0]):
            cells = tokens[1:]
            if len(cells) != width:
                raise ParseError(f"expected {width} values after the row index", line_no, line)
            rows = report.connectivity if table == "connectivity" else report.matrices[table]
            assert rows is not None
            if int(tokens[0]) != len(rows):
                raise ParseError(f"row index {tokens[0]} out of order", line_no, line)
            try:
                if table == "connectivity":
                    rows.append([int(c) for c in cells])  # type: ignore[misc]
                else:
                    rows.append([float(c) for c in cells])
            except ValueError:
                raise ParseError("non-numeric matrix value", line_no, line) from None
            continue
        if section is not None and table is not None:
            raise ParseError("unexpected line inside a matrix", line_no, line)
        # Banner, NOTE lines and other prose between sections carry no data.
        table = None
    if not recognised:
        raise ParseError("no p2pBandwidthLatencyTest device line or section found")
    return report
