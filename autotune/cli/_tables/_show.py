"""`peagle-tune show`'s listings (recommendations, trials, profiles, studies) and the table of recommendations a
selection matched when it must choose (`autotune.selection.Ambiguous`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from autotune.cli._tables._cells import (
    MAX_NAME,
    NARROW,
    QUEUE_LEGEND,
    RANGE_KEY,
    config_cell,
    cut_middle,
    deployment_note,
    drafter_cell,
    drafter_name,
    drafters_legend,
    fmt,
    log_sigma_of,
    model_alias,
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
    stored_config,
    titled,
    when,
)
from autotune.selection import objective_label, slo_words
from autotune.spec import SpecConfig


def _level(row: Mapping[str, Any]) -> int | None:
    """A stored recommendation's concurrency (None: an open-loop or unreadable scenario)."""
    level = (row.get("scenario") or {}).get("concurrency")
    return level if isinstance(level, int) else None


def _k(config: SpecConfig | None) -> str:
    if config is None:
        return "-"
    return str(config.k) if config.speculative else "0"


def recommendations_view(rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> RenderableType:
    """Stored recommendations, one small table per model, GPU, workload, objective, kind of figures (predicted or
    measured) and deployment measured in (named below the table), newest group first: id, concurrency, drafter, PD,
    K, max_num_seqs, tokens/s, speedup over no speculation, date."""
    from autotune.export import pick_lines

    if not rows:
        return Text("No recommendations stored yet: run `peagle-tune search --model MODEL`.")
    groups: dict[tuple[str, str, str, str, str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        provenance = row.get("provenance") or {}
        kind = str(provenance.get("kind", "unknown"))
        key = (str(row.get("model")), str(row.get("gpu")), str(row.get("workload_name")), objective_label(row), kind,
               str(provenance.get("deployment") or ""))
        groups.setdefault(key, []).append(row)
    parts: list[RenderableType] = []
    cols = ["#", "c", "drafter", "PD", "K", "seqs", "tok/s", "vs none", "stored"]
    hypothetical_seen = False
    for (model, gpu, workload, objective, kind, deployment), items in groups.items():
        title = f"{model if wide else model_alias(model)} on {gpu if wide else short_gpu(gpu)}, {workload}, " \
            f"{objective} ({kind})"
        ordered = sorted(items, key=lambda r: (-int((r.get("scenario") or {}).get("concurrency") or 0),
                                               -int(r["id"])))
        configs = [stored_config(row, "best_config") for row in ordered]
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
        latency = objective.split("-")[0] in ("latency", "goodput")  # what TPOT and TTFT they were chosen for
        # At 80 columns the latency figures take the date's room (--wide shows both).
        group_cols = [*cols[:7], "TPOT", "p99", "TTFT", "p99", *cols[7:(None if wide else -1)]] if latency else cols
        build = functools.partial(_recommendations_table, group_cols, ordered, configs, speedups, model, wide)
        table, in_cell = ranged(build, wide, any(sigma and s is not None for s, sigma in speedups))
        out_of_cell = None if in_cell else ranges_legend(
            (f"#{row.get('id')}", s, sigma) for row, (s, sigma) in zip(ordered, speedups, strict=True))
        rise = speedup_rise_note(
            (level, s, (row.get("metrics") or {}).get("step_breakdown_ms"))
            for row, (s, _sigma) in zip(ordered, speedups, strict=True) if (level := _level(row)) is not None)
        slo = slo_words(items[0])
        latency_key = ("TPOT: ms per output token, TTFT: ms to the first token; median, then p99." if latency
                       else None)
        parts.append(titled(title, table, None if wide else drafters_legend(configs, model), latency_key,
                            f"vs none {RANGE_KEY}" if in_cell else out_of_cell, rise,
                            f"SLO: {slo}." if slo else None, QUEUE_LEGEND if queued else None,
                            *queue_notes((level, config.max_num_seqs, row.get("metrics") or {})
                                         for row, config in zip(ordered, configs, strict=True)
                                         if config is not None and (level := _level(row)) is not None),
                            deployment_note([("", deployment)]),
                            *(f"#{row.get('id')}: {line}" for row in ordered for line in pick_lines(row))))
        parts.append(Text(""))
    footer = "Export one with `peagle-tune export --recommendation ID` (or --concurrency C)."
    if hypothetical_seen:
        footer += " * = HYPOTHETICAL drafter (no checkpoint)."
    parts.append(Text(footer, style="dim"))
    return Group(*parts)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _recommendations_table(cols: Sequence[str], rows: Sequence[Mapping[str, Any]], configs: Sequence[SpecConfig | None],
                           speedups: Sequence[tuple[float | None, float | None]], model: str, wide: bool,
                           with_range: bool) -> Table:
    """One group of `recommendations_view`: a row per stored recommendation (speedup and its spread in `speedups`)."""
    table = plain_table(*cols, right={"#", "c", "K", "seqs", "tok/s", "TPOT", "p99", "TTFT", "vs none"})
    latency = "TPOT" in cols
    for row, config, (speedup, sigma) in zip(rows, configs, speedups, strict=True):
        metrics = row.get("metrics") or {}
        hypothetical = bool(metrics.get("hypothetical_drafter"))
        tps = metrics.get("output_tokens_per_s")
        level = _level(row)
        cells = [
            str(row.get("id")),
            str((row.get("scenario") or {}).get("concurrency", "-")),
            drafter_cell(config, hypothetical, full=wide, model=model) if config else "-",
            pd_cell(config) if config else "-",
            _k(config),
            seqs_cell(config, level) if config else "-",
            fmt(tps) if isinstance(tps, int | float) else "-",
        ]
        if latency:
            cells += [fmt(_number(metrics.get(key)), spec) for key, spec in (
                ("tpot_ms_p50", ".2f"), ("tpot_ms_p99", ".2f"), ("ttft_ms_p50", ".0f"), ("ttft_ms_p99", ".0f"))]
        cells += [speedup_cell(speedup, sigma, with_range=with_range)]
        if "stored" in cols:
            cells += [when(row.get("created_at")) if wide else when(row.get("created_at"))[:10]]
        table.add_row(*cells)
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
    table = plain_table(*cols, right={"#", "K", "seqs", *headers})
    failures = []
    configs = []
    model = str(rows[0].get("model") or "")
    for row in rows:
        config = stored_config(row, "config")
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
    numbers = sorted(int(n) for n in (row.get("number") for row in rows) if isinstance(n, int))
    gaps = ("#: the search's trial number; a number not listed proposed a config the study had already tried, "
            "which was not run again." if numbers and numbers[-1] - numbers[0] + 1 > len(numbers) else None)
    parts: list[RenderableType] = [titled(title, table, None if wide else drafters_legend(configs, model), gaps)]
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
    table = plain_table(*cols, right={"#", "K max"})
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
        kind = _study_kind(row)
        tops = ", ".join(f"#{numbers.get(k, '?')} {_value_text(k, v)}" for k, v in best.items())
        counts = f"{row.get('n_trials')} trials ({kind}): {row.get('n_complete')} ok, {row.get('n_failed')} failed"
        counts += f", {row.get('n_running')} running" if row.get("n_running") else ""
        detail = f"    {counts}; top trial {tops or '-'}"
        rec = row.get("recommendation")
        if isinstance(rec, Mapping):
            metrics = rec.get("metrics") or {}
            config = stored_config(rec, "best_config")
            figures = [_value_text(k, metrics.get(k)) for k in ("output_tokens_per_s", "tpot_ms_p50")
                       if isinstance(metrics.get(k), int | float)]
            detail += f"\n    recommended #{rec.get('id')}: K={_k(config)}, {', '.join(figures) or '-'}"
        else:
            detail += "\n    no recommendation stored from it"
        if wide:
            detail += f"; {', '.join(row.get('models') or ())}; last trial {when(row.get('last_created_at'))}"
        name = str(row.get("study"))
        lines.append(Text(f"  {name if wide else study_name(name)}", no_wrap=True, overflow="ignore"))
        lines.append(Text(detail, style="dim"))
    lines.append(Text("recommended: the search's pick (figures within their spread tie and go to the simpler "
                      "config); top trial: the single best figure.", style="dim"))
    if not wide and any(study_name(str(row.get("study"))) != str(row.get("study")) for row in rows):
        lines.append(Text("Long names are cut in the middle (`show --trials` takes them as shown); --wide shows them "
                          "whole.", style="dim"))
    return Group(*lines)


def _value_text(name: str, value: Any) -> str:
    """An objective value with its unit: ``9805.0 tok/s``, ``11.07 ms TPOT p99``."""
    if not isinstance(value, int | float):
        return "-"
    if name in ("output_tokens_per_s", "throughput"):
        return f"{value:.1f} tok/s"
    return f"{value:.2f} ms {_value_header(name)}" if "_ms" in name or name == "latency" else f"{value:g} {name}"


def _study_kind(row: Mapping[str, Any]) -> str:
    """Whether a study's figures are measured or predicted, from its recommendation or its name's backend."""
    rec = row.get("recommendation")
    if isinstance(rec, Mapping) and rec.get("kind"):
        return str(rec["kind"])
    return str(row.get("kind") or "measured or predicted: see --trials")


def study_name(name: str, width: int = NARROW - 2) -> str:
    """A study name on one line of an 80-column table, indented by two: whole if it fits, else cut in the middle
    with ``...`` (`peagle-tune show --trials` accepts it so: the start and end name one study)."""
    return cut_middle(name, width, "...")


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
        config = stored_config({"best_config": rec.best_config}, "best_config")
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
