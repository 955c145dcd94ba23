"""A study's trials as plot points: objectives and their directions, the starred trial, the Pareto front and
the SLOs it was searched under."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.report._series._labels import config_label, kind_of, provenance_caption, short_name
from autotune.search import OBJECTIVES, Objective
from autotune.search.compare import pick_tied, tie_margin
from store import Direction, RecommendationRecord, TrialRecord


@dataclass(frozen=True)
class TrialPoint:
    number: int
    status: str
    values: dict[str, float]
    group: str
    """Drafter / parallel-drafting label used for the colour."""
    k: int
    max_num_seqs: int
    label: str
    metrics: dict[str, Any]
    failure: str | None = None
    """Why the trial has no value (failed trials)."""
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StudyData:
    study: str
    model: str
    objectives: list[str]
    directions: dict[str, str]
    trials: list[TrialPoint]
    caption: str
    scenario: str
    concurrency: int | None = None
    recommended: dict[str, Any] | None = None
    """The config the study's stored recommendation chose (None: no recommendation names this study)."""
    slos: dict[str, float] = field(default_factory=dict)
    """Service-level limits of the study, metric name -> ms (e.g. {"tpot_ms_p99": 12.0})."""
    kind: str = "unknown"
    """Where the trials' figures come from: "measured", "predicted", "mixed" or "unknown" (the figures' tag)."""

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) >= 2

    def best(self) -> TrialPoint | None:
        """The trial to star: the recommended config's trial when the study has a recommendation, else the
        search's rule on the first objective (`autotune.search.compare.pick_tied`: within the figures' spread of
        the top, max_num_seqs within the concurrency, then the smallest K, then max_num_seqs closest to it)."""
        if not self.objectives:
            return None
        obj = self.objectives[0]
        done = [t for t in self.trials if t.status == "complete" and obj in t.values]
        if not done:
            return None
        if self.recommended is not None:
            chosen = [t for t in done if t.config == self.recommended]
            if chosen:
                return chosen[0]
        sign = 1.0 if self.directions[obj] == "maximize" else -1.0
        top = max(done, key=lambda t: sign * t.values[obj])
        sigma = top.metrics.get("prediction_log_sigma")
        margin = tie_margin(float(sigma) if isinstance(sigma, int | float) and math.isfinite(sigma) else 0.0)
        return pick_tied(done, lambda t: sign * t.values[obj], margin, self._order)[0]

    def _order(self, t: TrialPoint) -> tuple[bool, int, int, int, int]:
        """`autotune.search.compare.tie_key` of a trial point at the study's concurrency, then the trial number."""
        conc = self.concurrency
        if conc is None:
            return (False, t.k, t.max_num_seqs, t.max_num_seqs, t.number)
        return (t.max_num_seqs > conc, t.k, abs(t.max_num_seqs - conc), t.max_num_seqs, t.number)

    def pareto(self) -> list[TrialPoint]:
        """Complete trials that no other complete trial beats on both of the first two objectives."""
        if not self.multi_objective:
            return []
        a, b = self.objectives[:2]
        sa = 1.0 if self.directions[a] == "maximize" else -1.0
        sb = 1.0 if self.directions[b] == "maximize" else -1.0
        pts = [t for t in self.trials if t.status == "complete" and a in t.values and b in t.values]

        def dominates(p: TrialPoint, q: TrialPoint) -> bool:
            pa, pb, qa, qb = sa * p.values[a], sb * p.values[b], sa * q.values[a], sb * q.values[b]
            return pa >= qa and pb >= qb and (pa > qa or pb > qb)

        front = [q for q in pts if not any(dominates(p, q) for p in pts)]
        # One point per position, as the search's front: of configs with identical figures, the one the tie order
        # puts first (the recommended config when it is one of them).
        points: dict[tuple[float, float], TrialPoint] = {}
        for t in sorted(front, key=lambda t: (t.config != self.recommended, self._order(t))):
            points.setdefault((t.values[a], t.values[b]), t)
        chosen = [t for t in pts if t.config == self.recommended]
        if points and chosen and all(t.config != self.recommended for t in points.values()):
            # The search's pick ties with the front's fastest point within the prediction's spread
            # (`autotune.search.result.front_top_ties`): it stands on the front in that point's place.
            fastest = max(points, key=lambda key: sa * key[0])
            del points[fastest]
            points[(chosen[0].values[a], chosen[0].values[b])] = chosen[0]
        return sorted(points.values(), key=lambda t: t.values[a])


def _group(config: dict[str, Any]) -> tuple[str, int]:
    if config.get("method", "none") == "none":
        return "no speculation", 0
    pd = " +parallel drafting" if config.get("parallel_drafting") else " sequential"
    layers = f" ({config['drafter_layers']}L)" if config.get("drafter_layers") else ""
    return f"{short_name(config.get('drafter'))}{layers}{pd}", int(config.get("num_speculative_tokens") or 0)


def study_data(
    study: str,
    trials: Sequence[TrialRecord],
    recommended: dict[str, Any] | None = None,
    slos: dict[str, float] | None = None,
) -> StudyData:
    """Trials of one study as plot points, with its objectives (from the values stored) and their directions.

    `recommended`: the best_config of the study's recommendation, starred in the figures. `slos`: metric -> limit
    in ms, drawn as limits on the Pareto front.
    """
    objectives: list[str] = []
    for t in trials:
        for name in t.values:
            if name not in objectives:
                objectives.append(name)
    points = []
    for t in trials:
        group, k = _group(t.config)
        points.append(
            TrialPoint(
                number=t.number,
                status=t.status,
                values=dict(t.values),
                group=group,
                k=k,
                max_num_seqs=int(t.config.get("max_num_seqs") or 0),
                label=config_label(t.config),
                metrics=dict(t.metrics),
                failure=t.failure_reason,
                config=dict(t.config),
            )
        )
    kinds = sorted({kind_of(t.provenance) for t in trials})
    first = trials[0]
    # A speculative trial's provenance names the acceptance source too (a no-spec one names only the step cost).
    spec = [t for t in trials if t.config.get("method", "none") != "none" and t.provenance]
    caption = provenance_caption((spec[0] if spec else first).provenance)
    if len(kinds) > 1:
        caption = f"Mixed trials ({' and '.join(kinds)}); e.g. {caption}"
    scen = first.scenario
    rate, conc = scen.get("request_rate"), scen.get("concurrency")
    scenario = f"request rate {rate}/s" if rate else (f"concurrency {conc}" if conc else "scenario not stored")
    caption = f"Study {study}, {scenario}, {len(trials)} trials. {caption}"
    # A value no objective declares (a figure a hand-written study stored) is drawn higher-is-better, the figures'
    # default; its axis label says so.
    known = objective_directions()
    return StudyData(
        study=study,
        model=first.model,
        objectives=objectives,
        directions={o: known.get(o, "maximize") for o in objectives},
        trials=points,
        caption=caption,
        scenario=scenario,
        concurrency=int(conc) if conc and not rate else None,
        recommended=recommended,
        slos=dict(slos or {}),
        kind=kinds[0] if len(kinds) == 1 else "mixed",
    )


def objective_directions() -> dict[str, Direction]:
    """Which way is better for each name a study stores trial values under: {name: "maximize" | "minimize"}.

    Taken from `autotune.search.Objective`: every objective's `value_names` with its `directions`
    (output_tokens_per_s: maximize; tpot_ms_p50, tpot_ms_p99: minimize), and each single-valued objective's own
    name with its one direction (throughput: maximize, latency: minimize), as hand-written studies store them. A name
    no objective declares is not in it.
    """
    out: dict[str, Direction] = {}
    for name in OBJECTIVES:
        # goodput needs an SLO to exist; an SLO bound never changes a direction.
        objective = Objective(name, slo_tpot_p99_ms=1.0)
        out.update(zip(objective.value_names, objective.directions, strict=True))
        if not objective.multi:
            out.setdefault(name, objective.directions[0])
    return out


def slos_of(recommendation: RecommendationRecord) -> dict[str, float]:
    """The SLOs a recommendation was searched under (metric -> ms), from its stored objective description."""
    objective = recommendation.metrics.get("objective")
    if not isinstance(objective, dict):
        return {}
    out = {}
    for key, metric in (("slo_tpot_p99_ms", "tpot_ms_p99"), ("slo_ttft_p99_ms", "ttft_ms_p99")):
        value = objective.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            out[metric] = float(value)
    return out
