"""The report page: one self-contained index.html (inline CSS, no scripts) beside its PNGs.

Every piece of text from the database goes through `html.escape` (quotes too), and numbers are formatted only when
they are numbers: a database anyone can write to (a shared SQLite file, a fleet's PostgreSQL) must not be able to
put markup or script into the page, nor stop it from being written. `tests/test_reliability_report.py` stores a
class named ``<img src=x onerror=alert(1)>`` (and worse) in every text field and checks the page.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from autotune.errors import PeagleError
from autotune.report._plots import advantage_svg
from autotune.report._series import (
    DrafterRow,
    advantage_data,
    config_label,
    distinct,
    drafter_rows,
    kind_of,
    provenance_caption,
    slos_of,
)
from autotune.spec import SpecConfig
from store import RecommendationRecord


@dataclass(frozen=True)
class Figure:
    """One PNG with its heading, how to read it, and whether it shows measured or predicted numbers."""

    file: str
    """File name relative to the page."""
    heading: str
    how_to_read: str
    kind: str
    """"measured", "predicted" or "mixed"."""
    caption: str


@dataclass
class ModelSection:
    model: str
    latest: list[RecommendationRecord]
    """The newest recommendation per (GPU, workload, objective, scenario)."""
    recommendations: list[RecommendationRecord]
    figures: dict[str, list[Figure]] = field(default_factory=dict)
    """Section title -> figures, in page order."""
    notes: list[str] = field(default_factory=list)


SECTION_HELP: dict[str, str] = {
    "Acceptance per draft position": (
        "Each bar is the share of drafts whose first i tokens were all accepted by the target model. Bars that stay "
        "tall further right mean deeper drafts pay off; the black whiskers are 95% intervals (wide whiskers: too few "
        "drafts were measured to be sure)."
    ),
    "Acceptance length AL(K)": (
        "AL(K) is the number of tokens one request gains per engine step when K drafts are verified (1 means no "
        "speculation). Where a curve flattens, deeper drafting buys little; stars are the drafter publisher's own "
        "figures, for comparison."
    ),
    "Step cost T(B, K)": (
        "Time of one engine step as the batch grows, one colour per draft depth K. The gap between colours is what "
        "verifying more drafts costs: when it widens with the batch size, deep drafting stops paying at high load."
    ),
    "Predicted tokens/s against K": (
        "One panel per batch size: output tokens/s if every step verifies K drafts (B x AL(K) / T(B, K)). The red "
        "star is the best K; the dashed line is serving without speculation, and any K below it would make serving "
        "slower."
    ),
    "Search trials": (
        "Each dot is one configuration the search evaluated: left in the order it ran (the line is the best so far), "
        "right by draft depth K. Colours separate drafters and parallel vs sequential drafting; red crosses are "
        "trials that failed (for example out of memory) and have no value. The gold star is the recommended "
        "configuration (within 0.1% of the top, or within the prediction's spread for predicted figures, the search "
        "prefers the smaller K)."
    ),
    "Pareto fronts": (
        "Each dot is a configuration of a multi-objective study; the gold diamonds form the Pareto front, where no "
        "other configuration is better on both axes. Choose along the front by your latency budget."
    ),
    "Simulated serving against concurrency": (
        "PREDICTED by `peagle-tune simulate`, not measured: a step-by-step simulation of continuous batching on the "
        "GPU named, with step times from a cost model and acceptance from the source named under the figure. Left: "
        "output tokens/s per config as concurrency grows; right: TPOT p50. One row per workload shape (shifting: "
        "each class alone, then mixed; stationary: mixed throughout). The dashed grey line is no speculation; the "
        "dotted black one is the per-phase oracle (each phase served by its best static config)."
    ),
}

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
.meta { color: #666; font-size: 0.9em; }
.badge { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.8em; font-size: 0.75em; font-weight: bold;
         vertical-align: middle; letter-spacing: 0.05em; }
.measured { background: #d7f5dd; color: #145a23; border: 1px solid #6cc07f; }
.predicted { background: #fdebd0; color: #7a4a00; border: 1px solid #e0a84a; }
.mixed, .unknown { background: #e8e8e8; color: #333; border: 1px solid #aaa; }
.card { border: 1px solid #ddd; border-radius: 8px; padding: 0.8em 1.2em; margin: 1em 0; background: #fafafa; }
.card h3 { margin: 0.2em 0 0.5em 0; font-size: 1.1em; }
.headline { font-size: 1.05em; background: #eef4ff; border-left: 4px solid #3b6fd6; padding: 0.5em 1em; }
pre { background: #1e1e1e; color: #f0f0f0; padding: 0.6em 0.9em; border-radius: 6px; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; }
.numbers span { margin-right: 1.6em; } .numbers b { font-size: 1.1em; }
.prov { color: #555; font-size: 0.85em; }
figure { margin: 1.2em 0 2em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.85em; }
.howto { background: #fffbe6; border-left: 4px solid #e0c040; padding: 0.4em 0.9em; }
tr.recommended td { font-weight: bold; background: #eef4ff; } .same { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; width: 100%; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.5em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; white-space: nowrap; }
.notes li { color: #7a4a00; }
"""


def badge(kind: str) -> str:
    label = {"measured": "MEASURED", "predicted": "PREDICTED", "mixed": "MEASURED + PREDICTED"}.get(kind, "UNKNOWN")
    return f'<span class="badge {escape(kind)}">{label}</span>'


def speculative_config_json(rec: RecommendationRecord) -> str | None:
    """The exact ``--speculative-config`` JSON of a recommendation (one line); None if it serves without one."""
    try:
        spec = SpecConfig.from_dict(rec.best_config).speculative_config()
    except (PeagleError, TypeError):
        return None
    return None if spec is None else json.dumps(spec)


def serve_command(rec: RecommendationRecord) -> str | None:
    """The `vllm serve` command line of a recommendation (None if its config is unreadable)."""
    from autotune.export import render

    try:
        text, _ = render("vllm-args", rec.to_dict())
    except (PeagleError, TypeError, KeyError):
        return None
    return text.strip()


def objective_label(rec: RecommendationRecord) -> str:
    """The objective with its SLOs, e.g. ``pareto (TPOT p99 <= 8 ms)``."""
    names = {"tpot_ms_p99": "TPOT p99", "ttft_ms_p99": "TTFT p99"}
    slos = ", ".join(f"{names.get(m, m)} <= {v:g} ms" for m, v in slos_of(rec).items())
    return f"{rec.objective} ({slos})" if slos else rec.objective


def scenario_label(scenario: dict[str, Any]) -> str:
    """"8 requests/s" or "concurrency 8" (plain text: escape it before putting it in the page)."""
    rate = scenario.get("request_rate")
    if rate:
        return f"{rate:g} requests/s" if _is_number(rate) else f"{str(rate)[:40]} requests/s"
    return f"concurrency {str(scenario.get('concurrency', '?'))[:40]}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num(value: Any, fmt: str, suffix: str = "") -> str:
    if not _is_number(value):
        return "-"
    return f"{value:{fmt}}{suffix}"


def _schedule_entry(entry: dict[str, Any]) -> str:
    lo, hi, k = entry.get("batch_min"), entry.get("batch_max"), entry.get("k")
    batches = f"B={lo}" if lo == hi else f"B={lo}-{hi}"
    return f"{batches}: {f'K={k}' if k else 'no speculation'}"


def _p99(metrics: dict[str, Any]) -> str:
    value = metrics.get("tpot_ms_p99")
    if not _is_number(value):
        return ""
    copied = "tpot_ms_p99" in (metrics.get("p99_from_p50") or [])
    note = " (set to p50: the prediction has no tail)" if copied else ""
    return f"<span>TPOT p99 <b>{value:.2f}</b> ms{note}</span>"


def _same_as(same: Sequence[RecommendationRecord]) -> str:
    """``#3 (pareto), #1 (throughput)``: near-identical recommendations an entry stands for."""
    return ", ".join(f"#{r.id} ({escape(objective_label(r))})" for r in same)


def _summary_card(rec: RecommendationRecord, same: Sequence[RecommendationRecord] = ()) -> str:
    kind = kind_of(rec.provenance)
    m = rec.metrics
    spec_json = speculative_config_json(rec)
    title = " &middot; ".join(
        escape(part)
        for part in (
            rec.model,
            scenario_label(rec.scenario),
            f"workload {rec.workload_name or '?'}",
            rec.gpu,
            f"objective {objective_label(rec)}",
        )
    )
    parts = [f'<div class="card"><h3>{title} {badge(kind)}</h3>']
    parts.append(f"<p>Recommended: <b>{escape(config_label(rec.best_config))}</b>")
    drafter = rec.best_config.get("drafter")
    if drafter:
        parts.append(f" &mdash; drafter <code>{escape(str(drafter))}</code>")
    parts.append("</p>")
    if same:
        parts.append(f'<p class="same">The same config for the same load is also stored as {_same_as(same)}.</p>')
    if spec_json is not None:
        parts.append("<p>Paste into <code>vllm serve</code>:</p>")
        parts.append(f'<pre class="specconfig">--speculative-config {escape(shlex.quote(spec_json))}</pre>')
    else:
        parts.append("<p><b>Serve without speculation</b> (no <code>--speculative-config</code>): no draft depth "
                     "beats plain decoding here.</p>")
    cmd = serve_command(rec)
    if cmd:
        parts.append(f'<details><summary>Full command line</summary><pre>{escape(cmd)}</pre></details>')
    pub_k = m.get("published_k")
    vs_pub = _num(m.get("speedup_vs_published_k"), ".2f", "x")
    pub = f" (published K={escape(str(pub_k))})" if pub_k is not None else ""
    parts.append(
        '<p class="numbers">'
        f"<span>Throughput <b>{_num(m.get('output_tokens_per_s'), ',.0f')}</b> output tokens/s</span>"
        f"<span>TPOT p50 <b>{_num(m.get('tpot_ms_p50'), '.2f')}</b> ms</span>"
        f"{_p99(m)}"
        f"<span>vs no speculation <b>{_num(m.get('speedup_vs_no_spec'), '.2f', 'x')}</b></span>"
        f"<span>vs published K <b>{vs_pub}</b>{pub}</span></p>"
    )
    if rec.schedule:
        sched = ", ".join(_schedule_entry(e) for e in rec.schedule if isinstance(e, dict))
        parts.append(f"<p>Batch-size schedule (best K per batch size): {escape(sched)}</p>")
    if rec.class_policy:
        pol = ", ".join(
            f"{escape(str(c))}: K&le;{escape(str(v.get('max_k')))}" if isinstance(v, dict) else escape(str(c))
            for c, v in sorted(rec.class_policy.items())
        )
        parts.append(f"<p>Per-class depth caps: {pol}</p>")
    parts.append(f'<p class="prov">{escape(provenance_caption(rec.provenance))} Recommendation #{rec.id}, '
                 f"{escape(rec.created_at.strftime('%Y-%m-%d %H:%M UTC'))}.</p></div>")
    return "".join(parts)


def headline(recs: Sequence[RecommendationRecord]) -> str | None:
    """One sentence on how the best K moves with load, for recommendations of one model/GPU/workload/objective."""
    points = []
    for r in recs:
        c = r.scenario.get("concurrency")
        if r.scenario.get("request_rate") or not isinstance(c, int) or isinstance(c, bool) or c < 1:
            continue
        k = r.best_config.get("num_speculative_tokens", 0) if r.best_config.get("method", "none") != "none" else 0
        if not isinstance(k, int) or isinstance(k, bool):
            continue
        points.append((c, k))
    if len(points) < 2:
        return None
    points.sort()
    text = ", ".join(f"{f'K={k}' if k else 'no speculation'} at {c}" for c, k in points)
    ks = {k for _, k in points}
    moral = (
        "One fixed K is not best for every load: use the batch-size schedule or `peagle-tune serve`."
        if len(ks) > 1
        else "The same K is best at every concurrency tried."
    )
    return f"Best draft depth by concurrency (requests in flight): {text}. {moral}"


DRAFTERS_HELP = (
    "Each drafter variant at its own best config, per concurrency: P-EAGLE (parallel drafting: all K drafts in one "
    "drafter pass) against EAGLE-3 (sequential: one pass per draft), and 2- against 4-layer heads. vs EAGLE-3 divides "
    "by the best plain EAGLE-3 head at its best K (ref); the recommended variant is in bold; * marks a hypothetical "
    "variant (no checkpoint: predicted only, never recommended while a released one qualifies)."
)


def _drafter_table(rows: Sequence[DrafterRow]) -> str:
    """The P-EAGLE vs EAGLE-3 table (`autotune.report._series.drafter_rows`)."""
    cols = ("concurrency", "drafter", "layers", "drafting", "K", "max_num_seqs", "tokens/s", "vs no spec",
            "vs EAGLE-3")
    out = ['<table class="drafters"><tr>' + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr>"]
    previous = None
    for r in rows:
        vs_e3 = "ref" if r.eagle3_reference else _num(r.speedup_vs_eagle3, ".2f", "x")
        cells = [
            escape(str(r.concurrency)) if r.concurrency != previous else "",
            escape(r.drafter) + ("*" if r.hypothetical else ""),
            escape(str(r.layers)) if r.layers else "-",
            "parallel (P-EAGLE)" if r.parallel_drafting else "sequential",
            escape(str(r.k)) if r.k else "-",
            escape(str(r.max_num_seqs)) if r.max_num_seqs else "-",
            _num(r.tokens_per_s, ",.0f"),
            _num(r.speedup_vs_no_spec, ".2f", "x"),
            vs_e3,
        ]
        previous = r.concurrency
        style = ' class="recommended"' if r.recommended else ""
        out.append(f"<tr{style}>" + "".join(
            f'<td class="num">{c}</td>' if i in (0, 2, 4, 5, 6, 7, 8) else f"<td>{c}</td>" for i, c in enumerate(cells)
        ) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _advantage_figure(model: str, gpu: str, workload: str, objective: str, rows: Sequence[DrafterRow],
                      kind: str) -> str:
    """P-EAGLE over EAGLE-3 against concurrency beside every published ratio for `model`, with their sources
    (`autotune.report._plots.advantage_svg`, inline); "" when no parallel drafting variant has a ratio."""
    title = f"P-EAGLE over EAGLE-3 against concurrency: {model} on {gpu}, {workload}, {objective}"
    data = advantage_data(model, gpu, rows, title, kind)
    if data is None:
        return ""
    sources = dict.fromkeys(f"{p.gpu}: {p.source}" for p in data.published)
    published = ("Published points (squares with their range; filled: measured on this GPU, hollow: on another): "
                 + " ".join(f"[{i}] {escape(text)}" for i, text in enumerate(sources, 1))) if sources else \
        "No published P-EAGLE over EAGLE-3 figure for this model."
    return (f'<figure class="advantage">{advantage_svg(data)}<figcaption>{badge(kind)} Lines: each parallel drafting '
            f"variant's tokens/s over the best EAGLE-3 head at its best K (as in the table above; * hypothetical). "
            f"{published}</figcaption></figure>")


def _rec_table(recs: Sequence[RecommendationRecord]) -> str:
    cols = ("#", "created", "GPU", "vLLM", "workload", "objective", "scenario", "config", "tokens/s", "TPOT p50 ms",
            "vs no spec", "vs pub. K", "source", "study")
    rows = ["<table><tr>" + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr>"]
    for r, same in distinct(recs):
        m = r.metrics
        cells = [
            escape(str(r.id)) + (f' <span class="same">(also {", ".join(f"#{o.id}" for o in same)})</span>'
                                 if same else ""),
            escape(r.created_at.strftime("%Y-%m-%d %H:%M")),
            escape(r.gpu),
            escape(r.vllm_version or "-"),
            escape(r.workload_name or "-"),
            escape(objective_label(r)),
            escape(scenario_label(r.scenario)),
            escape(config_label(r.best_config)),
            _num(m.get("output_tokens_per_s"), ",.0f"),
            _num(m.get("tpot_ms_p50"), ".2f"),
            _num(m.get("speedup_vs_no_spec"), ".2f", "x"),
            _num(m.get("speedup_vs_published_k"), ".2f", "x"),
            badge(kind_of(r.provenance)),
            escape(r.study or "-"),
        ]
        num = {8, 9, 10, 11}
        rows.append("<tr>" + "".join(
            f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(cells)
        ) + "</tr>")
    rows.append("</table>")
    return "".join(rows)


def _figure(fig: Figure) -> str:
    return (
        f'<figure><img src="{escape(fig.file)}" alt="{escape(fig.heading)}">'
        f"<figcaption>{badge(fig.kind)} {escape(fig.caption)}</figcaption></figure>"
    )


def render_page(sections: Sequence[ModelSection], *, db: str, generated: str) -> str:
    """The whole page: summary cards first, then per model the figure sections and the recommendations table."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>peagle-tune report: {escape(', '.join(s.model for s in sections))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>peagle-tune report</h1>",
        f'<p class="meta">Generated {escape(generated)} from <code>{escape(db)}</code>. '
        f"{badge('measured')} numbers come from a real vLLM engine (device, vLLM version and date given); "
        f"{badge('predicted')} numbers come from the model backend (the GPU it assumed and the profile it used are "
        "given). Speedups compare against serving without speculation and against the drafter's published K.</p>",
        "<h2>Summary: what to run</h2>",
    ]
    for s in sections:
        if not s.latest:
            out.append(f"<p><b>{escape(s.model)}</b>: no recommendation stored yet; run "
                       f"<code>peagle-tune search --model {escape(s.model)}</code>.</p>")
            continue
        cards = {r.id: same for r, same in distinct(s.latest)}  # one card per distinct recommendation
        groups: dict[tuple[str, str, str], list[RecommendationRecord]] = {}
        for r in s.latest:
            groups.setdefault((r.gpu, r.workload_name or "", objective_label(r)), []).append(r)
        for (gpu, workload, objective), recs in groups.items():
            line = headline(recs)
            if line:
                out.append(
                    f'<p class="headline"><b>{escape(s.model)}</b> on {escape(gpu)}, {escape(workload or "?")}, '
                    f"{escape(objective)} {badge(_group_kind(recs))}: {escape(line)}</p>"
                )
            out.extend(_summary_card(r, cards[r.id]) for r in recs if r.id in cards)
    for s in sections:
        out.append(f"<h2>{escape(s.model)}</h2>")
        if s.notes:
            out.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in s.notes) + "</ul>")
        for title, figures in s.figures.items():
            if not figures:
                continue
            out.append(f"<h3>{escape(title)}</h3>")
            help_text = SECTION_HELP.get(title)
            if help_text:
                out.append(f'<p class="howto"><b>How to read it:</b> {escape(help_text)}</p>')
            out.extend(_figure(f) for f in figures)
        by_search: dict[tuple[str, str, str], list[RecommendationRecord]] = {}
        for r in s.latest:
            by_search.setdefault((r.gpu, r.workload_name or "?", objective_label(r)), []).append(r)
        for (gpu, workload, objective), recs in by_search.items():
            rows = drafter_rows(recs)
            if len({(r.drafter, r.layers, r.parallel_drafting) for r in rows}) < 2:
                continue
            out.append(f"<h3>P-EAGLE vs EAGLE-3 (2 vs 4 layers): {escape(gpu)}, {escape(workload)}, "
                       f"{escape(objective)} {badge(_group_kind(recs))}</h3>")
            out.append(f'<p class="howto"><b>How to read it:</b> {escape(DRAFTERS_HELP)}</p>')
            out.append(_drafter_table(rows))
            out.append(_advantage_figure(s.model, gpu, workload, objective, rows, _group_kind(recs)))
        distinct_recs = distinct(s.recommendations)
        out.append(f"<h3>Recommendations for {escape(s.model)} ({len(distinct_recs)})</h3>")
        out.append(_rec_table(s.recommendations) if s.recommendations else "<p>None stored.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _group_kind(recs: Sequence[RecommendationRecord]) -> str:
    kinds = {kind_of(r.provenance) for r in recs}
    return kinds.pop() if len(kinds) == 1 else "mixed"
