"""One function per report figure; each writes a PNG and returns its path (drawn in memory, then written by
`autotune.safe_io.write_file`: a file or link at the path is replaced, a link's target never written).

matplotlib is imported lazily (Agg backend, no display needed). Every figure carries its provenance line (measured:
device, vLLM version, date; predicted: backend, GPU assumed, profile used) under the plot.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any

from autotune.report._series import (
    AcceptanceData,
    AdvantageData,
    GoodputData,
    SimulationData,
    StepCostData,
    StudyData,
)
from autotune.safe_io import write_file

DPI = 110
_SHAPES = ("o", "s", "^", "D", "v", "P", "X", "h")
_WRAP_PER_INCH = 14.5  # caption characters per inch of figure width (8 pt text)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    # Labels hold names from the database (classes, drafters, studies): "$...$" in one must print as text, not
    # be parsed as math (an unbalanced "$\frac{$" class name stopped the whole report).
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, title: str, caption: str, path: Path, *, width_in: float, legend_rows: int = 0) -> Path:
    """Title on top, wrapped provenance caption at the bottom, tight layout, close; the PNG replaces `path`
    (`autotune.safe_io.write_file`)."""
    wrap = max(60, int(_WRAP_PER_INCH * width_in))
    lines = textwrap.wrap(caption, wrap)
    title_lines = textwrap.wrap(title, int(width_in * 8.5))
    fig.suptitle("\n".join(title_lines), fontsize=12, fontweight="bold")
    height = fig.get_size_inches()[1]
    bottom = (0.16 * len(lines) + 0.12) / height
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=8, color="0.25", va="bottom", ha="left")
    if legend_rows:
        # A figure legend sits just above the caption; keep the axes above both.
        for legend in fig.legends:
            legend.set_bbox_to_anchor((0.5, bottom), transform=fig.transFigure)
        bottom += (0.2 * legend_rows + 0.1) / height
    fig.tight_layout(rect=(0, bottom, 1, 1))  # tight_layout makes room for the suptitle itself
    png = io.BytesIO()
    # bbox "tight" keeps legends placed outside the axes inside the image.
    fig.savefig(png, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    _pyplot().close(fig)
    # Through the one writer: a link at `path` is replaced, not written through; the caller checked --force.
    write_file(path, png.getvalue(), force=True)
    return path


def _tag(measured: bool) -> str:
    return "MEASURED" if measured else "PREDICTED"


def _study_tag(data: StudyData) -> str:
    """The tag of a study's figures, like the other figures': ``[MEASURED] ``, ``[PREDICTED] ``, ..."""
    tag = {"measured": "MEASURED", "predicted": "PREDICTED", "mixed": "MEASURED + PREDICTED"}.get(data.kind)
    return f"[{tag}] " if tag else ""


def plot_acceptance(data: AcceptanceData, path: Path) -> Path:
    """Survival per draft position per class: P(first i drafts accepted), with 95% intervals as error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.2))
    n = len(data.classes)
    width = 0.8 / max(n, 1)
    for j, c in enumerate(data.classes):
        xs = [i + 1 + (j - (n - 1) / 2) * width for i in range(len(c.survival))]
        err = [
            [s - lo for s, lo in zip(c.survival, c.survival_low, strict=True)],
            [hi - s for s, hi in zip(c.survival, c.survival_high, strict=True)],
        ]
        label = f"{c.name} ({c.num_drafts:,} drafts)" if c.num_drafts else c.name
        ax.bar(xs, c.survival, width=width * 0.95, label=label, alpha=0.85)
        ax.errorbar(xs, c.survival, yerr=err, fmt="none", ecolor="black", capsize=3, lw=1)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(first i draft tokens all accepted)")
    ax.set_xticks(range(1, data.max_k + 1))
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="workload class (bars: 95% interval)", fontsize=9)
    return _finish(
        fig, f"[{_tag(data.measured)}] Acceptance per draft position: {data.title}", data.caption, path, width_in=9
    )


def plot_acceptance_length(data: AcceptanceData, path: Path) -> Path:
    """AL(K) per class for K = 0..max_k with 95% bands, and the published reference points."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.2))
    ks = list(range(data.max_k + 1))
    for c in data.classes:
        n = len(c.acceptance_length)
        (line,) = ax.plot(ks[:n], c.acceptance_length, marker="o", label=c.name)
        if c.num_drafts:
            ax.fill_between(ks[:n], c.al_low, c.al_high, color=line.get_color(), alpha=0.2)
        for k, al, _ in c.references:
            ax.plot([k], [al], marker="*", markersize=15, color=line.get_color(), markeredgecolor="black", ls="none")
    ax.plot([], [], marker="*", markersize=12, color="white", markeredgecolor="black", ls="none",
            label="published value (model card)")
    ax.plot(ks, [k + 1 for k in ks], ls=":", color="0.6", label="ceiling: every draft accepted (K+1)")
    ax.set_xlabel("K (draft tokens verified per step)")
    ax.set_ylabel("AL(K): tokens per request per step")
    ax.set_xticks(ks)
    top = max(max(c.acceptance_length) for c in data.classes) if data.classes else 2.0
    ax.set_ylim(0.9, max(top * 1.25, 2.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    caption = data.caption + (" " + data.reference_note if data.reference_note else "")
    if data.measured:
        caption += " Shaded: 95% interval."
    return _finish(fig, f"[{_tag(data.measured)}] Acceptance length AL(K): {data.title}", caption, path, width_in=9)


def plot_step_cost(data: StepCostData, path: Path) -> Path:
    """T(B, K) in ms: one colour per K; dots are measured samples, lines the model."""
    plt = _pyplot()
    from matplotlib import colormaps

    fig, ax = plt.subplots(figsize=(10, 5.8))
    depths = sorted(set(data.model_lines) | {s[1] for s in data.samples})
    cmap = colormaps["viridis"]
    for i, k in enumerate(depths):
        color = cmap(i / max(len(depths) - 1, 1))
        if k in data.model_lines:
            bs, ms = zip(*data.model_lines[k], strict=True)
            # A single batch size has no line to draw: show the model's value as a bar marker instead.
            style = {"marker": "_", "markersize": 22, "mew": 2} if len(bs) == 1 else {}
            ax.plot(bs, ms, color=color, lw=1.6, label=f"K={k}", **style)
        pts = [(b, t) for b, d, t, _ in data.samples if d == k]
        if pts:
            bs, ms = zip(*pts, strict=True)
            ax.plot(bs, ms, ls="none", marker="o", color=color, markeredgecolor="black",
                    label=None if k in data.model_lines else f"K={k}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("B (requests in the step)")
    ax.set_ylabel("T(B, K): engine step time (ms)")
    ax.grid(alpha=0.3, which="both")
    # Both legends sit outside the axes so they never hide a sample.
    handles, labels = ax.get_legend_handles_labels()
    legend1 = ax.legend(handles, labels, title="verified depth", fontsize=8, loc="upper left",
                        bbox_to_anchor=(1.01, 1.0), ncol=1 if len(depths) <= 12 else 2)
    ax.add_artist(legend1)
    legend1.set_clip_on(False)  # add_artist clips to the axes; this legend lives outside them
    kind_handles = []
    if data.samples:
        kind_handles.append(ax.plot([], [], ls="none", marker="o", color="0.6", markeredgecolor="black",
                                    label="measured (mean step time)")[0])
    if data.model_lines:
        kind_handles.append(ax.plot([], [], color="0.3", lw=1.6, label=data.model_label)[0])
    ax.legend(handles=kind_handles, fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.13), frameon=False)
    return _finish(fig, f"[{_tag(data.measured)}] {data.title}", data.caption, path, width_in=10)


def plot_goodput(data: GoodputData, path: Path) -> Path:
    """Predicted tokens/s against K, one panel per batch size; the best K is starred, K=0 is no speculation."""
    plt = _pyplot()
    sizes = sorted(data.tokens_per_s)
    ncols = min(len(sizes), 4)
    nrows = math.ceil(len(sizes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols + 0.6, 3.3 * nrows + 1.0), squeeze=False)
    for ax in axes.flat[len(sizes):]:
        ax.set_visible(False)
    for ax, b in zip(axes.flat, sizes, strict=False):
        values = data.tokens_per_s[b]
        ax.plot(data.ks, values, marker="o", color="tab:blue")
        base = values[0] if data.ks and data.ks[0] == 0 else math.nan
        if math.isfinite(base):
            ax.axhline(base, color="0.5", ls="--", lw=1)
        if data.published_k is not None and data.published_k in data.ks:
            ax.axvline(data.published_k, color="tab:orange", ls=":", lw=1.2)
        best = data.best_k(b)
        title = f"B = {b}"
        if best is not None:
            v = values[data.ks.index(best)]
            gain = f", {v / base:.2f}x no-spec" if math.isfinite(base) and base > 0 else ""
            ax.plot([best], [v], marker="*", markersize=16, color="tab:red", markeredgecolor="black", ls="none")
            title += f": best K={best}\n{v:,.0f} tok/s{gain}"
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            lo, hi = min(finite), max(finite)
            pad = (hi - lo) * 0.12 or hi * 0.05 or 1.0
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("K (draft depth)")
        ax.set_ylabel("output tokens/s")
        ax.set_xticks(data.ks)
        ax.grid(alpha=0.3)
    # One legend for every panel, under them.
    handles = [
        plt.Line2D([], [], color="tab:blue", marker="o", label="predicted tokens/s at K"),
        plt.Line2D([], [], color="0.5", ls="--", label="K=0: no speculation"),
        plt.Line2D([], [], color="tab:red", marker="*", markersize=12, markeredgecolor="black", ls="none",
                   label=f"best K (smallest within {data.margin:.1%} of the top)"),
    ]
    if data.published_k is not None and data.published_k in data.ks:
        handles.append(plt.Line2D([], [], color="tab:orange", ls=":", label=f"published K={data.published_k}"))
    width = max(3.4 * ncols + 0.6, 7.0)
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4 if width >= 10 else 2), fontsize=8,
               bbox_to_anchor=(0.5, -0.02), frameon=False)
    return _finish(fig, f"[PREDICTED from {data.source}] {data.title}", data.caption_with_ties(), path, width_in=width,
                   legend_rows=1 if width >= 10 else 2)


def plot_trials(data: StudyData, path: Path) -> Path:
    """Objective value per trial (colour: drafter / parallel drafting; failed and pruned trials marked at the
    bottom) and the same values against K, with the best trial starred."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 6.0), gridspec_kw={"width_ratios": [3, 2]})
    objective = data.objectives[0] if data.objectives else "objective (none stored)"
    groups, colors = _group_colors(data)
    done = [t for t in data.trials if t.status == "complete" and objective in t.values]
    values = [t.values[objective] for t in done]
    floor = min(values) if values else 0.0
    span = (max(values) - floor) if values else 1.0
    seqs = sorted({t.max_num_seqs for t in done})
    shapes = {q: _SHAPES[i % len(_SHAPES)] for i, q in enumerate(seqs)}
    for g in groups:
        for q in seqs:
            pts = [t for t in done if t.group == g and t.max_num_seqs == q]
            if not pts:
                continue
            style = {"color": colors[g], "marker": shapes[q], "s": 30, "edgecolors": "black", "linewidths": 0.4}
            ax1.scatter([t.number for t in pts], [t.values[objective] for t in pts], **style)
            ax2.scatter([t.k for t in pts], [t.values[objective] for t in pts], **style)
    for g in groups:
        ax1.scatter([], [], color=colors[g], marker="s", s=30, label=g)
    if len(seqs) > 1:
        for q in seqs:
            ax2.scatter([], [], color="white", edgecolors="black", marker=shapes[q], s=30, label=f"max_num_seqs={q}")
    bad = [t for t in data.trials if t.status != "complete" or objective not in t.values]
    markers = {"failed": ("x", "tab:red"), "pruned": ("v", "0.4"), "running": ("o", "0.7")}
    for status in ("failed", "pruned", "running", "complete"):
        pts = [t for t in bad if t.status == status]
        if pts:
            m, color = markers.get(status, ("x", "tab:red"))
            ax1.scatter([t.number for t in pts], [floor - 0.08 * (span or 1.0)] * len(pts), marker=m, color=color,
                        s=40, label=f"{status if status != 'complete' else 'no value'} ({len(pts)}, no value)")
    if done:
        sign = 1.0 if data.directions.get(objective) == "maximize" else -1.0
        ordered = sorted(done, key=lambda t: t.number)
        best_so_far, running = [], -math.inf
        for t in ordered:
            running = max(running, sign * t.values[objective])
            best_so_far.append(sign * running)
        ax1.step([t.number for t in ordered], best_so_far, where="post", color="0.3", lw=1, label="best so far")
        best = data.best()
        if best is not None:
            v = best.values[objective]
            for ax, x in ((ax1, best.number), (ax2, best.k)):
                ax.plot([x], [v], marker="*", markersize=17, color="gold", markeredgecolor="black", ls="none")
            right = best.k > (min(t.k for t in done) + max(t.k for t in done)) / 2
            word = "recommended" if data.recommended is not None and best.config == data.recommended else "best"
            ax2.annotate(f"{word}: {best.label}", (best.k, v), textcoords="offset points",
                         xytext=(-12 if right else 12, 12), ha="right" if right else "left", fontsize=8,
                         bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85})
    from matplotlib.ticker import MaxNLocator

    ax1.set_xlabel("trial number (order run)")
    ax1.set_ylabel(f"{metric_label(objective)}\n({_better(data.directions.get(objective, 'maximize'))})")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.grid(alpha=0.3)
    # Legends go below the axes so they never hide a trial.
    ax1.legend(fontsize=8, title="colour: drafter / drafting", title_fontsize=8, loc="upper left",
               bbox_to_anchor=(0.0, -0.16), ncol=2, frameon=False)
    ax2.set_xlabel("K (draft depth; 0 = no speculation)")
    ax2.set_ylabel(metric_label(objective))
    ax2.set_title("same trials by K", fontsize=10)
    if not done:
        ax1.set_yticks([])
        reasons = sorted({t.failure for t in data.trials if t.failure})
        text = "No trial has a value yet." + (" Failure reasons:\n" + "\n".join(
            textwrap.shorten(r, 90) for r in reasons[:5]) if reasons else "")
        ax2.axis("off")
        ax2.set_title("")
        ax2.text(0.0, 0.5, text, fontsize=9, va="center", ha="left", wrap=True)
    if values:
        ks = [t.k for t in done]
        ax2.set_xticks(range(min(ks), max(ks) + 1))
        ax2.set_ylim(floor - 0.05 * (span or 1.0), max(values) + 0.18 * (span or 1.0))
    ax2.grid(alpha=0.3)
    if len(seqs) > 1:
        ax2.legend(fontsize=8, title="marker", title_fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.16),
                   ncol=3, frameon=False)
    n_bad = len(bad)
    head = f"{data.study} ({data.scenario}): {len(done)} complete, {n_bad} without value"
    direction = data.directions.get(objective, "maximize")
    return _finish(fig, f"{_study_tag(data)}Trials: {head}", f"Objective: {objective} ({direction}). {data.caption}",
                   path, width_in=12)


def plot_pareto(data: StudyData, path: Path) -> Path:
    """The first two objectives of a multi-objective study against each other; the Pareto front highlighted, the
    recommended config starred and SLOs drawn as limits."""
    plt = _pyplot()
    a, b = data.objectives[:2]
    fig, ax = plt.subplots(figsize=(9, 5.6))
    done = [t for t in data.trials if t.status == "complete" and a in t.values and b in t.values]
    groups, colors = _group_colors(data)
    for g in groups:
        pts = [t for t in done if t.group == g]
        if pts:
            ax.scatter([t.values[a] for t in pts], [t.values[b] for t in pts], color=colors[g], s=26, alpha=0.75,
                       label=g, edgecolors="black", linewidths=0.3)
    front = data.pareto()
    if front:
        ax.plot([t.values[a] for t in front], [t.values[b] for t in front], color="black", lw=1.5, marker="D",
                markerfacecolor="gold", markersize=8, label=f"Pareto front ({len(front)} trials)", zorder=3)
        # Several configs can land on the same point (e.g. max_num_seqs above the concurrency): one label each.
        labels: dict[tuple[float, float], list[str]] = {}
        for t in front:
            key = (round(t.values[a], 6), round(t.values[b], 6))
            text = f"K={t.k}, seqs={t.max_num_seqs}" if t.k else f"no spec, seqs={t.max_num_seqs}"
            if text not in labels.setdefault(key, []):
                labels[key].append(text)
        for (x, y), texts in labels.items():
            ax.annotate(" | ".join(texts), (x, y), textcoords="offset points", xytext=(6, -12), fontsize=7)
    best = data.best() if data.recommended is not None else None
    if best is not None and a in best.values and b in best.values:
        ax.plot([best.values[a]], [best.values[b]], marker="*", markersize=18, color="gold", markeredgecolor="black",
                ls="none", label=f"recommended: {best.label}", zorder=4)
    for metric, limit in data.slos.items():
        if metric == b:
            ax.axhline(limit, color="tab:red", ls="--", lw=1.2, label=f"SLO: {metric_label(metric)} <= {limit:g}")
        elif metric == a:
            ax.axvline(limit, color="tab:red", ls="--", lw=1.2, label=f"SLO: {metric_label(metric)} <= {limit:g}")
    ax.set_xlabel(f"{metric_label(a)} ({_better(data.directions[a])})")
    ax.set_ylabel(f"{metric_label(b)} ({_better(data.directions[b])})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _finish(fig, f"{_study_tag(data)}Pareto front: {data.study} ({data.scenario})", data.caption, path,
                   width_in=11)


def plot_simulation(data: SimulationData, path: Path) -> Path:
    """Predicted output tokens/s (left) and TPOT p50 (right) against concurrency, one line per config, one row of
    panels per workload shape; tagged PREDICTED (simulate) with the model and the GPU assumed."""
    plt = _pyplot()
    from matplotlib import colormaps

    rows = len(data.workloads)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.6 * rows + 0.8), squeeze=False)
    # No speculation and the oracle frame the plot; static depths shade from dark (small K) to light (large K),
    # thin; the schedule and the adaptive configs get bold colours of their own.
    styles: dict[str, tuple[Any, str, str, float]] = {"none": ("0.35", "--", "o", 1.4),
                                                       "oracle": ("black", ":", "*", 1.4)}
    statics = [c for c in data.configs if data.kinds.get(c) == "static"]
    bold = [c for c in data.configs if data.kinds.get(c) not in ("none", "oracle", "static")]
    viridis = colormaps["viridis"]
    for i, c in enumerate(statics):
        styles[c] = (viridis(0.85 * i / max(len(statics) - 1, 1)), "-", "o", 0.9)
    for i, c in enumerate(bold):
        styles[c] = (_BOLD_COLORS[i % len(_BOLD_COLORS)], "-", "s", 2.2)
    concurrencies = sorted({c for pts in data.tokens_per_s.values() for c, _ in pts})
    panels = ((data.tokens_per_s, "output tokens/s (higher is better)"),
              (data.tpot_ms_p50, "TPOT p50, ms (lower is better)"))
    legend: dict[str, Any] = {}
    for r, workload in enumerate(data.workloads):
        for col, (series, ylabel) in enumerate(panels):
            ax = axes[r][col]
            for config in data.configs:
                pts = series.get((workload, config))
                if not pts:
                    continue
                color, ls, marker, lw = styles.get(config) or styles.get(data.kinds.get(config, ""), styles["none"])
                xs, ys = zip(*pts, strict=True)
                line = ax.plot(xs, ys, color=color, ls=ls, marker=marker, markersize=7 if marker == "*" else 4,
                               lw=lw)[0]
                legend.setdefault(config, line)
            if len(concurrencies) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(concurrencies)
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xlabel("concurrency (requests in flight, closed loop)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{workload}: {'tokens/s' if col == 0 else 'TPOT p50'}", fontsize=10)
            ax.grid(alpha=0.3, which="both")
    ordered = [c for c in data.configs if c in legend]
    axes[0][1].legend([legend[c] for c in ordered], ordered, title="config (simulated)", fontsize=8, title_fontsize=8,
                      loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _finish(fig, f"[PREDICTED (simulate)] {data.title}", data.caption, path, width_in=12)


_BOLD_COLORS = ("tab:red", "tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:cyan")

_GROUP_COLORS = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                 "tab:cyan", "tab:red")


def _group_colors(data: StudyData) -> tuple[list[str], dict[str, str]]:
    """Groups in a fixed order ("no speculation" first, grey) with the same colour in every figure of a study."""
    groups = sorted({t.group for t in data.trials}, key=lambda g: (g != "no speculation", g))
    offset = 0 if groups and groups[0] == "no speculation" else 1
    return groups, {g: _GROUP_COLORS[(i + offset) % len(_GROUP_COLORS)] for i, g in enumerate(groups)}


#: Axis labels of the metrics the search stores as objective values.
METRIC_LABELS: dict[str, str] = {
    "output_tokens_per_s": "throughput (output tokens/s)",
    "throughput": "throughput (output tokens/s)",
    "goodput": "goodput (output tokens/s within the SLOs)",
    "tpot_ms_p50": "TPOT p50 (ms per output token)",
    "tpot_ms_p99": "TPOT p99 (ms per output token)",
    "ttft_ms_p50": "TTFT p50 (ms)",
    "ttft_ms_p99": "TTFT p99 (ms)",
    "latency": "latency: TPOT p50 (ms per output token)",
}


def metric_label(name: str) -> str:
    """Axis label with unit for an objective/metric name; unknown names get a unit guessed from the name."""
    return METRIC_LABELS.get(name, f"{name}{_unit(name)}")


def _unit(objective: str) -> str:
    name = objective.lower()
    if "throughput" in name or "tokens_per_s" in name:
        return ", output tokens/s"
    if "latency" in name or name.endswith("_ms") or "_ms_" in name or "tpot" in name or "ttft" in name:
        return ", ms"
    return ""


def _better(direction: str) -> str:
    return "higher is better" if direction == "maximize" else "lower is better"


def advantage_svg(data: AdvantageData) -> str:
    """P-EAGLE over EAGLE-3 against concurrency as an inline ``<svg>`` (text kept as text, so the page can be
    searched): a line per parallel drafting variant, every published ratio beside it (a range as a bar, filled on
    the search's GPU, hollow on another), each labelled with its source and GPU. Element ids: ``advantage-<variant
    index>`` for a line, ``published-<point id>-c<concurrency>`` for a published point."""
    plt = _pyplot()
    import matplotlib

    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    levels = sorted({c for points in data.series.values() for c, _ in points} | {p.concurrency for p in data.published})
    for i, (label, points) in enumerate(data.series.items()):
        points = sorted(points)
        (line,) = ax.plot([c for c, _ in points], [v for _, v in points], marker=_SHAPES[i % len(_SHAPES)],
                          linestyle="--" if label.endswith("*") else "-", label=f"{label} ({data.kind})")
        line.set_gid(f"advantage-{i}")
    sources = list(dict.fromkeys((p.label, p.gpu) for p in data.published))
    colors = matplotlib.colormaps["tab10"]
    for p in data.published:
        j = sources.index((p.label, p.gpu))
        color = colors((j + 3) % 10)
        x = p.concurrency * (1.06 ** (j + 1))  # beside the prediction at the same concurrency, not on it
        same_gpu = p.gpu == data.gpu
        mid = (p.low + p.high) / 2
        bar = ax.errorbar([x], [mid], yerr=[[mid - p.low], [p.high - mid]], fmt="s", color=color, capsize=3,
                          markerfacecolor=color if same_gpu else "white", markeredgecolor=color,
                          label=f"published: {p.label}, {p.gpu}")
        bar.lines[0].set_gid(f"published-{p.point_id}-c{p.concurrency}")
        for k, lines in enumerate(bar.lines[2]):
            lines.set_gid(f"published-{p.point_id}-c{p.concurrency}-range{k}")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency (clients)")
    ax.set_ylabel("tokens/s over EAGLE-3 at its best K")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    ax.set_title("\n".join(textwrap.wrap(data.title, 70)), fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "peagle-tune"}):
        fig.savefig(out, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]
