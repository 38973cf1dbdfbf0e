"""The HTML report's figures as inline SVG from matplotlib (text stays text: ``svg.fonttype: none``).

Curves: decode tok/s against context, TTFT against input length per model key with a context sweep (fleet median of
the modules left after the outliers, the min-max band of those same modules; no-prefix and shared-prefix series),
each against its reference: the baseline dashed, with the tolerance band around it (hatched: baseline ± the metric's
tolerance, the band a change must leave to count). Every y axis starts at zero, so that 1 % of noise looks like 1 %
and a regression of 8 % like 8 %. The legend is laid out in as many columns as fit the figure's width (one
column, and a wider figure, where even that does not: it is never cut). A per-module deviation heatmap (module x
model key, % from the fleet median), and the History section's series. Text is at least :data:`MIN_FONT_PT` (11 px
where a figure is shown at its own size, which fits a 1300 px window).
"""

from __future__ import annotations

import io
import math
import re

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from controller.report.model import TrendSeries

_SERIES = (("no prefix", "#0969da"), ("shared prefix", "#bc4c00"))
# the smallest text in a figure: 11.3 px at the figure's own size (1 pt = 4/3 px)
MIN_FONT_PT = 8.5
TICK_PT, LABEL_PT = 9.0, 10.0
BAND_LABEL = "band: min–max of the modules in the median (outlier modules left out)"
LEGEND_MARGIN_IN = 0.15  # room either side of a legend, inches
HATCH = "////"


def tolerance_label(tol: float) -> str:
    """The tolerance band's legend entry, e.g. ``tolerance: baseline ±5 %``."""
    return f"tolerance: baseline ±{tol * 100:.3g} %"


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    # text stays text: readable, searchable, sized
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = re.sub(r"^<\?xml[^>]*>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _sweep(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    s = summary[(summary["metric"] == metric) & (summary["table"] == "sweep")].copy()
    s["series"] = np.where(s["prefix_tokens"].fillna(0) > 0, "shared prefix", "no prefix")
    return s.sort_values(["model_key", "series", "input_tokens"])


def tokens_label(v: float, _pos: int | None = None) -> str:
    """A token count on a log axis: 100, 1k, 10k, 1M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def fit_legend(fig: Figure, handles: list[Line2D | Patch], cols: int | None = None) -> Legend:
    """The figure's legend above its plots in the most columns (at most 3) that fit its width, else in one column
    and the figure widened to hold it. ``cols``: that many columns, fitting or not (the tests clip one on purpose)."""
    def place(n: int) -> Legend:
        return fig.legend(handles=handles, loc="outside upper center", ncols=n, fontsize=TICK_PT, frameon=False)

    if cols is not None:
        return place(cols)
    # to measure text (the SVG is drawn by savefig)
    renderer = FigureCanvasAgg(fig).get_renderer()
    room = fig.get_figwidth() - 2 * LEGEND_MARGIN_IN
    for n in range(min(3, len(handles)), 0, -1):
        leg = place(n)
        width = leg.get_window_extent(renderer).width / fig.dpi
        if width <= room or n == 1:
            break
        leg.remove()
    if width > room:
        fig.set_figwidth(width + 2 * LEGEND_MARGIN_IN)
    return leg


def curve_plot(summary: pd.DataFrame, metric: str, ylabel: str, tol: float | None = None,
               legend_cols: int | None = None) -> str:
    """One panel per model key with a context sweep; ``tol``: the metric's tolerance (the band around the baseline;
    None: no band); ``legend_cols``: the legend's columns, fitting or not (None: as many as fit)."""
    s = _sweep(summary, metric)
    keys = list(dict.fromkeys(s["model_key"]))
    if not keys:
        return ""
    cols = min(4, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(max(6.4, 3.1 * cols), 2.5 * rows + 1.3), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    series_seen: list[tuple[str, str]] = []
    any_baseline = any_band = False
    for ax, key in zip(axes.flat, keys, strict=False):
        for series, color in _SERIES:
            d = s[(s["model_key"] == key) & (s["series"] == series)]
            if d.empty:
                continue
            if (series, color) not in series_seen:
                series_seen.append((series, color))
            x = d["input_tokens"].to_numpy(dtype=float)
            # the band and the line describe the same modules: those in the fleet median (outliers left out)
            ax.fill_between(x, d["fleet_min"].to_numpy(dtype=float), d["fleet_max"].to_numpy(dtype=float),
                            color=color, alpha=0.15, linewidth=0)
            ax.plot(x, d["fleet"].to_numpy(dtype=float), marker="o", ms=3, color=color)
            if "baseline" in d and d["baseline"].notna().any():
                any_baseline = True
                base = d["baseline"].to_numpy(dtype=float)
                ax.plot(x, base, ls="--", color=color, alpha=0.7, lw=1)
                if tol:
                    any_band = True
                    ax.fill_between(x, base * (1 - tol), base * (1 + tol), facecolor="none", edgecolor=color,
                                    hatch=HATCH, alpha=0.35, linewidth=0)
        ax.set_ylim(bottom=0)  # from zero: a change looks as large as it is
        ax.set_xscale("log")
        # "1k", not mathtext "10³" (a tiny exponent)
        ax.xaxis.set_major_formatter(FuncFormatter(tokens_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(key, fontsize=LABEL_PT)
        ax.tick_params(labelsize=TICK_PT)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    handles: list[Line2D | Patch] = [Line2D([], [], color=c, marker="o", ms=3, label=f"{n}: fleet median")
                                     for n, c in series_seen]
    handles.append(Patch(color="#59636e", alpha=0.25, linewidth=0, label=BAND_LABEL))
    if any_baseline:
        handles.append(Line2D([], [], color="#59636e", ls="--", lw=1, label="baseline"))
    if any_band and tol:
        handles.append(Patch(facecolor="none", edgecolor="#59636e", hatch=HATCH, alpha=0.6, linewidth=0,
                             label=tolerance_label(tol)))
    fit_legend(fig, handles, legend_cols)
    fig.supxlabel("input tokens (context)", fontsize=LABEL_PT)
    fig.supylabel(ylabel, fontsize=LABEL_PT)
    return _svg(fig)


def history_plot(t: TrendSeries) -> str:
    """One series of the "History" section: its value per release (release order), each step a dashed line before
    its first release with its size, each drift a shaded span over the releases it moved (red: in force, grey:
    reverted since)."""
    fig = Figure(figsize=(4.2, 2.2), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(t.values))
    ax.plot(x, np.asarray(t.values, dtype=float), marker="o", ms=2.5, lw=1, color="#0969da")
    ends = t.ends or t.marks
    for at, end, size, live in zip(t.marks, ends, t.sizes, t.in_force, strict=True):
        color = "#cf222e" if live else "#59636e"
        # a drift: shaded from the last release before it to the first at the new level
        if end > at:
            ax.axvspan(at - 1, end, color=color, alpha=0.12, lw=0)
        else:
            ax.axvline(at - 0.5, ls="--", lw=1, color=color)
        ax.annotate(f"{size:+.1%}" + (" drift" if end > at else ""), (at - 0.5, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -3), textcoords="offset points", va="top",
                    fontsize=TICK_PT, color=color)
    step = max(1, math.ceil(len(x) / 6))
    ticks = list(x[::step])
    ax.set_xticks(ticks, [t.releases[i] for i in ticks], fontsize=TICK_PT, rotation=30, ha="right")
    ax.tick_params(labelsize=TICK_PT)
    ax.set_title(f"{t.model_key} {t.profile} {t.metric} ({t.scope})", fontsize=LABEL_PT)
    ax.grid(alpha=0.3)
    return _svg(fig)


def cell_label(v: float) -> str:
    """A heatmap cell's % with one decimal and its sign; zero (also -0.04) is "0.0", never "+0.0" or "-0.0"."""
    r = round(v, 1)
    return "0.0" if r == 0 else f"{r:+.1f}"


def heatmap(deviation: pd.DataFrame) -> str:
    if deviation.empty:
        return ""
    d = deviation.sort_index()
    vals = d.to_numpy(dtype=float) * 100
    lim = max(5.0, float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 5.0)
    fig = Figure(figsize=(max(5.5, 2.6 + 0.9 * d.shape[1]), max(2.8, 1.7 + 0.3 * d.shape[0])), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(np.nan_to_num(vals), cmap="RdBu", norm=TwoSlopeNorm(0, -lim, lim), aspect="auto")
    ax.set_xticks(range(d.shape[1]), [str(c) for c in d.columns], rotation=30, ha="right", fontsize=TICK_PT)
    ax.set_yticks(range(d.shape[0]), [str(i) for i in d.index], fontsize=TICK_PT)
    if d.size <= 400:
        for (i, j), v in np.ndenumerate(vals):
            if np.isfinite(v):
                ax.text(j, i, cell_label(v), ha="center", va="center", fontsize=MIN_FONT_PT,
                        color="white" if abs(v) > lim * 0.6 else "black")
    bar = fig.colorbar(im, ax=ax)
    bar.set_label("% vs fleet median", fontsize=LABEL_PT)
    bar.ax.tick_params(labelsize=TICK_PT)
    return _svg(fig)
