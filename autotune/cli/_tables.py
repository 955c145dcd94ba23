"""The CLI's rich tables: `peagle-tune search`'s results and Pareto fronts, and `peagle-tune show`'s generic
listings (one row per stored record, nested values summarised). Drawing only: the numbers come from the library."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from autotune.search import ScenarioResult, SearchRun, measurement_metrics
from autotune.spec import config_label

# ------------------------------------------------------------------------------------------------- peagle-tune show

#: Columns shown per listing, in order; records keep everything for --json.
COLUMNS: dict[str, tuple[str, ...]] = {
    "recommendations": ("id", "model", "gpu", "workload_name", "objective", "scenario", "best_config", "metrics",
                        "provenance", "created_at"),
    "trials": ("number", "status", "config", "values", "backend", "failure_reason"),
    "profiles": ("id", "model", "drafter", "device", "vllm_version", "workload_name", "max_k", "kind", "created_at"),
    "studies": (),
}


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("best_config", "config") and isinstance(value, dict):
        return config_label(value, layers=False)
    if key == "scenario" and isinstance(value, dict):
        return f"c={value.get('concurrency')}"
    if key == "metrics" and isinstance(value, dict):
        tps, sp = value.get("output_tokens_per_s"), value.get("speedup_vs_no_spec")
        return f"{tps:.1f} tok/s" + (f", {sp:.2f}x vs no spec" if sp else "") if tps else "-"
    if key == "provenance" and isinstance(value, dict):
        return str(value.get("kind", "?")) + f" ({value.get('backend')}, {value.get('device')})"
    if key == "values" and isinstance(value, dict):
        return ", ".join(f"{k}={v:.2f}" for k, v in value.items())
    if isinstance(value, dict | list):
        return json.dumps(value)[:60]
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)[:60]


def records_table(kind: str, rows: Sequence[dict[str, Any]]) -> Table:
    """Stored records of one `kind` (recommendations, trials, profiles, studies), one row each."""
    cols = COLUMNS.get(kind) or (tuple(rows[0].keys()) if rows else ())
    t = Table(title=f"{kind} ({len(rows)})")
    for c in cols:
        t.add_column(c)
    for row in rows:
        t.add_row(*(_cell(c, row.get(c)) for c in cols))
    if not rows:
        t.caption = "nothing stored yet: run `peagle-tune search --model MODEL`"
    return t


# ----------------------------------------------------------------------------------------------- peagle-tune search


def fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    """A number for a cell: ``-`` when there is none."""
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _best_label(r: ScenarioResult) -> str:
    label = r.best.config.label()
    if r.hypothetical:
        label += " [HYPOTHETICAL]"
    if not r.feasible:
        label = f"NONE meets the SLOs (closest: {label})"
    return label


def launches(r: ScenarioResult, run: SearchRun) -> str:
    """Engine launches of a scenario: profiling + trials (a backend that predicts launches nothing)."""
    if not run.launches_engines:
        return "0"
    if r.profile_launches:
        return f"{r.engine_launches} ({r.profile_launches} profiling)"
    return str(r.engine_launches)


def results_table(run: SearchRun) -> Table:
    """The best config per concurrency, with its figures, speedups, trial counts and launches."""
    kinds = {r.best.provenance.kind for r in run.results}
    title = f"{run.model} on {run.workload}: best config per concurrency ({run.objective.describe()}; " \
        f"{'/'.join(sorted(kinds))})"
    drafters = sorted({str(r.best.config.drafter) for r in run.results if r.best.config.drafter})
    caption = "trials: ok/failed/pruned" + (f"; drafters: {', '.join(drafters)}" if drafters else "")
    table = Table(title=title, caption=caption)
    show_ttft = "ttft_ms_p99" in run.objective.slos
    cols = ["conc.", "best config", "tok/s", "TPOT ms p50/p99"]
    cols += ["TTFT p99 ms"] if show_ttft else []
    cols += ["vs no spec", "vs pub. K", "trials", "launches"]
    for col in cols:
        table.add_column(col, justify="left" if col == "best config" else "right")
    for r in run.results:
        metrics = measurement_metrics(r.best)
        pub = r.speedup_over(r.published)
        pub_label = "-" if r.published is None else f"{fmt(pub, '.2f', 'x')} (K={r.published.config.k})"
        row = [
            str(r.scenario.concurrency),
            _best_label(r),
            fmt(r.best.output_tokens_per_s),
            f"{fmt(metrics['tpot_ms_p50'], '.2f')}/{fmt(metrics['tpot_ms_p99'], '.2f')}",
        ]
        row += [fmt(metrics["ttft_ms_p99"], ".0f")] if show_ttft else []
        row += [
            fmt(r.speedup_over(r.baseline), ".2f", "x"),
            pub_label,
            f"{r.n_complete}/{r.n_failed}/{r.n_pruned}",
            launches(r, run),
        ]
        table.add_row(*row)
    return table


def pareto_table(r: ScenarioResult) -> Table:
    """A scenario's Pareto front (tokens/s vs TPOT p99), the recommended point marked."""
    table = Table(title=f"c={r.scenario.concurrency}: Pareto front ({len(r.pareto)} configs; * = recommended)")
    for col in ("", "config", "tokens/s", "TPOT p99 ms", "TTFT p99 ms", "trial"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for p in r.pareto:
        mark = "*" if r.feasible and p.config == r.best.config else ""
        label = p.config.label() + (" [HYPOTHETICAL]" if p.hypothetical else "")
        table.add_row(
            mark,
            label,
            fmt(p.metrics.get("output_tokens_per_s")),
            fmt(p.metrics.get("tpot_ms_p99"), ".2f"),
            fmt(p.metrics.get("ttft_ms_p99"), ".0f"),
            str(p.trial),
        )
    return table
