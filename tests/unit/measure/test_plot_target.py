"""``compare --plot`` writes only a .png regular file, checked before any output.

Regressions from the CLI sweep: ``--plot /etc`` was an IsADirectoryError traceback, and
``--plot /dev/full`` (run as root) replaced the device node with a PNG, because the plot
is written beside the target and renamed over it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.measure.plot import plot_target

RESULTS = Path(__file__).resolve().parents[2] / "fixtures" / "results"


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
    assert main(["compare", str(RESULTS), "--plot", str(fifo)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{fifo}: --plot: exists and is not a regular file" in err
    assert fifo.is_fifo()
