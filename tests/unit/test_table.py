"""gpuserve/table.py: the one fixed-width table (compare, fleet status, the tuner's
report, plan's figures, bench/locks.py)."""

from __future__ import annotations

from gpuserve.table import table


def test_columns_pad_align_and_rule() -> None:
    rows = [("host", "tok/s", "note"), ("gpu-long-1", "12.5", ""), ("g2", "1,234.0", "x")]
    assert table(rows, right={1}) == [
        "host          tok/s  note",
        "----------  -------  ----",
        "gpu-long-1     12.5",  # trailing padding stripped
        "g2          1,234.0  x",
    ]


def test_a_free_last_column_is_neither_padded_nor_stripped() -> None:
    rows = [("a", "why"), ("long", "")]
    assert table(rows, rule=False, free_last=True, indent="  ") == ["  a     why", "  long  "]


def test_no_rows_no_lines() -> None:
    assert table([]) == []
