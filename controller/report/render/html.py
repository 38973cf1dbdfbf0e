"""Reports as one self-contained HTML file: inline CSS, inline SVG plots from matplotlib, no external URL.

Plots: decode tok/s against context, TTFT against input length per model key with a context sweep
(fleet median of the modules left after the outliers, the min-max band of those same modules,
baseline dashed; no-prefix and shared-prefix series), and a per-module deviation heatmap (module x
model key, % from the fleet median). Text in the SVGs is text (``svg.fonttype: none``), at least
:data:`MIN_FONT_PT` (11 px where a figure is shown at its own size, which fits a 1300 px window).
Keys without a context sweep (MTP keys: GSM8K prompts; a vision table alone) are named under
the plots, not left out silently.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib
import numpy as np
import pandas as pd
from jinja2 import Environment, select_autoescape
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from controller.report.model import FLEET, Report, TrendSeries
from controller.report.render.numbers import num, pct
from controller.report.render.text import (
    NO_INTERVAL,
    energy_text,
    probe_text,
    startup_lines,
    telemetry_cell,
    verdict_line,
)

_COLORS = {"pass": "#1a7f37", "regressed": "#cf222e", "incomplete": "#9a6700", "failed": "#82071e"}
_SERIES = (("no prefix", "#0969da"), ("shared prefix", "#bc4c00"))
MIN_FONT_PT = 8.5  # the smallest text in a figure: 11.3 px at the figure's own size (1 pt = 4/3 px)
TICK_PT, LABEL_PT = 9.0, 10.0
BAND_LABEL = "band: min–max of the modules in the median (outlier modules left out)"
# what a key's tables are, for the line that names the keys a sweep plot leaves out
TABLE_KINDS = {"mtp": "MTP: measured on GSM8K prompts", "vision": "vision table only"}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: readable, searchable, sized
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = re.sub(r"^<\?xml[^>]*>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _sweep(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    s = summary[(summary["metric"] == metric) & (summary["table"] == "sweep")].copy()
    s["series"] = np.where(s["prefix_tokens"].fillna(0) > 0, "shared prefix", "no prefix")
    return s.sort_values(["model_key", "series", "input_tokens"])


def not_plotted(summary: pd.DataFrame, metric: str) -> dict[str, tuple[str, ...]]:
    """The model keys with figures of ``metric`` but no context sweep, each with its tables (a sweep plot
    has no place for them)."""
    if not len(summary):
        return {}
    s = summary[summary["metric"] == metric]
    swept = set(s.loc[s["table"] == "sweep", "model_key"].astype(str))
    out: dict[str, tuple[str, ...]] = {}
    for key, tables in s.groupby(s["model_key"].astype(str), sort=True)["table"]:
        if key not in swept:
            out[str(key)] = tuple(sorted(set(map(str, tables))))
    return out


def not_plotted_line(summary: pd.DataFrame, metric: str, changes_below: bool = False) -> str:
    """A line naming the keys a sweep plot leaves out and why ("" when it leaves out none)."""
    missing = not_plotted(summary, metric)
    if not missing:
        return ""
    by_kind: dict[str, list[str]] = {}
    for key, tables in missing.items():
        kind = "; ".join(TABLE_KINDS.get(t, f"table {t}") for t in tables)
        by_kind.setdefault(kind, []).append(key)
    parts = [f"{', '.join(keys)} ({kind})" for kind, keys in by_kind.items()]
    return ("Not plotted, no context sweep: " + "; ".join(parts) + ". Their figures are in the Markdown and JSON "
            "reports" + (", their changes in the table below." if changes_below else "."))


def tokens_label(v: float, _pos: int | None = None) -> str:
    """A token count on a log axis: 100, 1k, 10k, 1M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def curve_plot(summary: pd.DataFrame, metric: str, ylabel: str) -> str:
    s = _sweep(summary, metric)
    keys = list(dict.fromkeys(s["model_key"]))
    if not keys:
        return ""
    cols = min(4, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(max(6.4, 3.1 * cols), 2.5 * rows + 1.3), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    series_seen: list[tuple[str, str]] = []
    any_baseline = False
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
                ax.plot(x, d["baseline"].to_numpy(dtype=float), ls="--", color=color, alpha=0.7, lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(tokens_label))  # "1k", not mathtext "10³" (a tiny exponent)
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
    fig.legend(handles=handles, loc="outside upper center", ncols=2, fontsize=TICK_PT, frameon=False)
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
        if end > at:  # a drift: shaded from the last release before it to the first at the new level
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


_TEMPLATE = """{% macro changes_table(items) %}<table><tr><th>model key</th><th>metric</th><th>against</th>
<th>reference</th><th>value</th><th>change</th><th>p</th><th>status</th></tr>
{% for c in items %}<tr><td>{{ c.model_key }}</td><td>{{ c.metric }}</td><td>{{ c.against }}</td>
<td class="num">{{ num(c.baseline) }}</td><td class="num">{{ num(c.value) }}</td>
<td class="num{% if c.status == 'regressed' %} bad{% endif %}">{{ pct(c.change) }}</td>
<td class="num">{{ "%.2g"|format(c.p_value) if c.p_value is not none else "" }}</td><td>{{ c.status }}</td></tr>
{% endfor %}</table>{% endmacro %}<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Fleet report {{ r.run_id }}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1280px;padding:1em 2em;
color:#1f2328}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #d0d7de}
.verdict{padding:.6em 1em;border-radius:6px;color:#fff;background:{{ color }};font-weight:600}
table{border-collapse:collapse;margin:.5em 0;font-size:12.5px}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left}th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}.bad{color:#cf222e;font-weight:600}
.muted{color:#59636e}svg{max-width:100%;height:auto}
.history{display:flex;flex-wrap:wrap;gap:.5em}.history svg{width:420px}
</style></head><body>
<h1>Fleet report {{ r.run_id }}</h1>
<p class="verdict">{{ line }}</p>
{% if page_url %}<p class="page"><a href="{{ page_url }}">The run's page</a> (modules, keys, logs, retry)</p>{% endif %}
<p class="muted">Release {{ r.release or "?" }} &middot; baseline {{ r.baseline_id or "none" }} &middot;
previous {{ r.previous_ids|join(", ") or "none" }} &middot; {{ r.modules|length }} module(s) &middot;
tolerance {{ "%.0f"|format(r.thresholds.tolerance * 100) }} %</p>
<h2>Regressions</h2>
{% if r.regressions %}<table><tr><th>module</th><th>model key</th><th>profile</th><th>metric</th><th>baseline</th>
<th>value</th><th>change</th><th>95% interval</th><th>against</th><th>detail</th></tr>
{% for x in r.regressions %}<tr><td>{{ x.module }}</td><td>{{ x.model_key }}</td><td>{{ x.profile }}</td>
<td>{{ x.metric }}</td><td class="num">{{ num(x.baseline) }}</td><td class="num">{{ num(x.value) }}</td>
<td class="num bad">{{ pct(x.change) }}</td>
<td class="num">{% if x.ci_low is not none %}{{ pct(x.ci_low) }} to {{ pct(x.ci_high) }}
{%- elif x.change is not none %}{{ no_interval }}{% endif %}</td>
<td>{{ x.against }}</td>
<td>{{ x.detail }}{% if x.related %}; with {{ x.related|join(", ") }}{% endif %}</td></tr>
{% endfor %}</table>{% else %}<p>None.</p>{% endif %}
<h2>Outlier modules</h2>
{% if r.outliers %}<table><tr><th>module</th><th>model key</th><th>factor</th><th>95% interval</th><th>figures</th>
<th>worst cases</th>
<th>device telemetry</th></tr>
{% for o in r.outliers %}{% set t = r.telemetry_of(o) %}<tr><td>{{ o.module }}</td><td>{{ o.model_key }}</td>
<td class="num bad">{{ "%.2f"|format(o.factor) }}x</td>
<td class="num">{% if o.ci_low is not none %}{{ "%.2f"|format(o.ci_low) }}x to {{ "%.2f"|format(o.ci_high) }}x
{%- else %}{{ no_interval }}{% endif %}</td>
<td class="num">{{ o.cells }}</td>
<td>{% for w in o.worst %}{{ w.model_key }} {{ w.profile }} {{ w.metric }} {{ num(w.value) }}
(fleet {{ num(w.fleet_median) }}){% if not loop.last %}; {% endif %}{% endfor %}</td>
<td{% if t and t.status == "explained" %} class="bad"{% endif %}>{{ telemetry_cell(r, o) }}</td></tr>
{% endfor %}</table>
{% for t in r.outlier_telemetry if t.compared %}<details><summary>device telemetry of {{ t.module }}
({{ t.status }})</summary><table><tr><th>figure</th><th>module</th><th>fleet median</th><th>unit</th><th>keys</th></tr>
{% for c in t.compared %}<tr><td{% if c.unusual %} class="bad"{% endif %}>{{ c.what }}</td>
<td class="num">{{ num(c.value) }}</td><td class="num">{{ num(c.fleet) }}</td><td>{{ c.unit }}</td>
<td class="num">{{ c.keys }}</td></tr>{% endfor %}</table></details>{% endfor %}
{% else %}<p>None.</p>{% endif %}
<h2>Energy</h2>
<p{% if not r.energy_outliers %} class="muted"{% endif %}>{{ energy_line }}</p>
{% if r.energy_outliers %}<table><tr><th>module</th><th>model key</th><th>J/token vs fleet</th><th>figures</th>
<th>worst cases</th></tr>
{% for o in r.energy_outliers %}<tr><td>{{ o.module }}</td><td>{{ o.model_key }}</td>
<td class="num bad">{{ "%.2f"|format(1 / o.factor) }}x</td><td class="num">{{ o.cells }}</td>
<td>{% for w in o.worst %}{{ w.model_key }} {{ w.profile }} {{ num(w.value) }} J/token
(fleet {{ num(w.fleet_median) }}){% if not loop.last %}; {% endif %}{% endfor %}</td></tr>
{% endfor %}</table>{% endif %}
<h2>Start-up costs</h2>
{% if startup %}<ul>{% for x in startup %}<li>{{ x }}</li>{% endfor %}</ul>
{% else %}<p class="muted">No start-up figures in this run.</p>{% endif %}
<h2>Release benchmark vs probe</h2>
<p{% if not r.disagreements %} class="muted"{% endif %}>{{ probe_line }}</p>
{% if r.disagreements %}<table><tr><th>module</th><th>model key</th><th>profile</th><th>metric</th><th>release</th>
<th>probe</th><th>change</th></tr>
{% for d in r.disagreements %}<tr><td>{{ d.module }}</td><td>{{ d.model_key }}</td><td>{{ d.profile }}</td>
<td>{{ d.metric }}</td><td class="num">{{ num(d.release) }}</td><td class="num">{{ num(d.probe) }}</td>
<td class="num bad">{{ pct(d.change) }}</td></tr>
{% endfor %}</table>{% endif %}
{% if r.probe_intervals %}<h2>Probe intervals</h2>
<p>The per-key probe repeated over rounds (probe_repeat): each figure's mean over the rounds and its 95 % t
interval.</p>
<table><tr><th>module</th><th>model key</th><th>profile</th><th>figure</th><th>mean</th><th>95% interval</th>
<th>rounds</th></tr>
{% for x in r.probe_intervals %}<tr><td>{{ x.module }}</td><td>{{ x.model_key }}</td><td>{{ x.profile }}</td>
<td>{{ x.figure }}</td><td class="num">{{ num((x.low + x.high) / 2) }}</td>
<td class="num">{{ num(x.low) }} to {{ num(x.high) }}</td><td class="num">{{ x.repeats }}</td></tr>
{% endfor %}</table>{% endif %}
{% if r.capacities %}<h2>Capacity at SLO</h2>
<p>The highest concurrency at which each module's probe met the SLO (figures of that level's steady-state window).</p>
<table><tr><th>module</th><th>model key</th><th>profile</th><th>SLO</th><th>concurrency</th><th>output tok/s</th>
<th>req/s</th><th>TTFT p90</th><th>TPOT p90</th><th>stopped</th><th>levels</th></tr>
{% for c in r.capacities %}<tr><td>{{ c.module }}</td><td>{{ c.model_key }}</td><td>{{ c.profile }}</td>
<td>{{ c.slo }}</td><td class="num">{{ "none" if c.concurrency is none else c.concurrency }}</td>
<td class="num">{{ num(c.output_tps) }}</td><td class="num">{{ num(c.request_rps) }}</td>
<td class="num">{{ num(c.ttft_p90_ms) }}</td><td class="num">{{ num(c.tpot_p90_ms) }}</td><td>{{ c.stop }}</td>
<td>{{ c.levels }}</td></tr>
{% endfor %}</table>{% endif %}
<h2>Decode throughput against context</h2>{{ decode_svg|safe }}
{% if decode_missing %}<p class="muted">{{ decode_missing }}</p>{% endif %}
<h2>Time to first token against input length</h2>{{ ttft_svg|safe }}
{% if ttft_missing %}<p class="muted">{{ ttft_missing }}</p>{% endif %}
<h2>Modules against the fleet</h2>{% if heat_svg %}<p class="muted">Each cell: the module's typical deviation from the
fleet median over that model key's figures, in %; negative: slower (lower throughput, longer latency).</p>{% endif %}
{{ heat_svg|safe }}
{% if r.changes %}<h2>Every change per model key</h2>
{% set moved = r.changes|rejectattr("status", "equalto", "within tolerance")|list %}
<p class="muted">{{ r.changes|length - moved|length }} of {{ r.changes|length }} comparisons within tolerance
(the Hodges-Lehmann centre over profiles of the fleet trimmed mean; p: Wilcoxon signed-rank across profiles).</p>
{% if moved %}{{ changes_table(moved) }}{% endif %}
<details><summary>all {{ r.changes|length }} comparisons</summary>{{ changes_table(r.changes) }}</details>
{% endif %}
{% if r.history is not none %}<h2>History</h2>{% set h = r.history %}
{% if h.releases < h.needed %}<p class="muted">{{ h.releases }} release{{ "" if h.releases == 1 else "s" }} in the
history: no change point can be named under {{ h.needed }} (docs/howto/trends.md).</p>
{% elif not h.series %}<p class="muted">No change point in force or at this release over {{ h.releases }} releases
(this run's model keys).</p>
{% else %}<p class="muted">Series of this run's model keys with a change point in force or at this release, over
{{ h.releases }} releases; a dashed line before the first release of each new level (red: in force).</p>
<div class="history">{% for svg in history_svgs %}{{ svg|safe }}{% endfor %}</div>
{% if h.more %}<p class="muted">and {{ h.more }} more series (all of them: fleetctl trend).</p>{% endif %}
{% endif %}{% endif %}
{% if r.notes %}<h2>Notes</h2><ul>{% for n in r.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
</body></html>
"""


def to_html(r: Report, page_url: str | None = None) -> str:
    """The whole report as one HTML document (``page_url``: the run's page in ``fleetctl serve``, linked)."""
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    tpl = env.from_string(_TEMPLATE)
    return tpl.render(
        r=r, page_url=page_url, line=verdict_line(r), probe_line=probe_text(r), energy_line=energy_text(r),
        startup=startup_lines(r),
        color=_COLORS.get(r.verdict, "#59636e"), num=num,
        pct=pct, telemetry_cell=telemetry_cell, FLEET=FLEET, no_interval=NO_INTERVAL,
        decode_svg=curve_plot(r.summary, "decode_tps", "decode tok/s") if len(r.summary) else "",
        ttft_svg=curve_plot(r.summary, "ttft_ms", "TTFT ms") if len(r.summary) else "",
        decode_missing=not_plotted_line(r.summary, "decode_tps", bool(r.changes)),
        ttft_missing=not_plotted_line(r.summary, "ttft_ms", bool(r.changes)),
        heat_svg=heatmap(r.deviation),
        history_svgs=[history_plot(t) for t in r.history.series] if r.history is not None else [],
    )
