"""What every table of the CLI shares: cells (numbers, speedups with their range, short model, GPU and drafter
names, configs), legends, and the borderless table drawn within 80 columns."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement as RichMeasurement
from rich.table import Table
from rich.text import Text

from autotune.search.objective import speedup_range
from autotune.spec import SpecConfig

#: Width the narrow tables are designed for (and checked against in tests/test_ux_tables.py).
NARROW = 80


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


def deployment_note(figures: Iterable[tuple[str, str | None]], what: str = "Measured") -> str | None:
    """The deployment figures were measured in (`autotune.measurement.Provenance.deployment`), as a note under a
    table: ``(label, deployment)`` per figure, e.g. ``("c=8", "vllm serve (async, V2)")``; None when no figure records
    one (predictions, rows stored before it was). One deployment: "Measured in vllm serve (async, V2)."; several:
    each with the labels of its figures, "Measured in peagle-tune serve (sync, V1) (c=1, c=8); vllm serve (sync,
    V1) (c=64)."
    """
    by: dict[str, list[str]] = {}
    for label, deployment in figures:
        if deployment:
            by.setdefault(deployment, []).append(label)
    if not by:
        return None
    if len(by) == 1:
        return f"{what} in {next(iter(by))}."
    return f"{what} in " + "; ".join(f"{d} ({', '.join(labels)})" for d, labels in by.items()) + "."


#: The key's words for a speedup's range.
RANGE_KEY = "(low-high): predicted range, one sigma of the calibration."


def natural_width(table: Table) -> int:
    """The width `table` takes unwrapped, in columns."""
    probe = Console(width=10_000)
    return RichMeasurement.get(probe, probe.options, table).maximum


def ranged(build: Callable[[bool], Table], wide: bool, ranges: bool) -> tuple[Table, bool]:
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
RISE_NOTE = "big batches read MoE experts anyway; drafts reuse them."


def speedup_rise_note(points: Iterable[tuple[int, float | None, Mapping[str, Any] | None]]) -> str | None:
    """Why the speedup over no speculation rises with concurrency, only where the figures show it: from
    (concurrency, speedup, step breakdown) per result, the spans between neighbouring concurrencies where the speedup,
    as shown (two decimals), rises and the higher one's step reads MoE experts (its ``step_breakdown_ms`` has
    ``experts`` > 0). "vs none rises with c: `RISE_NOTE`" when every neighbour rises; "vs none rises c=1-8: ..." when
    it rises only there (1.86x, 2.08x, 1.28x at c=1, 8, 64 rises from 1 to 8 and falls at 64); None when it never
    rises (a dense model, measured figures, a speedup that falls)."""
    shown = sorted((c, round(s, 2), b) for c, s, b in points if s is not None and math.isfinite(s))
    pairs = list(itertools.pairwise(shown))
    spans: list[tuple[int, int]] = []
    for (c_low, low, _b), (c_high, high, breakdown) in pairs:
        experts = (breakdown or {}).get("experts")
        if high > low and isinstance(experts, int | float) and experts > 0:
            if spans and spans[-1][1] == c_low:
                spans[-1] = (spans[-1][0], c_high)
            else:
                spans.append((c_low, c_high))
    if not spans:
        return None
    if len(spans) == 1 and spans[0] == (shown[0][0], shown[-1][0]):
        return f"vs none rises with c: {RISE_NOTE}"
    where = ", ".join(f"{low}-{high}" for low, high in spans)
    return f"vs none rises c={where}: {RISE_NOTE}"


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
QUEUE_LEGEND = ("q: max_num_seqs below the concurrency: requests queue for a slot, which adds to their TTFT (how a "
                "latency target is met).")


def queue_notes(points: Iterable[tuple[int, int, Mapping[str, Any]]]) -> list[str]:
    """One line per recommendation that queues requests, from (concurrency, max_num_seqs, metrics): ``c=8: 4 of 8
    run at once, 4 queue, so TTFT is 1085 ms p50, 1085 ms p99.`` (its TTFT includes the wait for a slot)."""
    notes = []
    for concurrency, seqs, metrics in points:
        if seqs >= concurrency:
            continue
        p50, p99 = metrics.get("ttft_ms_p50"), metrics.get("ttft_ms_p99")
        ttft = f", so TTFT is {fmt(p50, '.0f')} ms p50, {fmt(p99, '.0f')} ms p99" if p50 is not None else ""
        notes.append(f"c={concurrency}: {seqs} of {concurrency} run at once, {concurrency - seqs} queue{ttft}.")
    return notes


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


def plain_table(*columns: str, right: Iterable[str] = ()) -> Table:
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


def stored_config(row: Mapping[str, Any], key: str) -> SpecConfig | None:
    value = row.get(key)
    if not isinstance(value, Mapping):
        return None
    try:
        return SpecConfig.from_dict(dict(value))
    except Exception:  # written by another version: shown as "-" (--json has it whole)
        return None


def config_cell(config: SpecConfig, *, wide: bool = False, model: str | None = None) -> str:
    """A config in one short cell: ``p-eagle 4L PD K=4 x64`` (PD: parallel drafting; seq: sequential; x: max_num_seqs);
    ``none x64`` without speculation."""
    if not config.speculative:
        return f"none x{config.max_num_seqs}"
    name = drafter_cell(config, full=wide, model=model)
    return f"{name} {'PD' if config.parallel_drafting else 'seq'} K={config.k} x{config.max_num_seqs}"
