"""`peagle-tune simulate`'s default output: one screen (at most 40 lines at 80 columns) with the config to run, each
load's best static config with adaptive serving and vLLM's schedule against it, and the conclusion in one sentence.
``--verbose`` prints every config (`autotune.cli.simulate.render`), ``--json`` everything."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Any

_WIDTH = 80


def static_k(row: Any) -> int:
    """The K of a static row (``static K=4``); 0 for no speculation."""
    found = re.search(r"K=(\d+)", row.config) if row.kind == "static" else None
    return int(found.group(1)) if found else 0


def best_static(rows: Sequence[Any], margin: float) -> Any | None:
    """The best static config of one load (no speculation included) by the search's pick rule (`pick_tied`: ties
    within `margin` go to the smallest K); None without static rows."""
    from autotune.search.compare import pick_tied

    statics = [r for r in rows if r.kind in ("none", "static")]
    if not statics:
        return None
    return pick_tied(statics, lambda r: r.output_tokens_per_s, margin, static_k)[0]


def _load(row: Any) -> str:
    return f"{row.request_rate:g} req/s" if row.request_rate is not None else f"c={row.concurrency}"


def _ratio(rows: Sequence[Any], kind: str, best: Any) -> float | None:
    """The best `kind` row's tokens/s over `best`'s (kind "adaptive": any adaptive config)."""
    found = [r.output_tokens_per_s for r in rows if r.kind.startswith(kind)]
    return max(found) / best.output_tokens_per_s if found and best.output_tokens_per_s > 0 else None


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.3f}x" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}-{high:.3f}x"


def conclusion(points: Sequence[tuple[str, Any, float | None]], margin: float) -> str:
    """One sentence: does adaptive serving pay, by how much, against what; from (load, best static row, adaptive
    over it) per load. It pays where it beats the best static config by more than `margin` (the pick rule's tie:
    a gain inside the figures' spread is no gain)."""
    ratios = [(load, r) for load, _best, r in points if r is not None]
    if not ratios:
        return "No adaptive config was simulated: compare with --configs including adaptive."
    values = [r for _load, r in ratios]
    where = [load for load, r in ratios if r > 1 + margin]
    against = "the best static config (no speculation included)"
    if where:
        top_load, top = max(ratios, key=lambda p: p[1])
        return (f"Adaptive serving pays here at {', '.join(where)}: up to {top:.3f}x {against} (at {top_load}); "
                f"{_span(values)} over all loads.")
    worst = min(values)
    cost = f"; it costs up to {1 - worst:.1%} at {min(ratios, key=lambda p: p[1])[0]}" if worst < 1 - margin else ""
    return (f"Adaptive serving does not pay here: {_span(values)} {against}, within the {margin:.1%} the figures "
            f"tie by{cost}; serve the best static config.")


def _run_line(points: Sequence[tuple[str, str, Any, float | None]], pays: bool) -> str:
    """The config to run: adaptive serving, or the best static config per load (grouped by config; a load named
    with its workload only where the workloads' best differ there)."""
    if pays:
        return "Run: adaptive serving (`peagle-tune serve`, which launches it with the scheduler plugin)."
    configs_at: dict[str, set[str]] = {}
    for _workload, load, best, _r in points:
        configs_at.setdefault(load, set()).add(best.config)
    by_config: dict[str, list[str]] = {}
    for workload, load, best, _r in points:
        label = load if len(configs_at[load]) == 1 else f"{workload} {load}"
        if label not in by_config.setdefault(best.config, []):
            by_config[best.config].append(label)
    if len(by_config) == 1:
        return f"Run: {next(iter(by_config))} at every load."
    return "Run: " + "; ".join(f"{config} at {', '.join(loads)}" for config, loads in by_config.items()) + "."


def summary(result: Any, margin: float, *, dropped: str | None = None) -> str:
    """The one-screen text of `result` (a `SimulationResult`): header, the config to run, a table of each load's best
    static config with adaptive serving and vLLM's schedule against it, and the conclusion. `margin`: the pick
    rule's tie margin for these figures. `dropped`: a line saying which scenario was left out and why."""
    lines = ["PREDICTED by simulation (nothing here is measured)"]

    def wrap(text: str, indent: str = "") -> None:
        lines.extend(textwrap.wrap(text, _WIDTH, subsequent_indent=indent, break_on_hyphens=False))

    drafter = f" with {result.drafter} (K_max {result.settings.get('max_k')})" if result.drafter else ""
    wrap(f"{result.model}{drafter} on {result.device}; acceptance: {result.acceptance_source}; step cost: "
         f"{result.step_cost_source}.")
    graphs = result.settings.get("cuda_graphs")
    if graphs is not None:
        sched = "async" if result.settings.get("async_scheduling") else "synchronous"
        wrap(("CUDA graphs: FULL for uniform decode steps, PIECEWISE penalty otherwise" if graphs else
              "no CUDA graphs (CPU build)") + f"; {sched} scheduling.")
    for note in [dropped, *result.warnings]:
        if note:
            wrap(note)
    groups: dict[tuple[str, str], list[Any]] = {}
    for row in result.rows:
        groups.setdefault((row.workload, _load(row)), []).append(row)
    points = []
    table = [f"{'workload':<12} {'load':>8}  {'best static':<14} {'tok/s':>8} {'x none':>7} {'adaptive':>9} "
             f"{'schedule':>9}"]
    table.append("-" * len(table[0]))
    for (workload, load), rows in groups.items():
        best = best_static(rows, margin)
        if best is None:
            continue
        adaptive, schedule = _ratio(rows, "adaptive", best), _ratio(rows, "schedule", best)
        points.append((workload, load, best, adaptive))
        table.append(f"{workload[:12]:<12} {load:>8}  {best.config[:14]:<14} {best.output_tokens_per_s:>8.1f} "
                     f"{_x(best.speedup_vs_no_spec):>7} {_x(adaptive, 3):>9} {_x(schedule, 3):>9}")
    lines.append("")
    if not points:
        lines.append("No static config was simulated: compare with --configs including none,static.")
        return "\n".join(lines)
    pays = any(r is not None and r > 1 + margin for _w, _load, _best, r in points)
    wrap(_run_line(points, pays), "     ")
    lines.append("")
    lines.extend(table)
    wrap("adaptive: the best adaptive config over the best static (ties within "
         f"{margin:.1%} go to the smaller K); schedule: vLLM's K per batch size over it.")
    lines.append("")
    several = len({w for w, *_rest in points}) > 1
    wrap(conclusion([(f"{w} {load}" if several else load, best, r) for w, load, best, r in points], margin))
    lines.append("Every config, the per-phase oracle and the sources: --verbose; all: --json.")
    return "\n".join(lines)


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"
