"""The CLI's tables: `peagle-tune search`'s results, drafter comparison and Pareto fronts, and `peagle-tune show`'s
listings. Drawing only: the numbers come from the library.

Designed for an 80-column terminal: few, well-chosen columns with short names (a drafter's repository name, the
GPU's catalog key), no borders but the header rule, and the details (full ids, p99s, trial counts, provenance) below
the table or in the ``--wide`` columns. Cells never hold raw JSON.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement as RichMeasurement
from rich.table import Table
from rich.text import Text

from autotune.search import ScenarioResult, SearchRun, measurement_metrics
from autotune.search.objective import speedup_range
from autotune.selection import NO_TAIL, objective_label, slo_words
from autotune.spec import SpecConfig

#: Width the narrow tables are designed for (and checked against in tests/test_ux_tables.py).
NARROW = 80
#: Width `--wide` output is drawn at, whatever the terminal.
WIDE = 160

# --------------------------------------------------------------------------------------------------- short names


def fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    """A number for a cell: ``-`` when there is none."""
    return "-" if x is None else f"{x:{spec}}{suffix}"


def speedup_cell(speedup: float | None, log_sigma: float | None = None, *, with_range: bool = True) -> str:
    """A speedup for a cell: ``1.54x``, with a predicted one's range of one sigma each side (`log_sigma`, log scale)
    when `with_range`: ``1.54x (1.46-1.61)``."""
    if speedup is None:
        return "-"
    text = f"{speedup:.2f}x"
    if with_range and log_sigma:
        low, high = speedup_range(speedup, log_sigma)
        text += f" ({low:.2f}-{high:.2f})"
    return text


def log_sigma_of(metrics: Mapping[str, Any]) -> float | None:
    """The spread (one sigma, log scale) of predicted `metrics`; None for measured ones (they have none)."""
    value = metrics.get("prediction_log_sigma")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


#: The key's words for a speedup's range.
RANGE_KEY = "(low-high): predicted range, one sigma of the calibration."


def natural_width(table: Table) -> int:
    """The width `table` takes unwrapped, in columns."""
    probe = Console(width=10_000)
    return RichMeasurement.get(probe, probe.options, table).maximum


def _ranged(build: Callable[[bool], Table], wide: bool, ranges: bool) -> tuple[Table, bool]:
    """The table `build` draws with speedup ranges in their cells (`build(True)`) when there are `ranges` and it
    fits in `NARROW` columns (always with `wide`), else without (`build(False)`); and whether the cells hold them."""
    if ranges:
        table = build(True)
        if wide or natural_width(table) <= NARROW:
            return table, True
    return build(False), False


def ranges_legend(points: Iterable[tuple[str, float | None, float | None]]) -> str | None:
    """The ranges a table's cells had no room for: ``vs none, predicted range (one sigma): c=1 1.46-1.61; ...``
    from (label, speedup, log sigma); None when none is predicted."""
    parts = []
    for label, speedup, sigma in points:
        if speedup is not None and sigma:
            low, high = speedup_range(speedup, sigma)
            parts.append(f"{label} {low:.2f}-{high:.2f}")
    return f"vs none, predicted range (one sigma): {'; '.join(parts)}." if parts else None


#: Why the speedup over no speculation can rise with concurrency on an MoE target (`speedup_rise_note`).
RISE_NOTE = "vs none rises with c: big batches read MoE experts anyway; drafts reuse them."


def speedup_rise_note(points: Iterable[tuple[int, float | None, Mapping[str, Any] | None]]) -> str | None:
    """`RISE_NOTE` when the speedup over no speculation, as shown (two decimals), is higher at some concurrency than
    at a lower one and the higher one's step reads MoE experts (its ``step_breakdown_ms`` has ``experts`` > 0);
    from (concurrency, speedup, step breakdown) per result. None otherwise (a dense model, measured figures)."""
    shown = sorted((c, round(s, 2), b) for c, s, b in points if s is not None and math.isfinite(s))
    for i, (_c, low, _b) in enumerate(shown):
        for _c2, high, breakdown in shown[i + 1:]:
            experts = (breakdown or {}).get("experts")
            if high > low and isinstance(experts, int | float) and experts > 0:
                return RISE_NOTE
    return None


def short_model(name: str | None) -> str:
    """A model id without its organisation: ``openai/gpt-oss-120b`` -> ``gpt-oss-120b`` (a local path: its folder)."""
    if not name:
        return "-"
    return name.rstrip("/").rsplit("/", 1)[-1]


def short_gpu(device: str | None) -> str:
    """A device as its catalog key (``NVIDIA H200 SXM 141GB`` -> ``h200``); ``cpu`` and unknown names unchanged."""
    if not device:
        return "-"
    if device == "cpu":
        return device
    from autotune.catalogs import get_gpu
    from autotune.errors import PeagleError

    try:
        return get_gpu(device).key
    except PeagleError:
        return device


#: Longest drafter or model name a narrow table shows; a longer one is cut in the middle (the legend has it whole).
MAX_NAME = 20


def cut_middle(text: str, width: int, mark: str = "..") -> str:
    """`text` if it fits in `width` characters, else its start and end around `mark`: never wrapped, still
    recognisable (``SGLang-EAGL..SpecForge``)."""
    if len(text) <= width:
        return text
    keep = max(width - len(mark), 2)
    return text[: (keep + 1) // 2] + mark + text[len(text) - keep // 2:]


def _catalog_names(name: str, kind: str) -> tuple[str | None, tuple[str, ...]]:
    """(the catalog id, its names) of a catalog model or drafter called `name` (id or alias, any case); (None, ())
    when the catalog has none (a local path, an unknown id). Never reads a directory."""
    from autotune import catalogs

    names = catalogs.model_names() if kind == "model" else catalogs.drafter_names()
    wanted = name.strip().lower()
    if kind == "model":  # model_names maps to the short name: find the id whose short name that is
        short = next((v for k, v in names.items() if k.lower() == wanted), None)
        ids = [m.name for m in catalogs.list_models() if m.name.rsplit("/", 1)[-1] == short]
        ident = ids[0] if ids else None
        return ident, tuple(k for k, v in names.items() if v == short) if ident else ()
    ident = next((v for k, v in names.items() if k.lower() == wanted), None)
    return ident, tuple(k for k, v in names.items() if v == ident) if ident else ()


def _strip_target(name: str, targets: Iterable[str]) -> str:
    """`name` without a leading target model name and its separator (``gpt-oss-120b-p-eagle`` -> ``p-eagle``)."""
    for target in sorted(targets, key=len, reverse=True):
        if target and len(name) > len(target) + 1 and name.lower().startswith(target.lower()) \
                and name[len(target)] in "-_.":
            return name[len(target) + 1:]
    return name


def model_alias(name: str | None) -> str:
    """A model as a narrow table names it: its shortest catalog name without organisation (``Qwen/Qwen3-Coder-30B-
    A3B-Instruct`` -> ``qwen3-coder-30b``), else its repository name or folder, cut in the middle beyond `MAX_NAME`."""
    if not name:
        return "-"
    _ident, names = _catalog_names(name, "model")
    plain = [n for n in names if "/" not in n and ":" not in n]
    return cut_middle(min([short_model(name), *plain], key=len), MAX_NAME)


def drafter_name(drafter: str | None, model: str | None = None) -> str:
    """A drafter as a narrow table names it (the full id goes in the legend, `drafters_legend`): its shortest name
    (repository name or catalog alias) without organisation, ``:N-layer`` (the layers are shown beside it) or a
    leading target model name (`model`, else the catalog's target): ``amazon/gpt-oss-120b-p-eagle`` -> ``p-eagle``,
    ``lmsys/SGLang-EAGLE3-Qwen3-Coder-30B-A3B-Instruct-SpecForge`` -> ``eagle3``; cut in the middle beyond
    `MAX_NAME` characters, so a cell never wraps mid-word."""
    if not drafter:
        return "-"
    full = re.sub(r":\d+-layer$", "", drafter.rstrip("/"))
    base = full.rsplit("/", 1)[-1]
    ident, aliases = _catalog_names(full, "drafter")
    models = [model] if model else []
    if ident is not None:
        from autotune.catalogs import list_drafters

        models += [d.target for d in list_drafters(include_hypothetical=True) if d.name == ident and d.target]
    targets = [n for m in models for n in (short_model(m), *_catalog_names(m, "model")[1])]
    names = [base, *(a.rsplit("/", 1)[-1] for a in aliases)]
    return cut_middle(min((_strip_target(n, targets) for n in names), key=len), MAX_NAME)


def drafter_cell(config: SpecConfig, hypothetical: bool = False, *, full: bool = False,
                 model: str | None = None) -> str:
    """``p-eagle 4L`` (see `drafter_name`; ``*`` marks a hypothetical variant); ``no speculation`` for none. `full`
    keeps the whole id (``--wide``)."""
    if not config.speculative:
        return "no speculation"
    name = re.sub(r":\d+-layer$", "", str(config.drafter)) if full else drafter_name(config.drafter, model)
    layers = f" {config.drafter_layers}L" if config.drafter_layers else ""
    return f"{name}{layers}{'*' if hypothetical else ''}"


def drafters_legend(configs: Iterable[SpecConfig | None], model: str | None = None) -> str | None:
    """``Drafters: p-eagle = amazon/gpt-oss-120b-p-eagle; ...`` for the short names a table shows (None: none)."""
    seen: dict[str, str] = {}
    for c in configs:
        if c is not None and c.speculative and c.drafter:
            full = re.sub(r":\d+-layer$", "", str(c.drafter))
            seen.setdefault(drafter_name(full, model), full)
    if not seen:
        return None
    return "Drafters: " + "; ".join(f"{short} = {full}" if short != full else full for short, full in seen.items())


#: The marker of a max_num_seqs below the concurrency (`seqs_cell`) and its legend line.
QUEUE_MARK = "q"
QUEUE_LEGEND = ("q: max_num_seqs below the concurrency: requests queue for a slot (TTFT grows; how a latency target "
                "is met).")


def seqs_cell(config: SpecConfig, concurrency: int | None) -> str:
    """max_num_seqs, marked `QUEUE_MARK` when below `concurrency` (requests wait for a slot): ``32q``."""
    queued = concurrency is not None and config.max_num_seqs < concurrency
    return f"{config.max_num_seqs}{QUEUE_MARK if queued else ''}"


def no_tail(metrics: Mapping[str, Any]) -> bool:
    """Were the p99s of these figures filled from the p50s (a backend that models no tail)?"""
    return bool(metrics.get("p99_from_p50"))


def pd_cell(config: SpecConfig) -> str:
    """Parallel drafting: ``on``/``off``; ``-`` without speculation."""
    if not config.speculative:
        return "-"
    return "on" if config.parallel_drafting else "off"


def config_text(config: SpecConfig | Mapping[str, Any], hypothetical: bool = False) -> str:
    """A config in words, naming the drafter (as `autotune.export.describe` does):
    ``amazon/gpt-oss-120b-p-eagle (4L), parallel drafting, K=4, max_num_seqs=64``."""
    if not isinstance(config, SpecConfig):
        raw = dict(config)
        try:
            config = SpecConfig.from_dict(raw)
        except Exception:  # a config another version stored: show what it is
            return ", ".join(f"{k}={v}" for k, v in raw.items())
    if not config.speculative:
        return f"no speculation, max_num_seqs={config.max_num_seqs}"
    mode = "parallel drafting" if config.parallel_drafting else "sequential drafting"
    layers = f" ({config.drafter_layers}L{', HYPOTHETICAL' if hypothetical else ''})" if config.drafter_layers else ""
    tokens = f", max_num_batched_tokens={config.max_num_batched_tokens}" if config.max_num_batched_tokens else ""
    return f"{config.drafter}{layers}, {mode}, K={config.k}, max_num_seqs={config.max_num_seqs}{tokens}"


def when(value: Any) -> str:
    """A stored timestamp as ``2026-12-03 09:05`` (UTC)."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")
        except ValueError:
            return value[:16]
    return "-"


def _table(*columns: str, right: Iterable[str] = ()) -> Table:
    """A borderless table (a rule under the header only): every column counts toward 80, none on the frame. Only
    the drafter column may wrap."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    right = set(right)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", no_wrap=c != "drafter", overflow="fold")
    return t


def titled(title: str, table: RenderableType, *notes: str | None) -> Group:
    """`table` under its title, with notes below (a title is its own line, so it never wraps inside a narrow
    table)."""
    parts: list[RenderableType] = [Text(title, style="bold"), table]
    parts += [Text(n, style="dim") for n in notes if n]
    return Group(*parts)


# ----------------------------------------------------------------------------------------------- peagle-tune search


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
        table = _table(*cols, right=set(cols) - {"drafter", "PD"})
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
    table, in_cell = _ranged(build, wide, ranges)
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
    return titled(results_title(run), table, legend, key, out_of_cell, rise, QUEUE_LEGEND if queued else None,
                  slo_note(run))


def step_table(run: SearchRun) -> Group | None:
    """What each recommended config's predicted step time is made of (ms): the target's weights, its MoE experts,
    attention over the KV cache, the drafter, fixed overheads, the step, and the bound of the target pass (``--wide``;
    None when no result carries a breakdown, e.g. measured ones)."""
    parts = ("weights", "experts", "attention_kv", "drafter", "fixed_overhead")
    headers = ("weights", "experts", "attn/KV", "draft", "fixed")
    cols = ["c", "drafter", "K", *headers, "step", "bound"]
    table = _table(*cols, right=set(cols) - {"drafter", "bound"})
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
        table = _table(*cols, right=set(cols) - {"drafter", "PD"})
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

    table, in_cell = _ranged(build, wide, any(sigmas.values()))
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
    table = _table(*cols, right=set(cols) - {"drafter", "PD", ""})
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


# ------------------------------------------------------------------------------------------------- peagle-tune show


def _config(row: Mapping[str, Any], key: str) -> SpecConfig | None:
    value = row.get(key)
    if not isinstance(value, Mapping):
        return None
    try:
        return SpecConfig.from_dict(dict(value))
    except Exception:  # written by another version: shown as "-" (--json has it whole)
        return None


def _level(row: Mapping[str, Any]) -> int | None:
    """A stored recommendation's concurrency (None: an open-loop or unreadable scenario)."""
    level = (row.get("scenario") or {}).get("concurrency")
    return level if isinstance(level, int) else None


def _k(config: SpecConfig | None) -> str:
    if config is None:
        return "-"
    return str(config.k) if config.speculative else "0"


def recommendations_view(rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> RenderableType:
    """Stored recommendations, one small table per model, GPU, workload, objective and kind of figures (predicted or
    measured), newest group first: id, concurrency, drafter, PD, K, max_num_seqs, tokens/s, speedup over no
    speculation, date."""
    if not rows:
        return Text("No recommendations stored yet: run `peagle-tune search --model MODEL`.")
    groups: dict[tuple[str, str, str, str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        kind = str((row.get("provenance") or {}).get("kind", "unknown"))
        key = (str(row.get("model")), str(row.get("gpu")), str(row.get("workload_name")), objective_label(row), kind)
        groups.setdefault(key, []).append(row)
    parts: list[RenderableType] = []
    cols = ["#", "c", "drafter", "PD", "K", "seqs", "tok/s", "vs none", "stored"]
    hypothetical_seen = False
    for (model, gpu, workload, objective, kind), items in groups.items():
        title = f"{model if wide else model_alias(model)} on {gpu if wide else short_gpu(gpu)}, {workload}, " \
            f"{objective} ({kind})"
        ordered = sorted(items, key=lambda r: (-int((r.get("scenario") or {}).get("concurrency") or 0),
                                               -int(r["id"])))
        configs = [_config(row, "best_config") for row in ordered]
        speedups = []
        for row in ordered:
            metrics = row.get("metrics") or {}
            speedup = metrics.get("speedup_vs_no_spec")
            speedups.append((float(speedup) if isinstance(speedup, int | float) else None, log_sigma_of(metrics)))
        queued = False

        for row, config in zip(ordered, configs, strict=True):
            hypothetical_seen |= bool((row.get("metrics") or {}).get("hypothetical_drafter"))
            level = _level(row)
            queued |= config is not None and level is not None and config.max_num_seqs < level
        build = functools.partial(_recommendations_table, cols, ordered, configs, speedups, model, wide)
        table, in_cell = _ranged(build, wide, any(sigma and s is not None for s, sigma in speedups))
        out_of_cell = None if in_cell else ranges_legend(
            (f"#{row.get('id')}", s, sigma) for row, (s, sigma) in zip(ordered, speedups, strict=True))
        rise = speedup_rise_note(
            (level, s, (row.get("metrics") or {}).get("step_breakdown_ms"))
            for row, (s, _sigma) in zip(ordered, speedups, strict=True) if (level := _level(row)) is not None)
        slo = slo_words(items[0])
        parts.append(titled(title, table, None if wide else drafters_legend(configs, model),
                            f"vs none {RANGE_KEY}" if in_cell else out_of_cell, rise,
                            f"SLO: {slo}." if slo else None, QUEUE_LEGEND if queued else None))
        parts.append(Text(""))
    footer = "Export one with `peagle-tune export --recommendation ID` (or --concurrency C)."
    if hypothetical_seen:
        footer += " * = HYPOTHETICAL drafter (no checkpoint)."
    parts.append(Text(footer, style="dim"))
    return Group(*parts)


def _recommendations_table(cols: Sequence[str], rows: Sequence[Mapping[str, Any]], configs: Sequence[SpecConfig | None],
                           speedups: Sequence[tuple[float | None, float | None]], model: str, wide: bool,
                           with_range: bool) -> Table:
    """One group of `recommendations_view`: a row per stored recommendation (speedup and its spread in `speedups`)."""
    table = _table(*cols, right={"#", "c", "K", "seqs", "tok/s", "vs none"})
    for row, config, (speedup, sigma) in zip(rows, configs, speedups, strict=True):
        metrics = row.get("metrics") or {}
        hypothetical = bool(metrics.get("hypothetical_drafter"))
        tps = metrics.get("output_tokens_per_s")
        level = _level(row)
        table.add_row(
            str(row.get("id")),
            str((row.get("scenario") or {}).get("concurrency", "-")),
            drafter_cell(config, hypothetical, full=wide, model=model) if config else "-",
            pd_cell(config) if config else "-",
            _k(config),
            seqs_cell(config, level) if config else "-",
            fmt(tps) if isinstance(tps, int | float) else "-",
            speedup_cell(speedup, sigma, with_range=with_range),
            when(row.get("created_at")) if wide else when(row.get("created_at"))[:10],
        )
    return table


def trials_view(study: str, rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> RenderableType:
    """The trials of one study: number, status, drafter, PD, K, max_num_seqs, objective values; failure reasons
    below the table (whole with --wide)."""
    if not rows:
        return Text(f"Study {study!r} has no trials stored. `peagle-tune show --studies` lists the studies.")
    names: list[str] = []
    for row in rows:
        for name in row.get("values") or {}:
            if name not in names:
                names.append(name)
    headers = [_value_header(n) for n in names]
    cols = ["#", "status", "drafter", "PD", "K", "seqs", *headers]
    table = _table(*cols, right={"#", "K", "seqs", *headers})
    failures = []
    configs = []
    model = str(rows[0].get("model") or "")
    for row in rows:
        config = _config(row, "config")
        configs.append(config)
        values = row.get("values") or {}
        table.add_row(
            str(row.get("number")),
            str(row.get("status")),
            drafter_cell(config, full=wide, model=model) if config else "-",
            pd_cell(config) if config else "-",
            _k(config),
            str(config.max_num_seqs) if config else "-",
            *(fmt(values.get(n), ".2f" if "_ms" in n or n == "latency" else ".1f") for n in names),
        )
        if row.get("failure_reason"):
            failures.append((row.get("number"), str(row["failure_reason"])))
    kinds = sorted({str((row.get("provenance") or {}).get("kind", "unknown")) for row in rows})
    title = f"{len(rows)} trials ({'/'.join(kinds)}) of study\n  {study if wide else study_name(study)}"
    parts: list[RenderableType] = [titled(title, table, None if wide else drafters_legend(configs, model))]
    if failures:
        parts.append(Text("Failed trials:"))
        for number, reason in failures:
            parts.append(Text(f"  #{number}: {reason if wide else _cut(reason, 200)}"))
    return Group(*parts)


def _value_header(name: str) -> str:
    return {"output_tokens_per_s": "tok/s", "tpot_ms_p50": "TPOT p50", "tpot_ms_p99": "TPOT p99",
            "ttft_ms_p99": "TTFT p99", "throughput": "tok/s", "latency": "TPOT p50"}.get(name, name)


def _cut(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def profiles_view(rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> RenderableType:
    """Stored profiles: id, model, drafter, device, kind (measured/live), K_max, workload, date."""
    if not rows:
        return Text("No profiles stored yet: measure one with `peagle-tune profile --model M --drafter D "
                    "--workload W` (one engine launch per drafter).")
    cols = ["#", "model", "drafter", "device", "kind", "K max", "workload", "stored"]
    table = _table(*cols, right={"#", "K max"})
    for row in rows:
        drafter = row.get("drafter")
        table.add_row(
            str(row.get("id")),
            str(row.get("model")) if wide else short_model(row.get("model")),
            str(drafter) if wide else drafter_name(drafter),
            str(row.get("device")) if wide else short_gpu(row.get("device")),
            str(row.get("kind")),
            str(row.get("max_k")),
            str(row.get("workload_name") or "-"),
            when(row.get("created_at")) if wide else when(row.get("created_at"))[:10],
        )
    return titled(f"Profiles ({len(rows)})", table)


def studies_view(rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> RenderableType:
    """Studies, each name whole on its own line (so it can be copied into ``show --trials``), its counts and best
    value below it."""
    if not rows:
        return Text("No studies stored yet: run `peagle-tune search --model MODEL`.")
    lines: list[RenderableType] = [Text(f"Studies ({len(rows)}); list one's trials with `peagle-tune show --trials "
                                        "STUDY`:", style="bold")]
    for row in rows:
        best = row.get("best_values") or {}
        numbers = row.get("best_trial_numbers") or {}
        bests = ", ".join(
            f"{fmt(v, '.2f' if '_ms' in k or k == 'latency' else '.1f')} {_value_header(k)} "
            f"(#{numbers.get(k, '?')})"
            for k, v in best.items()
        )
        counts = f"{row.get('n_trials')} trials: {row.get('n_complete')} ok, {row.get('n_failed')} failed"
        counts += f", {row.get('n_running')} running" if row.get("n_running") else ""
        detail = f"    {counts}; best {bests or '-'}"
        if wide:
            detail += f"; {', '.join(row.get('models') or ())}; last trial {when(row.get('last_created_at'))}"
        name = str(row.get("study"))
        lines.append(Text(f"  {name if wide else study_name(name)}", no_wrap=True, overflow="ignore"))
        lines.append(Text(detail, style="dim"))
    if not wide and any(study_name(str(row.get("study"))) != str(row.get("study")) for row in rows):
        lines.append(Text("Long names are cut in the middle (`show --trials` takes them as shown); --wide shows them "
                          "whole.", style="dim"))
    return Group(*lines)


def study_name(name: str, width: int = NARROW - 2) -> str:
    """A study name on one line of an 80-column table, indented by two: whole if it fits, else cut in the middle
    with ``...`` (`peagle-tune show --trials` accepts it so: the start and end name one study)."""
    return cut_middle(name, width, "...")


# --------------------------------------------------------------------------------------- choosing a recommendation


def candidates_table(entries: Sequence[Any], *, wide: bool = False) -> Group:
    """Recommendations that match a selection and differ (`autotune.selection.Ambiguous`): id, model (a column when
    they are of several models, else in the title), GPU, workload, objective with SLOs, concurrency, config and
    tokens/s, within 80 columns, the full names in legends."""
    models = list(dict.fromkeys(str(e.rec.model) for e in entries))
    cols = ["#", *(["model"] if len(models) > 1 else []), "gpu", "workload", "objective", "c", "config", "tok/s"]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for c in cols:
        table.add_column(c, justify="right" if c in ("#", "c", "tok/s") else "left", no_wrap=c != "config",
                         overflow="fold")
    configs: list[SpecConfig | None] = []
    for e in entries:
        rec = e.rec
        config = _config({"best_config": rec.best_config}, "best_config")
        configs.append(config)
        model = str(rec.model)
        tps = e.tokens_per_s
        table.add_row(
            str(e.id),
            *([model if wide else model_alias(model)] if len(models) > 1 else []),
            e.gpu,
            e.workload if wide else cut_middle(e.workload, MAX_NAME),
            e.objective,
            "-" if e.concurrency is None else str(e.concurrency),
            config_cell(config, wide=wide, model=model) if config else "-",
            fmt(tps) if tps is not None else "-",
        )
    aliases = {model_alias(m): m for m in models}
    legend_models = None if wide else "; ".join(f"{a} = {m}" for a, m in aliases.items() if a != m)
    title = "Stored recommendations that match" + ("" if len(models) > 1 else f", for {models[0] if models else '-'}")
    key = "config: drafter, layers, PD (parallel drafting) or seq, depth K, x max_num_seqs."
    return titled(f"{title}:", table, f"Models: {legend_models}" if legend_models and len(models) > 1 else None,
                  None if wide else drafters_legend(configs), key)


def config_cell(config: SpecConfig, *, wide: bool = False, model: str | None = None) -> str:
    """A config in one short cell: ``p-eagle 4L PD K=4 x64`` (PD: parallel drafting; seq: sequential; x: max_num_seqs);
    ``none x64`` without speculation."""
    if not config.speculative:
        return f"none x{config.max_num_seqs}"
    name = drafter_cell(config, full=wide, model=model)
    return f"{name} {'PD' if config.parallel_drafting else 'seq'} K={config.k} x{config.max_num_seqs}"
