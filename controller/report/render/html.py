"""Reports as one self-contained HTML file: inline CSS, inline SVG plots from matplotlib, no external URL.

The first screen is the verdict and the summary under it (:mod:`.glance`: what regressed, which modules are out of
line, what was not measured and why); the figures are :mod:`.plots`' (curves against the baseline and its tolerance
band, axes from zero, a legend that fits; the deviation heatmap; the History series). Keys without a context sweep
(MTP keys: GSM8K prompts; a vision table alone) are named under the plots, not left out silently. Tables list
profiles in numeric order.
"""

from __future__ import annotations

from jinja2 import Environment, select_autoescape

from controller.report.model import FLEET, Report
from controller.report.render.glance import (
    ALL_MEASURED,
    CALM_MODULES,
    NO_REFERENCE,
    glance,
    not_plotted,
    not_plotted_line,
)
from controller.report.render.numbers import in_profile_order, num, pct
from controller.report.render.plots import (
    BAND_LABEL,
    MIN_FONT_PT,
    cell_label,
    curve_plot,
    heatmap,
    history_plot,
    tokens_label,
)
from controller.report.render.text import (
    NO_INTERVAL,
    energy_text,
    probe_text,
    startup_lines,
    telemetry_cell,
    verdict_line,
)

_COLORS = {"pass": "#1a7f37", "regressed": "#cf222e", "incomplete": "#9a6700", "failed": "#82071e"}
__all__ = ["BAND_LABEL", "MIN_FONT_PT", "cell_label", "curve_plot", "heatmap", "history_plot", "not_plotted",
           "not_plotted_line", "to_html", "tokens_label"]


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
table.glance{font-size:14px;margin:.8em 0}table.glance th{width:9em;vertical-align:top}
</style></head><body>
<h1>Fleet report {{ r.run_id }}</h1>
<p class="verdict">{{ line }}</p>
{% if page_url %}<p class="page"><a href="{{ page_url }}">The run's page</a> (modules, keys, logs, retry)</p>{% endif %}
<p class="muted">Release {{ r.release or "?" }} &middot; baseline {{ r.baseline_id or "none" }} &middot;
previous {{ r.previous_ids|join(", ") or "none" }} &middot; {{ r.modules|length }} module(s) &middot;
tolerance {{ "%.0f"|format(r.thresholds.tolerance * 100) }} %</p>
<table class="glance"><tr><th>regressed</th><td{% if g.regressed %} class="bad"{% endif %}>
{% if g.regressed %}{% for x in g.regressed %}{{ x }}{% if not loop.last %}<br>{% endif %}{% endfor %}
{% else %}{{ g.calm }}{% endif %}</td></tr>
<tr><th>out of line</th><td{% if g.out_of_line %} class="bad"{% endif %}>
{% if g.out_of_line %}{% for x in g.out_of_line %}{{ x }}{% if not loop.last %}<br>{% endif %}{% endfor %}
{% else %}{{ calm_modules }}{% endif %}</td></tr>
<tr><th>not measured</th><td>{% if g.not_measured %}{% for x in g.not_measured %}{{ x }}{% if not loop.last %}<br>
{% endif %}{% endfor %}{% else %}{{ all_measured }}{% endif %}
</td></tr></table>
<h2>Regressions</h2>
{% if r.regressions %}<table><tr><th>module</th><th>model key</th><th>profile</th><th>metric</th><th>baseline</th>
<th>value</th><th>change</th><th>95% interval</th><th>against</th><th>detail</th></tr>
{% for x in ordered(r.regressions) %}<tr><td>{{ x.module }}</td><td>{{ x.model_key }}</td><td>{{ x.profile }}</td>
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
{% set bare = startup|select("endswith", no_reference)|list %}
{% set judged = startup|reject("endswith", no_reference)|list %}
{% if judged %}<ul>{% for x in judged %}<li>{{ x }}</li>{% endfor %}</ul>{% endif %}
{% if bare %}<details><summary>{{ bare|length }} start-up figure(s) without a reference (fleet medians)</summary>
<ul>{% for x in bare %}<li>{{ x }}</li>{% endfor %}</ul></details>{% endif %}
{% if not startup %}<p class="muted">No start-up figures in this run.</p>{% endif %}
<h2>Release benchmark vs probe</h2>
<p{% if not r.disagreements %} class="muted"{% endif %}>{{ probe_line }}</p>
{% if r.disagreements %}<table><tr><th>module</th><th>model key</th><th>profile</th><th>metric</th><th>release</th>
<th>probe</th><th>change</th></tr>
{% for d in ordered(r.disagreements) %}<tr><td>{{ d.module }}</td><td>{{ d.model_key }}</td><td>{{ d.profile }}</td>
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
    env.tests["endswith"] = lambda text, end: str(text).endswith(end)
    tpl = env.from_string(_TEMPLATE)
    startup = startup_lines(r)
    return tpl.render(
        r=r, page_url=page_url, line=verdict_line(r), probe_line=probe_text(r), energy_line=energy_text(r),
        startup=startup,
        g=glance(r, startup), no_reference=NO_REFERENCE, calm_modules=CALM_MODULES, all_measured=ALL_MEASURED,
        ordered=in_profile_order,
        color=_COLORS.get(r.verdict, "#59636e"), num=num,
        pct=pct, telemetry_cell=telemetry_cell, FLEET=FLEET, no_interval=NO_INTERVAL,
        decode_svg=curve_plot(r.summary, "decode_tps", "decode tok/s", r.thresholds.tol("decode_tps"))
        if len(r.summary) else "",
        ttft_svg=curve_plot(r.summary, "ttft_ms", "TTFT ms", r.thresholds.tol("ttft_ms")) if len(r.summary) else "",
        decode_missing=not_plotted_line(r.summary, "decode_tps", bool(r.changes)),
        ttft_missing=not_plotted_line(r.summary, "ttft_ms", bool(r.changes)),
        heat_svg=heatmap(r.deviation),
        history_svgs=[history_plot(t) for t in r.history.series] if r.history is not None else [],
    )
