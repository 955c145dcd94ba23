"""`peagle-tune search`'s tables: the recommended config per concurrency, its step time, each drafter variant at
its best config (P-EAGLE vs EAGLE-3, 2 vs 4 layers), and the Pareto fronts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table

from autotune.cli._tables._cells import (
    QUEUE_LEGEND,
    RANGE_KEY,
    deployment_note,
    drafter_cell,
    drafters_legend,
    fmt,
    log_sigma_of,
    no_tail,
    pd_cell,
    plain_table,
    queue_notes,
    ranged,
    ranges_legend,
    seqs_cell,
    short_gpu,
    short_model,
    speedup_cell,
    speedup_rise_note,
    titled,
)
from autotune.search.objective import measurement_metrics
from autotune.selection import NO_TAIL

if TYPE_CHECKING:
    from autotune.search import ScenarioResult, SearchRun


def _same_variant(row: Any, r: ScenarioResult) -> bool:
    """Is per-drafter `row` the variant (drafter, layers, parallel drafting) of `r`'s recommended config?"""
    c, b = row.best_config, r.best.config
    return (c.drafter, c.drafter_layers, c.parallel_drafting) == (b.drafter, b.drafter_layers, b.parallel_drafting)


def _variant_row(r: ScenarioResult) -> Any:
    """The per-drafter row of the recommended config's drafter variant (for its speedup over EAGLE-3)."""
    return next((row for row in r.per_drafter if _same_variant(row, r)), None)


def _best_drafter(r: ScenarioResult, wide: bool, model: str) -> str:
    if not r.feasible:
        return "none meets the SLOs"
    return drafter_cell(r.best.config, r.hypothetical is not None, full=wide, model=model)


def launches(r: ScenarioResult, run: SearchRun) -> str:
    """Engine launches of a scenario: profiling + trials (a backend that predicts launches nothing)."""
    if not run.launches_engines:
        return "0"
    if r.profile_launches:
        return f"{r.engine_launches} ({r.profile_launches} prof.)"
    return str(r.engine_launches)


def results_title(run: SearchRun) -> str:
    kinds = "/".join(sorted({r.best.provenance.kind for r in run.results}))
    return (f"{short_model(run.model)} on {short_gpu(run.device)}, {run.workload}: best config per concurrency "
            f"({kinds})")


def results_table(run: SearchRun, *, wide: bool = False) -> Group:
    """The recommended config per concurrency: drafter, K, parallel drafting, max_num_seqs, tokens/s, TPOT and the
    speedups over no speculation (a predicted one with its range, in the cell when the table still fits in 80
    columns, else in a line below) and over EAGLE-3 at its best K. `wide` adds p99s, the speedup over the drafter's
    published K, trial counts and engine launches."""
    show_ttft = "ttft_ms_p99" in run.objective.slos
    tpot_p99 = wide or "tpot_ms_p99" in run.objective.slos
    ttft_p50 = run.objective.name in ("latency", "pareto")  # what a latency target may cost in queueing
    cols = ["c", "drafter", "PD", "K", "seqs", "tok/s", "TPOT"]
    cols += ["TPOT p99"] if tpot_p99 else []
    cols += ["TTFT"] if ttft_p50 else []
    cols += ["TTFT p99"] if show_ttft or wide else []
    cols += ["vs none", "vs E3"]
    cols += ["vs pub. K", "trials ok/fail", "launches"] if wide else []
    speedups = [(r, r.speedup_over(r.baseline), log_sigma_of(measurement_metrics(r.best))) for r in run.results]

    def build(with_range: bool) -> Table:
        table = plain_table(*cols, right=set(cols) - {"drafter", "PD"})
        for r, speedup, sigma in speedups:
            metrics = measurement_metrics(r.best)
            config = r.best.config
            variant = _variant_row(r)
            vs_e3 = "-"
            if variant is not None:
                vs_e3 = "ref" if variant.is_eagle3_reference else fmt(variant.speedup_vs_eagle3, ".2f", "x")
            row = [str(r.scenario.concurrency), _best_drafter(r, wide, run.model), pd_cell(config), str(config.k) if
                   config.speculative else "0", seqs_cell(config, r.scenario.concurrency),
                   fmt(r.best.output_tokens_per_s), fmt(metrics["tpot_ms_p50"], ".2f")]
            row += [fmt(metrics["tpot_ms_p99"], ".2f")] if tpot_p99 else []
            row += [fmt(metrics["ttft_ms_p50"], ".0f")] if ttft_p50 else []
            row += [fmt(metrics["ttft_ms_p99"], ".0f")] if show_ttft or wide else []
            row += [speedup_cell(speedup, sigma, with_range=with_range), vs_e3]
            if wide:
                pub = r.speedup_over(r.published)
                row += ["-" if r.published is None else f"{fmt(pub, '.2f', 'x')} (K={r.published.config.k})",
                        f"{r.n_complete}/{r.n_failed}", launches(r, run)]
            table.add_row(*row, style=None if r.feasible else "red")
        return table

    ranges = any(sigma and speedup is not None for _r, speedup, sigma in speedups)
    table, in_cell = ranged(build, wide, ranges)
    key = ("PD: parallel drafting; seqs: max_num_seqs; TPOT: ms per output token (median); "
           + ("TTFT: ms to the first token (median); " if ttft_p50 else "")
           + "vs none: over no speculation; vs E3: over the best EAGLE-3 head at its best K (ref: that head)."
           + (f" {RANGE_KEY}" if in_cell else ""))
    legend = None if wide else drafters_legend((r.best.config for r in run.results), run.model)
    queued = any(r.best.config.max_num_seqs < r.scenario.concurrency for r in run.results)
    out_of_cell = None if in_cell else ranges_legend((f"c={r.scenario.concurrency}", s, sigma)
                                                     for r, s, sigma in speedups)
    rise = speedup_rise_note((r.scenario.concurrency, s, measurement_metrics(r.best).get("step_breakdown_ms"))
                             for r, s, _sigma in speedups if r.feasible)
    queues = queue_notes((r.scenario.concurrency, r.best.config.max_num_seqs, measurement_metrics(r.best))
                         for r in run.results if r.feasible)
    return titled(results_title(run), table, legend, key, out_of_cell, rise, QUEUE_LEGEND if queued else None,
                  *queues, slo_note(run), *deployment_notes(run), *pick_notes(run))


def pick_notes(run: SearchRun) -> list[str]:
    """Per concurrency, the K that tied with the pick (`ScenarioResult.tie`) and the tuned config against its
    drafter's model-card K (`DrafterChoice.recommended_k`), when they say something."""
    out = []
    for r in run.results:
        if not r.feasible:
            continue
        c = f"c={r.scenario.concurrency}"
        if r.tie:
            out.append(f"{c}: {r.tie}.")
        pub = r.speedup_over(r.published)
        if r.published is not None and pub is not None and r.published.config.k != r.best.config.k:
            out.append(f"{c}: K={r.best.config.k} is {pub:.2f}x the model card's K={r.published.config.k} "
                       f"({r.published.provenance.kind}).")
    return out


def deployment_notes(run: SearchRun) -> list[str | None]:
    """What deployment the recommended figures were measured in (`deployment_note`), and the no-speculation
    baselines' where that differs from their scenario's recommended figure ("vs none" then compares two engines)."""
    best = deployment_note((f"c={r.scenario.concurrency}", r.best.provenance.deployment) for r in run.results)
    other = [(f"c={r.scenario.concurrency}", r.baseline.provenance.deployment) for r in run.results
             if r.baseline is not None and r.baseline.provenance.deployment != r.best.provenance.deployment]
    return [best, deployment_note(other, "vs none: baseline measured")]


def step_table(run: SearchRun) -> Group | None:
    """What each recommended config's predicted step time is made of (ms): the target's weights, its MoE experts,
    attention over the KV cache, the drafter, fixed overheads, the step, and the bound of the target pass (``--wide``;
    None when no result carries a breakdown, e.g. measured ones)."""
    parts = ("weights", "experts", "attention_kv", "drafter", "fixed_overhead")
    headers = ("weights", "experts", "attn/KV", "draft", "fixed")
    cols = ["c", "drafter", "K", *headers, "step", "bound"]
    table = plain_table(*cols, right=set(cols) - {"drafter", "bound"})
    shown = False
    for r in run.results:
        metrics = measurement_metrics(r.best)
        breakdown = metrics.get("step_breakdown_ms")
        if not isinstance(breakdown, Mapping):
            continue
        shown = True
        config = r.best.config
        table.add_row(str(r.scenario.concurrency), drafter_cell(config, r.hypothetical is not None, model=run.model),
                      str(config.k), *(fmt(breakdown.get(p), ".2f") for p in parts),
                      fmt(metrics.get("step_ms"), ".2f"), str(metrics.get("bound") or "-"))
    if not shown:
        return None
    return titled("Step time (ms, predicted) of each recommended config", table,
                  "attn/KV: attention over the KV cache; draft: the drafter's passes; fixed: launch, scheduling and "
                  "sampling overheads; bound: what limits the target pass (memory: bytes read; compute: FLOPs).")


def slo_note(run: SearchRun) -> str | None:
    """``SLO: TPOT p99 <= 12 ms; p99 = p50 (no tail modelled)`` for a search with SLOs (the label when its backend
    models no tail, so the p99 checked is the p50); None without SLOs."""
    slos = run.objective.describe_slos()
    if not slos:
        return None
    tail = any(no_tail(measurement_metrics(r.best)) for r in run.results)
    return f"SLO: {slos}" + (f"; {NO_TAIL}" if tail else "") + "."


def comparison_table(run: SearchRun, *, wide: bool = False) -> Group | None:
    """Per concurrency, the best config of every drafter variant searched (P-EAGLE vs EAGLE-3, 2 vs 4 layers,
    parallel drafting on/off) with tokens/s and speedups over no speculation and over EAGLE-3 at its best K.
    None when no scenario compared two or more variants."""
    if not any(len(r.per_drafter) > 1 for r in run.results):
        return None
    cols = ["c", "drafter", "PD", "K", "seqs", "tok/s", "vs none", "vs E3"]
    # Every variant was priced by the backend that priced the recommended config: its spread applies to each.
    sigmas = {id(r): log_sigma_of(measurement_metrics(r.best)) for r in run.results}

    def build(with_range: bool) -> Table:
        table = plain_table(*cols, right=set(cols) - {"drafter", "PD"})
        for i, r in enumerate(run.results):
            for j, row in enumerate(r.per_drafter):
                chosen = r.feasible and _same_variant(row, r)
                vs_e3 = "ref" if row.is_eagle3_reference else fmt(row.speedup_vs_eagle3, ".2f", "x")
                name = drafter_cell(row.best_config, row.hypothetical, full=wide, model=run.model)
                table.add_row(
                    str(r.scenario.concurrency) if j == 0 else "",
                    ("> " if chosen else "  ") + name,
                    pd_cell(row.best_config),
                    str(row.k),
                    seqs_cell(row.best_config, r.scenario.concurrency),
                    fmt(row.output_tokens_per_s),
                    speedup_cell(row.speedup_vs_no_spec, sigmas[id(r)], with_range=with_range),
                    vs_e3,
                    style="bold" if chosen else None,
                    end_section=j == len(r.per_drafter) - 1 and i < len(run.results) - 1,
                )
        return table

    table, in_cell = ranged(build, wide, any(sigmas.values()))
    configs = [row.best_config for r in run.results for row in r.per_drafter]
    notes = [None if wide else drafters_legend(configs, run.model)]
    if any(row.hypothetical for r in run.results for row in r.per_drafter):
        notes.append("* HYPOTHETICAL: no released checkpoint; acceptance derived from the paper's layer ablation "
                     "(predicted only, never served).")
    notes.append("> the recommended config." + (f" vs none {RANGE_KEY}" if in_cell else ""))
    if any(row.best_config.max_num_seqs < r.scenario.concurrency for r in run.results for row in r.per_drafter):
        notes.append(QUEUE_LEGEND)
    return titled("Each drafter at its best config (P-EAGLE vs EAGLE-3, 2 vs 4 layers)", table, *notes)


def pareto_table(r: ScenarioResult, *, wide: bool = False, model: str | None = None) -> Group:
    """A scenario's Pareto front (tokens/s vs TPOT p99), the recommended point marked."""
    cols = ["", "drafter", "PD", "K", "seqs", "tok/s", "TPOT p99", "TTFT p99", "trial"]
    table = plain_table(*cols, right=set(cols) - {"drafter", "PD", ""})
    for p in r.pareto:
        mark = ">" if r.feasible and p.config == r.best.config else ""
        table.add_row(
            mark,
            drafter_cell(p.config, p.hypothetical, full=wide, model=model),
            pd_cell(p.config),
            str(p.config.k),
            seqs_cell(p.config, r.scenario.concurrency),
            fmt(p.metrics.get("output_tokens_per_s")),
            fmt(p.metrics.get("tpot_ms_p99"), ".2f"),
            fmt(p.metrics.get("ttft_ms_p99"), ".0f"),
            str(p.trial),
        )
    notes = [QUEUE_LEGEND if any(p.config.max_num_seqs < r.scenario.concurrency for p in r.pareto) else None]
    if any(no_tail(p.metrics) for p in r.pareto):
        notes.append(f"TPOT p99, TTFT p99: {NO_TAIL}.")
    return titled(f"c={r.scenario.concurrency}: Pareto front ({len(r.pareto)} configs; > = recommended)", table, *notes)
