"""`peagle-tune bench`'s and `show`'s measured-beside-stored table, and `show --compare`'s two recommendations side
by side. Drawing only: the figures and errors come from `autotune.bench`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from autotune.cli._tables._cells import config_text, fmt, plain_table, titled, when

#: A figure's label in a cell, and its number format.
FIGURE_LABELS: dict[str, tuple[str, str]] = {
    "output_tokens_per_s": ("output tok/s", ".1f"),
    "tpot_ms_p50": ("TPOT ms p50", ".2f"),
    "tpot_ms_p99": ("TPOT ms p99", ".2f"),
    "ttft_ms_p50": ("TTFT ms p50", ".0f"),
    "ttft_ms_p99": ("TTFT ms p99", ".0f"),
    "speedup_vs_no_spec": ("vs none", ".2f"),
    "acceptance_length": ("acceptance length", ".2f"),
}


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def provenance_words(provenance: Mapping[str, Any]) -> str:
    """``vllm bench serve on cpu, vLLM 0.32.0, 2026-12-07`` (what measured a benchmark, where, when)."""
    return (f"{provenance.get('backend', '?')} on {provenance.get('device', '?')}, vLLM "
            f"{provenance.get('vllm_version') or '?'}, {when(provenance.get('date'))[:10]}")


def bench_view(recommendation: Mapping[str, Any], benchmarks: Sequence[Mapping[str, Any]]) -> RenderableType:
    """Each benchmark of `recommendation` (newest first): its figures measured by ``vllm bench serve`` beside the
    recommendation's (searched or predicted) and the error ((stored - measured) / measured)."""
    from autotune.bench import compare, stored_kind

    kind = stored_kind(recommendation)
    parts: list[RenderableType] = []
    for bench in benchmarks:
        figures = bench.get("figures") or {}
        table = plain_table("figure", kind, "measured", "error", right={kind, "measured", "error"})
        rows = compare(recommendation.get("metrics") or {}, figures)
        for row in rows:
            label, spec = FIGURE_LABELS.get(row.name, (row.name, ".2f"))
            table.add_row(label, fmt(row.stored, spec), fmt(row.measured, spec), _error(row.error))
        shown = {r.name for r in rows}
        for name in ("tpot_ms_p50", "ttft_ms_p50"):  # measured, with nothing stored to compare with
            if name not in shown and isinstance(figures.get(name), int | float):
                label, spec = FIGURE_LABELS[name]
                table.add_row(label, "-", fmt(float(figures[name]), spec), "-")
        title = (f"#{recommendation.get('id')} benchmark {bench.get('id')} ({bench.get('mode')}): "
                 f"{bench.get('num_prompts')} prompts at concurrency {bench.get('concurrency')}")
        failed = figures.get("failed")
        parts.append(titled(
            title, table,
            f"Measured by {provenance_words(bench.get('provenance') or {})}; served by "
            f"{(bench.get('provenance') or {}).get('deployment', '?')}.",
            f"{kind.capitalize()}: the recommendation's figure; error = ({kind} - measured) / measured."
            + (" The search sent each workload class as its own phase; vllm bench serve mixes them."
               if kind == "searched" else ""),
            f"{int(failed)} requests failed." if isinstance(failed, int | float) and failed else None,
        ))
    return Group(*parts) if parts else Text(f"#{recommendation.get('id')}: no benchmark stored.")


def compare_rows(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(what, first, second, differs) for two recommendations' dicts (each with its ``benchmarks`` when any):
    where they were tuned, the config, and each figure (stored, and the newest benchmark's measured)."""

    def cell(rec: Mapping[str, Any], key: str) -> str:
        value = rec.get(key)
        return "-" if value is None else str(value)

    def figure(rec: Mapping[str, Any], name: str, measured: bool) -> str:
        source = ((rec.get("benchmarks") or [{}])[0].get("figures") or {}) if measured else rec.get("metrics") or {}
        value = source.get(name)
        spec = FIGURE_LABELS[name][1]
        return fmt(float(value), spec) if isinstance(value, int | float) else "-"

    rows: list[tuple[str, str, str]] = [
        ("model", cell(first, "model"), cell(second, "model")),
        ("GPU", cell(first, "gpu"), cell(second, "gpu")),
        ("vLLM", cell(first, "vllm_version"), cell(second, "vllm_version")),
        ("workload", cell(first, "workload_name"), cell(second, "workload_name")),
        ("objective", cell(first, "objective"), cell(second, "objective")),
        ("concurrency", str((first.get("scenario") or {}).get("concurrency", "-")),
         str((second.get("scenario") or {}).get("concurrency", "-"))),
        ("config", config_text(first.get("best_config") or {}), config_text(second.get("best_config") or {})),
        ("figures", str((first.get("provenance") or {}).get("kind", "-")),
         str((second.get("provenance") or {}).get("kind", "-"))),
    ]
    for name, (label, _spec) in FIGURE_LABELS.items():
        pair = (figure(first, name, False), figure(second, name, False))
        if pair != ("-", "-"):
            rows.append((label, *pair))
    if first.get("benchmarks") or second.get("benchmarks"):
        for name in ("output_tokens_per_s", "tpot_ms_p50", "ttft_ms_p50"):
            rows.append((f"{FIGURE_LABELS[name][0]} (bench)", figure(first, name, True), figure(second, name, True)))
    rows.append(("stored", when(first.get("created_at"))[:10], when(second.get("created_at"))[:10]))
    return [(what, a, b, a != b) for what, a, b in rows]


def compare_view(first: Mapping[str, Any], second: Mapping[str, Any]) -> RenderableType:
    """Two recommendations side by side, a ``*`` on each line that differs; at 80 columns the config wraps."""
    table = plain_table("", f"#{first.get('id')}", f"#{second.get('id')}", "")
    for what, a, b, differs in compare_rows(first, second):
        table.add_row(what, a, b, "*" if differs else "")
    table.columns[1].no_wrap = table.columns[2].no_wrap = False
    differ = [what for what, _a, _b, d in compare_rows(first, second) if d and what != "stored"]
    return titled(f"Recommendation #{first.get('id')} against #{second.get('id')}", table,
                  f"* differs: {', '.join(differ)}." if differ else "They differ only in when they were stored.")
