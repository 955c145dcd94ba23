"""Which configs a search launches fresh to confirm its pick, when in-launch figures are estimates. Pure.

In-launch measurement (`autotune.backends.in_launch`) reads every K of a drafter from one engine started at K_max.
On a GPU whose launch captures FULL CUDA graphs (vLLM's ``cudagraph_mode`` FULL, FULL_DECODE_ONLY or
FULL_AND_PIECEWISE), only a uniform decode step of 1 + K_max tokens per request replays them
(`policies._graphs`); the phases at K < K_max ran PIECEWISE, while a fresh engine at static K replays FULL graphs for
its own uniform 1 + K steps. Such a figure is an estimate for ranking: a fresh launch may run up to
`policies._graphs.PIECEWISE_PENALTY_SHARE` (19.2%, vLLM #49548, single stream; less for larger batches) faster.
That share is the figure's *spread*; a figure that ran as a fresh launch would (K = K_max, no speculation, a fresh
launch, or no graphs at all: the CPU build) has none.

The confirmation launches fresh, per concurrency, the best config and every other config whose figure stretched by
its spread reaches the best's, at most `MAX_CANDIDATES`, and the pick is made on the fresh figures
(`autotune.search.study.Search`). Without FULL graphs no figure has a spread and only the best is confirmed.

Example: the best at K=5 (= K_max, FULL) with 100 tok/s, K=3 with 90 (PIECEWISE: up to 90 x 1.192 = 107.3) and K=2
with 80 (up to 95.4): ``confirmation_candidates(figures, best)`` is [K=5, K=3]; with NONE it is [K=5].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement import Measurement
from autotune.search.objective import MissingFigureError, Objective, measurement_metrics
from autotune.spec import SpecConfig
from policies._graphs import FULL_GRAPH_MODES, PIECEWISE_PENALTY_SHARE, full_graph_depth, step_graph_mode

if TYPE_CHECKING:
    from autotune.search.result import ScenarioResult

__all__ = [
    "beats_baseline",
    "confirm_fresh",
    "MAX_CANDIDATES",
    "Figure",
    "candidate_note",
    "confirmation_candidates",
    "extra_confirmation_launches",
    "figure_graph_mode",
    "in_launch_spread",
]

MAX_CANDIDATES = 3
"""Fresh launches a confirmation makes per concurrency at most (the best included)."""


def figure_graph_mode(launch_mode: str | None, k: int, launch_k: int) -> str:
    """The graph mode the decode steps of a phase at depth `k` ran under, in a launch at K = `launch_k` with CUDA-graph
    mode `launch_mode` (None: unknown, taken as none): "FULL", "PIECEWISE" or "NONE". Prompt steps run PIECEWISE
    whatever the phase (`policies._graphs.step_graph_mode`).

    Example: ``figure_graph_mode("FULL_AND_PIECEWISE", 3, 5) == "PIECEWISE"``; at k = 5 "FULL"; with "NONE" "NONE".
    """
    full = full_graph_depth(launch_mode, launch_k)
    return step_graph_mode(launch_mode, full, 1, k + 1)


def in_launch_spread(m: Measurement) -> float:
    """How much faster than its figure a fresh launch of `m`'s config may run, as a share (0: none): the PIECEWISE
    penalty when `m` is an in-launch figure that ran PIECEWISE in a launch with FULL graphs (a fresh launch at its K
    replays FULL), else 0. Reads ``m.extra["in_launch"]["graph_mode"]`` and ``m.provenance.cudagraph_mode``."""
    info = m.extra.get("in_launch")
    if not isinstance(info, Mapping) or m.provenance.cudagraph_mode not in FULL_GRAPH_MODES:
        return 0.0
    return PIECEWISE_PENALTY_SHARE if info.get("graph_mode") == "PIECEWISE" else 0.0


@dataclass(frozen=True)
class Figure:
    """One config's figure as the confirmation ranks it."""

    config: SpecConfig
    score: float
    """Higher is better: tokens/s, or 1 / TPOT when the objective minimises latency (a PIECEWISE step's extra time
    scales both alike)."""
    spread: float = 0.0
    """`in_launch_spread` of the figure."""

    @property
    def reach(self) -> float:
        """The score a fresh launch may reach."""
        return self.score * (1.0 + self.spread)


def confirmation_candidates(
    figures: Sequence[Figure], best: SpecConfig, cap: int = MAX_CANDIDATES
) -> list[SpecConfig]:
    """The configs to launch fresh (or keep, for figures that need no launch) before picking: `best` first, then
    every other config whose `Figure.reach` exceeds the best's score, highest reach first (ties: smaller K), at most
    `cap` in all. Figures without a spread add nothing: their figure is already what a fresh launch measures.

    Example: best K=5 at 100 (spread 0), K=3 at 90 and K=2 at 80 (spread 0.192 each), K=4 at 85 (spread 0.192:
    reach 101.3), K=1 at 70 (reach 83.4) -> [K=5, K=3, K=4]; cap 2 -> [K=5, K=3].
    """
    if cap < 1:
        raise ValueError(f"cap >= 1 must hold, but got {cap=}.")
    top = next((f.score for f in figures if f.config == best), max((f.score for f in figures), default=0.0))
    near = [f for f in figures if f.config != best and f.spread > 0 and f.reach > top]
    near.sort(key=lambda f: (-f.reach, f.config.k))
    return [best, *(f.config for f in near)][:cap]


def extra_confirmation_launches(graph_mode: str | None, below_k_max: Sequence[int]) -> int:
    """Fresh launches the confirmation may add over one per concurrency: none without FULL graphs (`graph_mode`, the
    CUDA-graph mode predicted for a fresh launch), else up to ``MAX_CANDIDATES - 1`` per concurrency, fewer where a
    concurrency's space has fewer speculative configs below K_max (`below_k_max`, one count per concurrency: the
    only configs with a spread).

    Example: ``extra_confirmation_launches("FULL_AND_PIECEWISE", [10, 10, 1]) == 5``; with "NONE" 0.
    """
    if graph_mode not in FULL_GRAPH_MODES:
        return 0
    return sum(min(max(n, 0), MAX_CANDIDATES - 1) for n in below_k_max)


def candidate_note(figure: Measurement, fresh: Measurement | None) -> dict[str, Any]:
    """One candidate of a confirmation as the JSON ``confirmation.candidates`` lists it."""
    info = figure.extra.get("in_launch")
    return {
        "config": figure.config.label(),
        "in_launch_tokens_per_s": figure.output_tokens_per_s,
        "in_launch_graph_mode": info.get("graph_mode") if isinstance(info, Mapping) else None,
        "spread": in_launch_spread(figure),
        "fresh_tokens_per_s": None if fresh is None or not fresh.ok else fresh.output_tokens_per_s,
        "fresh_graph_mode": None if fresh is None else fresh.extra.get("graph_mode"),
        "launched": fresh is not None,
    }


def confirm_fresh(objective: Objective, result: ScenarioResult, in_launch: Measurement, fresh: Measurement) -> None:
    """Recommend `fresh` (a config launched as it would be served) in place of its in-launch figure; if that
    launch failed, misses the SLOs or loses to no speculation, recommend no speculation instead."""
    note: dict[str, Any] = {
        "config": in_launch.config.label(),
        "in_launch_tokens_per_s": in_launch.output_tokens_per_s,
        "fresh_tokens_per_s": fresh.output_tokens_per_s if fresh.ok else None,
        "fresh_ok": fresh.ok,
    }
    if fresh.ok and fresh.output_tokens_per_s and in_launch.output_tokens_per_s:
        note["ratio"] = fresh.output_tokens_per_s / in_launch.output_tokens_per_s
    base = result.baseline
    keep, why = True, ""
    if not fresh.ok:
        keep, why = False, f"the fresh launch failed ({fresh.failure_kind}: {fresh.failure_reason})"
    elif base is not None and base.ok:
        keep, why = beats_baseline(objective, fresh, base)
    if keep or base is None or not base.ok:
        result.best = fresh
        note["recommended"] = "confirmed"
    else:
        result.best = base
        note["recommended"] = "no speculation"
        note["why"] = why
    result.confirmation = note

def beats_baseline(objective: Objective, fresh: Measurement, base: Measurement) -> tuple[bool, str]:
    """Whether `fresh` still beats no speculation under the objective, and if not, why, in words."""
    fresh_metrics, base_metrics = measurement_metrics(fresh), measurement_metrics(base)
    try:
        ours, theirs = objective.values(fresh_metrics)[0], objective.values(base_metrics)[0]
    except MissingFigureError as exc:
        return False, str(exc)
    if any(v > 0 for v in objective.constraints(fresh_metrics).values()):
        return False, f"launched fresh it misses {objective.describe_slos()}"
    sign = 1.0 if objective.directions[0] == "maximize" else -1.0
    if sign * ours < sign * theirs:
        name = objective.value_names[0]
        return False, f"launched fresh its {name} {ours:.4g} loses to no speculation's {theirs:.4g}"
    return True, ""
