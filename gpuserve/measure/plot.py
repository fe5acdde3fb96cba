"""``gpuserve compare --plot``: the load curve a user asks for (bench.md section 10), as a
PNG with two panels.

1. Output throughput against concurrency, one line per (host, profile) through the latest
   run of each scenario: where a profile stops scaling. A run whose gate failed is
   crossed out in red. Concurrency is on a log axis (base 2), every point marked with
   its figure; records of the lab's stand-in put "LAB DATA" in the title.
2. Median ITL against output throughput, one line per (host, profile), points labelled
   with their concurrency: what each token/s costs a user in latency (the usual
   throughput-latency trade-off plot).

matplotlib is an optional extra (``pip install 'gpuserve[plot]'``) so that a deploy host
never needs it; it is imported here, on use, and drawn with the Agg canvas through
``matplotlib.figure.Figure`` (no pyplot, no display, no global backend switch).
"""

from __future__ import annotations

from pathlib import Path

from gpuserve.errors import GpuserveError, InputError
from gpuserve.measure.compare import LatestRow, lengths

INSTALL_HINT = "--plot needs matplotlib: pip install 'gpuserve[plot]'"


class PlotUnavailable(GpuserveError):
    """matplotlib is not installed."""


def require_matplotlib():
    """The ``matplotlib.figure.Figure`` class, or PlotUnavailable with the install hint."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotUnavailable(INSTALL_HINT) from e
    return Figure


Series = dict[tuple, list]  # (host, profile, in, out) -> [(concurrency, record)]


def series(rows: list[LatestRow]) -> Series:
    """Latest bench runs with a concurrency and a throughput, per (host, profile, lengths),
    sorted by concurrency."""
    out: Series = {}
    for row in rows:
        r = row.group.latest
        if r.kind != "bench" or r.concurrency is None or r.output_tok_s is None:
            continue
        out.setdefault((r.host, r.profile, *lengths(r)), []).append((r.concurrency, r))
    for points in out.values():
        points.sort(key=lambda p: p[0])
    return out


def _label(key: tuple, keys: list[tuple]) -> str:
    host, profile, inp, outp = key
    label = profile or "-"
    if len({k[0] for k in keys}) > 1:
        label += f" @ {host or '?'}"
    if len({k[2:] for k in keys}) > 1:
        label += f" ({inp}/{outp})"
    return label


#: The suptitle of a plot with lab records (docs/lab.md: a simulated server's figures).
LAB_TITLE = "LAB DATA: the lab's SGLang stand-in (simulated decode rate), not a GPU measurement"
#: The launch env names only the lab sets (inventory/lab.py: the stand-in's knobs).
LAB_ENV_PREFIX = "GPUSERVE_LAB_"


def lab_records(records: list) -> int:
    """How many of ``records`` come from the lab's stand-in: their launch env has the
    lab's knobs (``GPUSERVE_LAB_*``), which product code never sets."""
    count = 0
    for r in records:
        env = (r.context or {}).get("env") if r.context else None
        if isinstance(env, dict) and any(str(k).startswith(LAB_ENV_PREFIX) for k in env):
            count += 1
    return count


def write_plot(rows: list[LatestRow], path: str | Path, *, title: str | None = None) -> Path:
    """Draw the two panels from compare's latest rows and write a PNG to ``path``."""
    figure_cls = require_matplotlib()
    data = series(rows)
    if not data:
        raise InputError(None, "--plot", "no bench record with a concurrency and an output "
                         "throughput to plot (smoke records and hand notes have no load curve)")
    out = plot_target(path)
    fig = draw(data, figure_cls, title)
    tmp = out.with_name(f".{out.name}.tmp.png")
    try:
        fig.savefig(tmp, format="png", dpi=100)
        tmp.replace(out)
    except OSError as exc:  # a full disk, a read-only directory: no half-written file
        tmp.unlink(missing_ok=True)
        raise InputError(out, "--plot", f"cannot write: {exc.strerror or exc}") from None
    return out


def draw(data: Series, figure_cls, title: str | None = None):
    """The figure of :func:`write_plot`: the load curve on a log concurrency axis with
    every point marked, the latency trade-off, lab data named in the title."""
    fig = figure_cls(figsize=(13, 5.5), layout="constrained")
    curve, tradeoff = fig.subplots(1, 2)
    keys = list(data)
    failed_labelled = False
    for key, points in data.items():
        label = _label(key, keys)
        concs = [c for c, _ in points]
        tok_s = [r.output_tok_s for _, r in points]
        line = curve.plot(concs, tok_s, marker="o", label=label)[0]
        for c, y in zip(concs, tok_s, strict=True):
            curve.annotate(f"{y:,.0f}", (c, y), textcoords="offset points", xytext=(4, 4),
                           fontsize=8)
        with_itl = [(r.output_tok_s, r.figures.get("median_itl_ms"), c) for c, r in points
                    if r.figures.get("median_itl_ms") is not None]
        if with_itl:
            tradeoff.plot([x for x, _, _ in with_itl], [y for _, y, _ in with_itl],
                          marker="o", color=line.get_color(), label=label)
            for x, y, c in with_itl:
                tradeoff.annotate(f"c{c}", (x, y), textcoords="offset points", xytext=(4, 4),
                                  fontsize=8)
        failed = [(c, r) for c, r in points if not r.is_good]
        if failed:
            curve.scatter([c for c, _ in failed], [r.output_tok_s for _, r in failed],
                          marker="x", s=90, color="red", zorder=3,
                          label="gate failed" if not failed_labelled else None)
            failed_labelled = True
    all_concs = sorted({c for points in data.values() for c, _ in points})
    if all_concs and all_concs[0] > 0:  # concurrency doubles from point to point
        curve.set_xscale("log", base=2)
    curve.set_xticks(all_concs, [str(c) for c in all_concs])
    curve.set(title="Output throughput vs concurrency (latest run per scenario)",
              xlabel="concurrency (--max-concurrency)", ylabel="output throughput (tok/s)")
    tradeoff.set(title="Median inter-token latency vs output throughput",
                 xlabel="output throughput (tok/s)", ylabel="median ITL (ms)")
    for ax in (curve, tradeoff):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    lab = lab_records([r for points in data.values() for _, r in points])
    if lab:
        title = (f"{title}: " if title else "") + LAB_TITLE
    if title:
        fig.suptitle(title, color="firebrick" if lab else None)
    return fig


def plot_target(path: str | Path) -> Path:
    """``path`` checked before anything is drawn or printed: a ``.png`` file in an
    existing directory, not an existing directory, device or FIFO.

    Why: the PNG is written beside the target and renamed over it, so ``--plot /etc``
    was an IsADirectoryError traceback, ``--plot /dev/full`` replaced the device node
    with a PNG when run as root, and ``--plot results/gpu1/run.json`` would have
    overwritten a record."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise InputError(out, "--plot", "must name a .png file")
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise InputError(out, "--plot", "exists and is not a regular file (a directory, "
                         "a device, a FIFO or a link)")
    if not out.parent.is_dir():
        raise InputError(out, "--plot", "the directory does not exist")
    return out
