"""Reports as one self-contained HTML file: inline CSS, inline SVG plots from matplotlib, no external URL.

Plots: decode tok/s against context, TTFT against input length (fleet median, min-max band
across modules, baseline dashed; no-prefix and shared-prefix series), and a per-module
deviation heatmap (module x model key, % from the fleet median).
"""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pandas as pd
from jinja2 import Environment, select_autoescape
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from controller.report.model import FLEET, Report
from controller.report.render.numbers import num, pct
from controller.report.render.text import probe_text, telemetry_line, verdict_line

_COLORS = {"pass": "#1a7f37", "regressed": "#cf222e", "incomplete": "#9a6700", "failed": "#82071e"}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = re.sub(r"^<\?xml[^>]*>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _sweep(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    s = summary[(summary["metric"] == metric) & (summary["table"] == "sweep")].copy()
    s["series"] = np.where(s["prefix_tokens"].fillna(0) > 0, "shared prefix", "no prefix")
    return s.sort_values(["model_key", "series", "input_tokens"])


def curve_plot(summary: pd.DataFrame, metric: str, ylabel: str, title: str) -> str:
    s = _sweep(summary, metric)
    keys = list(dict.fromkeys(s["model_key"]))
    if not keys:
        return ""
    cols = min(4, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(3.2 * cols, 2.4 * rows + 0.6))
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.1, top=0.9, wspace=0.25, hspace=0.4)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for series, color in (("no prefix", "#0969da"), ("shared prefix", "#bc4c00")):
            d = s[(s["model_key"] == key) & (s["series"] == series)]
            if d.empty:
                continue
            x = d["input_tokens"].to_numpy(dtype=float)
            ax.fill_between(x, d["min"].to_numpy(dtype=float), d["max"].to_numpy(dtype=float), color=color, alpha=0.15,
                            linewidth=0)
            ax.plot(x, d["fleet"].to_numpy(dtype=float), marker="o", ms=3, color=color, label=series)
            if "baseline" in d and d["baseline"].notna().any():
                ax.plot(x, d["baseline"].to_numpy(dtype=float), ls="--", color=color, alpha=0.7, lw=1)
        ax.set_xscale("log")
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.supxlabel("input tokens (context)", fontsize=8)
    fig.supylabel(ylabel, fontsize=8)
    fig.suptitle(title + " (line: fleet median; band: min-max of modules; dashed: baseline)", fontsize=9)
    return _svg(fig)


def heatmap(deviation: pd.DataFrame) -> str:
    if deviation.empty:
        return ""
    d = deviation.sort_index()
    vals = d.to_numpy(dtype=float) * 100
    lim = max(5.0, float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 5.0)
    fig = Figure(figsize=(2.4 + 0.9 * d.shape[1], 1.6 + 0.3 * d.shape[0]))
    fig.subplots_adjust(left=0.18, right=0.95, bottom=0.25, top=0.9)
    ax = fig.subplots()
    im = ax.imshow(np.nan_to_num(vals), cmap="RdBu", norm=TwoSlopeNorm(0, -lim, lim), aspect="auto")
    ax.set_xticks(range(d.shape[1]), [str(c) for c in d.columns], rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(d.shape[0]), [str(i) for i in d.index], fontsize=7)
    if d.size <= 400:
        for (i, j), v in np.ndenumerate(vals):
            if np.isfinite(v):
                ax.text(j, i, f"{v:+.0f}", ha="center", va="center", fontsize=6,
                        color="white" if abs(v) > lim * 0.6 else "black")
    fig.colorbar(im, ax=ax, label="% vs fleet median (negative: slower)")
    ax.set_title("Per-module deviation from the fleet median", fontsize=9)
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
</style></head><body>
<h1>Fleet report {{ r.run_id }}</h1>
<p class="verdict">{{ line }}</p>
<p class="muted">Release {{ r.release or "?" }} &middot; baseline {{ r.baseline_id or "none" }} &middot;
previous {{ r.previous_ids|join(", ") or "none" }} &middot; {{ r.modules|length }} module(s) &middot;
tolerance {{ "%.0f"|format(r.thresholds.tolerance * 100) }} %</p>
<h2>Regressions</h2>
{% if r.regressions %}<table><tr><th>module</th><th>model key</th><th>profile</th><th>metric</th><th>baseline</th>
<th>value</th><th>change</th><th>against</th><th>detail</th></tr>
{% for x in r.regressions %}<tr><td>{{ x.module }}</td><td>{{ x.model_key }}</td><td>{{ x.profile }}</td>
<td>{{ x.metric }}</td><td class="num">{{ num(x.baseline) }}</td><td class="num">{{ num(x.value) }}</td>
<td class="num bad">{{ pct(x.change) }}</td><td>{{ x.against }}</td>
<td>{{ x.detail }}{% if x.related %}; with {{ x.related|join(", ") }}{% endif %}</td></tr>
{% endfor %}</table>{% else %}<p>None.</p>{% endif %}
<h2>Outlier modules</h2>
{% if r.outliers %}<table><tr><th>module</th><th>model key</th><th>factor</th><th>figures</th><th>worst cases</th>
<th>device telemetry</th></tr>
{% for o in r.outliers %}{% set t = r.telemetry_of(o) %}<tr><td>{{ o.module }}</td><td>{{ o.model_key }}</td>
<td class="num bad">{{ "%.2f"|format(o.factor) }}x</td><td class="num">{{ o.cells }}</td>
<td>{% for w in o.worst %}{{ w.model_key }} {{ w.profile }} {{ w.metric }} {{ num(w.value) }}
(fleet {{ num(w.fleet_median) }}){% if not loop.last %}; {% endif %}{% endfor %}</td>
<td{% if t and t.status == "explained" %} class="bad"{% endif %}>{{ telemetry_line(t) if t else "" }}</td></tr>
{% endfor %}</table>
{% for t in r.outlier_telemetry if t.compared %}<details><summary>device telemetry of {{ t.module }}
({{ t.status }})</summary><table><tr><th>figure</th><th>module</th><th>fleet median</th><th>unit</th><th>keys</th></tr>
{% for c in t.compared %}<tr><td{% if c.unusual %} class="bad"{% endif %}>{{ c.what }}</td>
<td class="num">{{ num(c.value) }}</td><td class="num">{{ num(c.fleet) }}</td><td>{{ c.unit }}</td>
<td class="num">{{ c.keys }}</td></tr>{% endfor %}</table></details>{% endfor %}
{% else %}<p>None.</p>{% endif %}
<h2>Release benchmark vs probe</h2>
<p{% if not r.disagreements %} class="muted"{% endif %}>{{ probe_line }}</p>
{% if r.disagreements %}<table><tr><th>module</th><th>model key</th><th>profile</th><th>metric</th><th>release</th>
<th>probe</th><th>change</th></tr>
{% for d in r.disagreements %}<tr><td>{{ d.module }}</td><td>{{ d.model_key }}</td><td>{{ d.profile }}</td>
<td>{{ d.metric }}</td><td class="num">{{ num(d.release) }}</td><td class="num">{{ num(d.probe) }}</td>
<td class="num bad">{{ pct(d.change) }}</td></tr>
{% endfor %}</table>{% endif %}
<h2>Decode throughput against context</h2>{{ decode_svg|safe }}
<h2>Time to first token against input length</h2>{{ ttft_svg|safe }}
<h2>Modules against the fleet</h2>{{ heat_svg|safe }}
{% if r.changes %}<h2>Every change per model key</h2>
{% set moved = r.changes|rejectattr("status", "equalto", "within tolerance")|list %}
<p class="muted">{{ r.changes|length - moved|length }} of {{ r.changes|length }} comparisons within tolerance
(fleet median over profiles; p: Wilcoxon signed-rank across profiles).</p>
{% if moved %}{{ changes_table(moved) }}{% endif %}
<details><summary>all {{ r.changes|length }} comparisons</summary>{{ changes_table(r.changes) }}</details>
{% endif %}
{% if r.notes %}<h2>Notes</h2><ul>{% for n in r.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
</body></html>
"""


def to_html(r: Report) -> str:
    """The whole report as one HTML document."""
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    tpl = env.from_string(_TEMPLATE)
    return tpl.render(
        r=r, line=verdict_line(r), probe_line=probe_text(r), color=_COLORS.get(r.verdict, "#59636e"), num=num,
        pct=pct, telemetry_line=telemetry_line, FLEET=FLEET,
        decode_svg=curve_plot(r.summary, "decode_tps", "decode tok/s", "Decode tok/s") if len(r.summary) else "",
        ttft_svg=curve_plot(r.summary, "ttft_ms", "TTFT ms", "TTFT ms") if len(r.summary) else "",
        heat_svg=heatmap(r.deviation),
    )
