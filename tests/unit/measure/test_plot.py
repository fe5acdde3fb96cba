"""gpuserve compare --plot: a real PNG from the composed bench records, and the message a
user gets without matplotlib."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.measure.compare import latest_view
from gpuserve.measure.plot import INSTALL_HINT, plot_target, series, write_plot
from gpuserve.measure.results import read_results

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RESULTS = FIXTURES / "bench" / "results"  # composed: see tests/fixtures/bench/README.md
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plot_writes_a_png(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "switch.png"
    rc, out, err = run(capsys, str(RESULTS), "--plot", str(target))
    assert rc == 0
    data = target.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000, "two panels, not an empty image"
    assert f"plot: wrote {target}" in err
    assert "glm5-nvfp4-tp8-eagle3" in out, "the table is still printed"
    assert [p.name for p in tmp_path.iterdir()] == ["switch.png"], "no temp file left"


def test_series_are_per_host_and_profile_sorted_by_concurrency() -> None:
    rows = latest_view(read_results(RESULTS), "glm5-nvfp4-tp8", smoke=True)
    data = series(rows)
    assert list(data) == [("gpu1", "glm5-nvfp4-tp8", 1024, 512),
                          ("gpu1", "glm5-nvfp4-tp8-eagle3", 1024, 512)], "smoke left out"
    base = data[("gpu1", "glm5-nvfp4-tp8", 1024, 512)]
    assert [(c, r.output_tok_s) for c, r in base] == [(1, 90.1), (64, 1432.8)]


def test_without_matplotlib_exit_2_with_the_install_hint(tmp_path: Path, capsys,
                                                         monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    target = tmp_path / "x.png"
    rc, out, err = run(capsys, str(RESULTS), "--plot", str(target))
    assert rc == 2 and out == "", "checked before anything is printed"
    assert err.strip() == "gpuserve: error: --plot needs matplotlib: pip install 'gpuserve[plot]'"
    assert INSTALL_HINT in err and not target.exists()
    # the rest of compare does not need it
    assert run(capsys, str(RESULTS))[0] == 0


def test_nothing_to_plot_is_an_input_error(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    rc, _, err = run(capsys, str(FIXTURES / "results" / "field-notes.jsonl"),
                     "--plot", str(tmp_path / "x.png"))
    assert rc == 2 and "--plot: no bench record with a concurrency" in err
    assert not (tmp_path / "x.png").exists()


def test_missing_output_directory_is_named(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = latest_view(read_results(RESULTS), "glm5-nvfp4-tp8")
    with pytest.raises(InputError, match=r"nope/x.png: --plot: the directory does not exist"):
        write_plot(rows, tmp_path / "nope" / "x.png")


def test_concurrency_on_a_log_axis_points_marked_and_lab_data_named() -> None:
    """The composed records (c1 and c64) on a log axis with each point's figure; the same
    records with the lab's stand-in knob in their launch env (inventory/lab.py sets
    GPUSERVE_LAB_STANDIN_DECODE_TPS) put LAB DATA in the title."""
    from dataclasses import replace

    from gpuserve.measure.plot import LAB_TITLE, draw, lab_records, require_matplotlib

    pytest.importorskip("matplotlib")
    records = read_results(RESULTS)
    data = series(latest_view(records, "glm5-nvfp4-tp8", smoke=True))
    fig = draw(data, require_matplotlib())
    curve = fig.axes[0]
    assert curve.get_xscale() == "log"
    marked = {t.get_text() for t in curve.texts}
    assert {"90", "1,433"} <= marked, marked
    assert fig.get_suptitle() == "" and lab_records(records) == 0
    lab = [replace(r, context={**(r.context or {}),
                               "env": {"GPUSERVE_LAB_STANDIN_DECODE_TPS": "100"}})
           for r in records]
    lab_fig = draw(series(latest_view(lab, "glm5-nvfp4-tp8", smoke=True)),
                   require_matplotlib(), "switch")
    assert lab_fig.get_suptitle() == f"switch: {LAB_TITLE}"
# --------------------------------------------------------------------------------------
# ``compare --plot`` writes only a .png regular file, checked before any output.
#
# Regressions from the CLI sweep: ``--plot /etc`` was an IsADirectoryError traceback, and ``--plot
# /dev/full`` (run as root) replaced the device node with a PNG, because the plot is written beside
# the target and renamed over it.


RESULTS_TARGET = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def test_a_png_in_an_existing_directory_is_a_target(tmp_path: Path) -> None:
    assert plot_target(tmp_path / "curve.png") == tmp_path / "curve.png"
    (tmp_path / "old.png").write_bytes(b"x")
    assert plot_target(tmp_path / "old.png") == tmp_path / "old.png"  # replaced: fine


@pytest.mark.parametrize("make", ["dir", "fifo", "link", "json"])
def test_anything_else_is_refused_and_left_alone(tmp_path: Path, make: str) -> None:
    target = tmp_path / ("run.json" if make == "json" else "x.png")
    if make == "dir":
        target.mkdir()
    elif make == "fifo":
        os.mkfifo(target)
    elif make == "link":
        (tmp_path / "real.png").write_bytes(b"x")
        target.symlink_to(tmp_path / "real.png")
    else:
        target.write_text('{"a": 1}')
    with pytest.raises(InputError) as err:
        plot_target(target)
    assert err.value.field == "--plot" and err.value.file == str(target)
    assert target.exists() or target.is_symlink()


def test_compare_refuses_a_fifo_before_printing(tmp_path: Path, capsys) -> None:
    # (a FIFO stands in for a device: a test must not risk /dev/null if this regresses)
    pytest.importorskip("matplotlib")
    fifo = tmp_path / "x.png"
    os.mkfifo(fifo)
    assert main(["compare", str(RESULTS_TARGET), "--plot", str(fifo)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{fifo}: --plot: exists and is not a regular file" in err
    assert fifo.is_fifo()
