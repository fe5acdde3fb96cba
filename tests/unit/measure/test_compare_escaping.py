"""gpuserve compare never writes a record's control characters to the terminal.

Records are plain JSON files anyone can edit; a profile, host or note holding ESC[2J
(clear screen), a carriage return or a bidi override must show escaped in the text
output, while --json keeps the data unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuserve.cli import main
from gpuserve.commands.compare import printable
from gpuserve.measure.results import RecordSpec, bench_record, parse_sglang_line, write_record

BENCH = Path(__file__).resolve().parents[2] / "fixtures" / "bench"
C1_TEXT = (BENCH / "sglang-serving-composed.jsonl").read_text().splitlines()[0]  # composed

CLEAR, CR, BIDI = "\x1b[2J", "\r", "\u202e"


def hand_edited_records(tmp_path: Path) -> Path:
    """Two real-shaped records, then edited by hand the way a hostile user would."""
    spec = RecordSpec(results_dir="results", profile="base", launch_hash="sha256:" + "0" * 64,
                      sglang_version="0.5.23", model="/m", served_name="m",
                      lock="sglang-0.5.23-cu13-py311")
    line = parse_sglang_line(C1_TEXT, "composed")
    for ts in ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"):
        path = write_record(tmp_path, bench_record(spec, "gpu1", "c1", line, timestamp=ts))
    doc = json.loads(path.read_text())
    doc["profile"] = f"evil{CLEAR}"
    doc["host"] = f"gpu1{CR}spoofed"
    doc["note"] = f"see{BIDI}txt.exe"
    path.write_text(json.dumps(doc))
    return tmp_path


def test_text_output_escapes_control_characters(tmp_path: Path, capsys) -> None:
    rc = main(["compare", str(hand_edited_records(tmp_path))])
    out = capsys.readouterr().out
    assert rc == 0
    assert not any(c in out for c in (CLEAR[0], CR, BIDI))
    assert "evil\\x1b[2J" in out
    assert "gpu1\\rspoofed" in out
    assert "see\\u202etxt.exe" in out


def test_table_columns_stay_aligned_after_escaping(tmp_path: Path, capsys) -> None:
    main(["compare", str(hand_edited_records(tmp_path))])
    lines = capsys.readouterr().out.split("\n\n")[0].splitlines()
    header, rule, *rows = lines
    scenario_col = header.index("scenario")
    assert all(row[scenario_col:].startswith("c1") for row in rows), lines


def strings(value) -> set[str]:
    """Every string anywhere in a JSON document."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(strings(v) for v in value.values()), set())
    if isinstance(value, list):
        return set().union(*(strings(v) for v in value), set())
    return set()


def test_json_output_keeps_the_data(tmp_path: Path, capsys) -> None:
    main(["compare", "--json", "--history", str(hand_edited_records(tmp_path))])
    values = strings(json.loads(capsys.readouterr().out))
    assert f"evil{CLEAR}" in values
    assert f"gpu1{CR}spoofed" in values
    assert not any("\\x1b" in v for v in values)  # never escaped twice


def test_printable_leaves_ordinary_text_alone() -> None:
    assert printable("glm5-nvfp4-tp8 [1]  ü 4.2%") == "glm5-nvfp4-tp8 [1]  ü 4.2%"
    assert printable("a\tb\x07") == "a\\tb\\x07"
