"""The numbers behind each report figure, derived from stored records (no plotting here).

Each ``*Data`` object carries its own provenance line (`caption`): what was measured (device, vLLM version, date) or
predicted (model backend, GPU assumed, profile used). Builders never raise for missing optional inputs; they return
None and the report says why in `notes`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import PeagleError
from autotune.search import OBJECTIVES, Objective
from autotune.spec import MAX_K, SpecConfig
from policies import AcceptanceProfile, StepCostModel, StepSample
from store import Direction, ProfileRecord, RecommendationRecord, TrialRecord

CONFIDENCE = 0.95
"""Confidence level of every interval the report draws."""
TIE_TOLERANCE = 1e-3
"""Relative gap under which two configs count as tied (the smaller K wins), as in `autotune.search`."""


# ------------------------------------------------------------------------------------------------ data classes


@dataclass(frozen=True)
class ClassAcceptance:
    """Acceptance of one workload class: survival per draft position and AL(K), with 95% intervals."""

    name: str
    num_drafts: int
    """Drafts measured (0 for curves predicted from a published figure)."""
    survival: list[float]
    """``survival[i]`` = P(first i+1 drafts accepted), positions 1..len."""
    survival_low: list[float]
    survival_high: list[float]
    acceptance_length: list[float]
    """``[AL(0), ..., AL(max_k)]`` in tokens per request per step (bonus token included)."""
    al_low: list[float]
    al_high: list[float]
    references: list[tuple[int, float, str]] = field(default_factory=list)
    """Published points (K, AL, label) from the drafter catalog."""


@dataclass(frozen=True)
class AcceptanceData:
    title: str
    caption: str
    measured: bool
    classes: list[ClassAcceptance]
    max_k: int
    reference_note: str = ""
    """Where the published points come from (shown under the figure)."""


@dataclass(frozen=True)
class StepCostData:
    """T(B, K) in ms: measured samples (if any) and a model's prediction per depth over batch size."""

    title: str
    caption: str
    measured: bool
    samples: list[tuple[int, int, float, int]]
    """Measured (batch_size, depth, step_ms, n)."""
    model_lines: dict[int, list[tuple[int, float]]]
    """depth -> [(batch_size, predicted step_ms)]."""
    model_label: str
    """Legend text of the model lines, with its fit error when known."""


@dataclass(frozen=True)
class GoodputData:
    """Predicted tokens/s against K for each batch size."""

    title: str
    caption: str
    source: str
    """"profile" (measured acceptance + fitted step cost) or "model backend"."""
    ks: list[int]
    tokens_per_s: dict[int, list[float]]
    """batch_size -> tokens/s per K in `ks` (nan where the config cannot run)."""
    published_k: int | None = None

    def best_k(self, batch_size: int) -> int | None:
        """The smallest K within `TIE_TOLERANCE` of the highest tokens/s at `batch_size`; None if all are nan.

        Same rule as the search's pick: a deeper K that gains under 0.1% verifies more tokens for nothing.
        """
        pairs = [(k, v) for k, v in zip(self.ks, self.tokens_per_s[batch_size], strict=True) if math.isfinite(v)]
        if not pairs:
            return None
        top = max(v for _, v in pairs)
        return min(k for k, v in pairs if v >= top - abs(top) * TIE_TOLERANCE)


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
        search's rule on the first objective (within `TIE_TOLERANCE` of the top: smallest K, then max_num_seqs
        closest to the concurrency)."""
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
        top = max(sign * t.values[obj] for t in done)
        tied = [t for t in done if sign * t.values[obj] >= top - abs(top) * TIE_TOLERANCE]
        conc = self.concurrency or 0
        return min(tied, key=lambda t: (t.k, abs(t.max_num_seqs - conc), t.max_num_seqs, t.number))

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
        return sorted(front, key=lambda t: t.values[a])


# ------------------------------------------------------------------------------------------------ labels


def _date(value: dt.datetime | str | None) -> str:
    if value is None:
        return "date unknown"
    if isinstance(value, str):
        return value[:10]
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d")


def profile_label(profile: ProfileRecord) -> str:
    return f"profile #{profile.id}"


def measured_caption(profile: ProfileRecord) -> str:
    """``Measured: profile #3 (drafter X, workload W) on cpu, vLLM 0.32.0, 2026-01-31``."""
    device = f"{profile.gpu_count}x {profile.device}" if profile.gpu_count > 1 else profile.device
    what = "live serving stats" if profile.kind == "live" else "offline profiling run"
    return (
        f"Measured ({what}): {profile_label(profile)}, drafter {profile.drafter or '?'}"
        f"{' +parallel drafting' if profile.parallel_drafting else ''}, workload {profile.workload_name or '?'}; "
        f"on {device}, vLLM {profile.vllm_version or 'version unknown'}, {_date(profile.created_at)}."
    )


def provenance_caption(provenance: dict[str, Any]) -> str:
    """One line for a stored provenance dict (a trial's or a recommendation's)."""
    kind = provenance.get("kind")
    device = provenance.get("device") or "an unknown device"
    if kind == "measured":
        return (
            f"Measured on {device}, vLLM {provenance.get('vllm_version') or 'version unknown'}, "
            f"{_date(provenance.get('date'))}."
        )
    if kind == "predicted":
        return (
            f"Predicted by the {provenance.get('backend') or 'model'} backend for {device} (GPU assumed, not "
            f"measured), from {provenance.get('profile') or 'an unknown profile'}."
        )
    return "Source unknown (no provenance stored)."


def kind_of(provenance: dict[str, Any]) -> str:
    """"measured", "predicted" or "unknown"."""
    kind = provenance.get("kind")
    return str(kind) if kind in ("measured", "predicted") else "unknown"


def config_label(config: dict[str, Any]) -> str:
    try:
        return SpecConfig.from_dict(config).label()
    except (PeagleError, TypeError):
        return str(config)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def short_name(name: str | None) -> str:
    return (name or "?").rstrip("/").split("/")[-1]


# ------------------------------------------------------------------------------------------------ acceptance


def _references(drafter_name: str | None, model: str) -> tuple[dict[str, Any], str, int | None]:
    """The catalog's published acceptance of a drafter: ({dataset: ref}, note, recommended K)."""
    if not drafter_name:
        return {}, "", None
    try:
        from autotune.catalogs import get_drafter

        spec = get_drafter(drafter_name, target=model)
    except (PeagleError, ValueError):
        return {}, "", None
    refs = dict(spec.reference_acceptance)
    note = ""
    if refs:
        first = next(iter(refs.values()))
        note = f"Stars: {_one_line(first['source'])}"
    return refs, note, spec.recommended_k


def _class_refs(cls: str, refs: dict[str, Any]) -> list[tuple[int, float, str]]:
    from autotune.workloads import REFERENCE_FOR_CLASS

    dataset = cls if cls in refs else REFERENCE_FOR_CLASS.get(cls)
    if dataset is None or dataset not in refs:
        return []
    ref = refs[dataset]
    return [(int(ref["k"]), float(ref["acceptance_length"]), f"published {dataset}")]


def _class_acceptance(
    name: str, profile: AcceptanceProfile, max_k: int, measured: bool, refs: list[tuple[int, float, str]]
) -> ClassAcceptance:
    survival = profile.survival().tolist()
    lows, highs = [], []
    for i in range(profile.max_k):
        lo, hi = profile.survival_interval(i, CONFIDENCE)
        lows.append(lo)
        highs.append(hi)
    als = profile.acceptance_lengths(max_k).tolist()
    al_lo, al_hi = [], []
    for k in range(max_k + 1):
        lo, hi = profile.acceptance_length_interval(k, CONFIDENCE)
        al_lo.append(lo)
        al_hi.append(hi)
    return ClassAcceptance(
        name=name,
        num_drafts=profile.num_drafts if measured else 0,
        survival=survival,
        survival_low=lows,
        survival_high=highs,
        acceptance_length=als,
        al_low=al_lo,
        al_high=al_hi,
        references=refs,
    )


def profile_acceptances(profile: ProfileRecord) -> tuple[dict[str, AcceptanceProfile], list[str]]:
    """Per-class `AcceptanceProfile`s of a stored profile, and notes on the classes that had to be skipped."""
    out: dict[str, AcceptanceProfile] = {}
    notes: list[str] = []
    for cls, entry in sorted(profile.acceptance.items()):
        counts = list(entry.get("accepted_per_position") or [])
        try:
            out[cls] = AcceptanceProfile(int(entry.get("num_drafts", 0)), tuple(counts))
        except ValueError as exc:
            notes.append(f"{profile_label(profile)}: class {cls!r} skipped ({exc})")
    return out, notes


def acceptance_from_profile(profile: ProfileRecord) -> tuple[AcceptanceData | None, list[str]]:
    """Measured acceptance per class and position (with 95% Clopper-Pearson intervals) and AL(K) for K <= max_k."""
    per_class, notes = profile_acceptances(profile)
    if not per_class:
        return None, notes + [f"{profile_label(profile)} holds no usable acceptance counts."]
    refs, ref_note, _ = _references(profile.drafter, profile.model)
    max_k = max(p.max_k for p in per_class.values())
    classes = [
        _class_acceptance(cls, p, p.max_k, True, _class_refs(cls, refs)) for cls, p in per_class.items()
    ]
    title = f"{short_name(profile.model)} / {short_name(profile.drafter)} on {profile.workload_name or '?'}"
    return (
        AcceptanceData(
            title=title,
            caption=measured_caption(profile),
            measured=True,
            classes=classes,
            max_k=max_k,
            reference_note=ref_note,
        ),
        notes,
    )


def acceptance_from_catalog(model: str, drafter: str, max_k: int | None = None) -> AcceptanceData | None:
    """AL(K) predicted from the drafter's published acceptance (one curve per published benchmark).

    Each curve is the constant-rate fit through the published point (`AcceptanceProfile.from_acceptance_length`),
    the same acceptance the model backend predicts with when no profile exists.
    """
    from autotune.catalogs import get_drafter
    from autotune.workloads import REFERENCE_FOR_CLASS

    try:
        spec = get_drafter(drafter, target=model)
    except (PeagleError, ValueError):
        return None
    refs = dict(spec.reference_acceptance)
    if not refs:
        return None
    depth = max_k or spec.trained_k or 8
    depth = max(1, min(depth, MAX_K))
    class_of = {dataset: cls for cls, dataset in REFERENCE_FOR_CLASS.items()}
    classes = []
    for dataset, ref in refs.items():
        prof = AcceptanceProfile.from_acceptance_length(float(ref["acceptance_length"]), int(ref["k"]), max_k=depth)
        name = f"{dataset} ({class_of[dataset]})" if dataset in class_of else dataset
        point = [(int(ref["k"]), float(ref["acceptance_length"]), f"published {dataset}")]
        classes.append(_class_acceptance(name, prof, depth, False, point))
    first = next(iter(refs.values()))
    return AcceptanceData(
        title=f"{short_name(model)} / {short_name(spec.name)}: published acceptance",
        caption=(
            f"Predicted: no measured profile; curves are the constant-rate fit through each published AL "
            f"(the acceptance the model backend uses). Stars: {_one_line(first['source'])}"
        ),
        measured=False,
        classes=classes,
        max_k=depth,
    )


# ------------------------------------------------------------------------------------------------ step cost


def _samples(profile: ProfileRecord) -> list[StepSample]:
    out = []
    for row in profile.step_costs:
        if float(row["step_ms"]) <= 0:
            continue
        out.append(
            StepSample(
                batch_size=int(row["batch_size"]),
                depth=int(row["depth"]),
                step_ms=float(row["step_ms"]),
                n=int(row.get("n", 1)),
                verified_tokens=row.get("verified_tokens"),
                drafter_ran=row.get("drafter_ran"),
            )
        )
    return out


def cost_model_of(profile: ProfileRecord) -> tuple[StepCostModel | None, str, dict[str, float] | None]:
    """The profile's step-cost model: (model, where it came from, fit error dict or None).

    The stored fitted model when there is one; otherwise a fit of the stored samples made here (said so).
    """
    if profile.cost_model:
        try:
            model = StepCostModel.from_dict(profile.cost_model)
        except ValueError:
            model = None
        if model is not None:
            stats = model.to_dict().get("fit_error")
            return model, "stored fitted step-cost model", stats
    samples = _samples(profile)
    if len(samples) >= 2:
        model = StepCostModel.fit(samples, sequential=not profile.parallel_drafting)
        return model, "step-cost model fitted here to the samples (none stored)", model.fit_error()
    return None, "", None


def fit_error_text(stats: dict[str, float] | None) -> str:
    if not stats:
        return "fit error not stored"
    n = int(stats.get("num_samples", 0))
    return (
        f"fit error: median {100 * stats['median_rel_error']:.1f}%, max {100 * stats['max_rel_error']:.1f}% "
        f"over {n} samples"
    )


def step_cost_from_profile(profile: ProfileRecord) -> StepCostData | None:
    """Measured step times T(B, K) and the fitted model's lines, per depth over the measured batch sizes."""
    samples = _samples(profile)
    model, origin, stats = cost_model_of(profile)
    if not samples and model is None:
        return None
    batch_sizes = sorted({s.batch_size for s in samples}) or [1, 8, 64]
    depths = sorted({s.depth for s in samples}) or list(range(profile.max_k + 1))
    lines: dict[int, list[tuple[int, float]]] = {}
    if model is not None:
        grid = _dense_batches(batch_sizes)
        for k in depths:
            at_k = [s for s in samples if s.depth == k]
            # Depth reached by trimming: the drafter still ran at K=0, so predict it that way too.
            ran = sum(s.drafted for s in at_k) * 2 > len(at_k) if at_k else None
            lines[k] = [(b, model.predict(b, k, drafter_ran=ran)) for b in grid]
    label = f"{origin} ({fit_error_text(stats)})" if model is not None else ""
    return StepCostData(
        title=f"Step time T(B, K): {short_name(profile.model)} / {short_name(profile.drafter)}",
        caption=measured_caption(profile) + " Lines are the fitted step-cost model (a prediction).",
        measured=True,
        samples=[(s.batch_size, s.depth, s.step_ms, s.n) for s in samples],
        model_lines=lines,
        model_label=label,
    )


def _dense_batches(batch_sizes: Sequence[int]) -> list[int]:
    lo, hi = min(batch_sizes), max(batch_sizes)
    grid = {lo, hi, *batch_sizes}
    b = 1
    while b < hi:
        if b > lo:
            grid.add(b)
        b *= 2
    return sorted(grid)


def goodput_from_profile(profile: ProfileRecord) -> GoodputData | None:
    """Predicted tokens/s = B * AL(K) / T(B, K) * 1000 from the profile's measured acceptance (classes pooled by
    their measured share of drafts) and its fitted step-cost model, at the measured batch sizes."""
    per_class, _ = profile_acceptances(profile)
    model, origin, stats = cost_model_of(profile)
    if not per_class or model is None:
        return None
    depth = min(p.max_k for p in per_class.values())
    pooled = AcceptanceProfile(
        sum(p.num_drafts for p in per_class.values()),
        tuple(sum(p.accepted_per_position[i] for p in per_class.values()) for i in range(depth)),
    )
    batch_sizes = sorted({int(r["batch_size"]) for r in profile.step_costs}) or [1, 8, 64]
    ks = list(range(depth + 1))
    values: dict[int, list[float]] = {}
    for b in batch_sizes:
        row = []
        for k in ks:
            t = model.predict(b, k)
            row.append(b * pooled.acceptance_length(k) / t * 1000.0 if t > 0 else math.nan)
        values[b] = row
    _, _, published_k = _references(profile.drafter, profile.model)
    classes = ", ".join(sorted(per_class))
    return GoodputData(
        title=f"Tokens/s vs K per batch size: {short_name(profile.model)} / {short_name(profile.drafter)}",
        caption=(
            f"Predicted from measured {profile_label(profile)} ({profile.device}, vLLM "
            f"{profile.vllm_version or '?'}, {_date(profile.created_at)}): tokens/s = B x AL(K) / T(B, K); AL "
            f"pooled over classes {classes} by their share of drafts; T from the {origin} ({fit_error_text(stats)}). "
            f"K stops at {depth}, the depth the profile measured."
        ),
        source="profile",
        ks=ks,
        tokens_per_s=values,
        published_k=published_k,
    )


# ------------------------------------------------------------------------------------------------ model backend


@dataclass(frozen=True)
class BackendContext:
    """What the model backend needs to predict the figures of a recommendation group."""

    model: str
    gpu: str
    workload: str
    config: SpecConfig
    """The speculative config whose drafter is plotted."""
    batch_sizes: list[int]


def backend_context(recs: Sequence[RecommendationRecord]) -> BackendContext | None:
    """The drafter/GPU/workload of a group of recommendations (same model, GPU, workload), for backend figures."""
    spec_configs = []
    for r in recs:
        try:
            c = SpecConfig.from_dict(r.best_config)
        except (PeagleError, TypeError):
            continue
        if c.speculative:
            spec_configs.append((r.scenario.get("concurrency") or 0, c))
    if not spec_configs:
        return None
    config = max(spec_configs, key=lambda t: t[0])[1]
    sizes = sorted({int(r.scenario["concurrency"]) for r in recs if r.scenario.get("concurrency")})
    if len(sizes) < 2:
        sizes = sorted({1, 8, 64, *sizes})
    first = recs[0]
    return BackendContext(first.model, first.gpu, first.workload_name or "mt-bench", config, sizes)


def goodput_from_backend(ctx: BackendContext, max_k: int = 8) -> tuple[GoodputData | None, str]:
    """Predicted tokens/s per K (0..max_k) and batch size from the model backend; (None, why) if it cannot run."""
    from autotune.profiling import predicted_goodput

    predicted = predicted_goodput(ctx.model, ctx.gpu, ctx.workload, ctx.config, ctx.batch_sizes, max_k)
    if predicted is None:
        return None, f"the model backend cannot load {ctx.model} / workload {ctx.workload}"
    values, provenance = predicted
    ks = list(range(max_k + 1))
    _, _, published_k = _references(ctx.config.drafter, ctx.model)
    pd = " +parallel drafting" if ctx.config.parallel_drafting else ""
    return (
        GoodputData(
            title=f"Tokens/s vs K per batch size: {short_name(ctx.model)} / {short_name(ctx.config.drafter)}{pd}",
            caption=(
                f"No measured profile: {provenance or 'predicted by the model backend'}; workload {ctx.workload}; "
                f"concurrency = batch size B, max_num_seqs = B."
            ),
            source="model backend",
            ks=ks,
            tokens_per_s=values,
            published_k=published_k,
        ),
        "",
    )


def step_cost_from_backend(ctx: BackendContext, max_k: int = 8) -> StepCostData | None:
    """The model backend's predicted step time per depth over batch size (roofline; nothing measured)."""
    from autotune.profiling import predicted_step_costs

    predicted = predicted_step_costs(ctx.model, ctx.gpu, ctx.config, _dense_batches(ctx.batch_sizes), max_k)
    if predicted is None:
        return None
    return StepCostData(
        title=f"Predicted step time T(B, K): {short_name(ctx.model)} / {short_name(ctx.config.drafter)}",
        caption=(
            f"Predicted by the model backend ({predicted.source}) for {predicted.device} (GPU assumed); "
            "nothing measured. Profile on the GPU to replace it with measurements."
        ),
        measured=False,
        samples=[],
        model_lines=predicted.lines,
        model_label=f"predicted ({predicted.source})",
    )


# ------------------------------------------------------------------------------------------------ trials


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


# ------------------------------------------------------------------------------------------------ simulations


@dataclass(frozen=True)
class SimulationData:
    """One stored simulation (``peagle-tune simulate``): predicted tokens/s and TPOT p50 against concurrency, one
    line per config, one row of panels per workload shape. Closed-loop rows only (an open-loop run has no
    concurrency axis)."""

    study: str
    title: str
    caption: str
    model: str
    device: str
    workloads: list[str]
    configs: list[str]
    """Config labels in the order simulated (no speculation first, the per-phase oracle last)."""
    tokens_per_s: dict[tuple[str, str], list[tuple[int, float]]]
    """(workload, config) -> [(concurrency, output tokens/s)], by concurrency."""
    tpot_ms_p50: dict[tuple[str, str], list[tuple[int, float]]]
    """(workload, config) -> [(concurrency, TPOT p50 in ms)]; the oracle has none (computed, not simulated)."""
    kinds: dict[str, str] = field(default_factory=dict)
    """config label -> kind ("none", "static", "schedule", "adaptive", "oracle")."""


SCHEDULE_LINE = "vLLM batch-size schedule"
"""The one line of a simulation's schedule rows (each row's label spells its own schedule)."""


def is_simulation_study(trials: Sequence[TrialRecord]) -> bool:
    """Whether a study's trials are the rows of a stored simulation (backend "simulate") rather than a search."""
    from autotune.simulate import SIMULATE_BACKEND

    return bool(trials) and all(t.backend == SIMULATE_BACKEND for t in trials)


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _finite_number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def simulation_data(study: str, trials: Sequence[TrialRecord]) -> tuple[SimulationData | None, str]:
    """A stored simulation's rows as plot series, or (None, why not). Never raises on odd rows: a row without a
    label, workload, concurrency or value is left out."""
    tps: dict[tuple[str, str], list[tuple[int, float]]] = {}
    tpot: dict[tuple[str, str], list[tuple[int, float]]] = {}
    workloads: list[str] = []
    configs: list[str] = []
    kinds: dict[str, str] = {}
    for t in trials:
        label, workload = t.config.get("label"), t.scenario.get("workload")
        c = _positive_int(t.scenario.get("concurrency"))
        if not isinstance(label, str) or not isinstance(workload, str) or c is None:
            continue
        if t.config.get("kind") == "schedule":
            label = SCHEDULE_LINE  # its label names the schedule, which changes with max_num_seqs: one line
        value = _finite_number(t.values.get("output_tokens_per_s"))
        if value is None:
            continue
        if workload not in workloads:
            workloads.append(workload)
        if label not in configs:
            configs.append(label)
        kinds.setdefault(label, str(t.config.get("kind") or "?"))
        tps.setdefault((workload, label), []).append((c, value))
        latency = _finite_number(t.values.get("tpot_ms_p50"))
        if latency is not None:
            tpot.setdefault((workload, label), []).append((c, latency))
    if not tps:
        return None, f"simulation {study} has no closed-loop rows with a tokens/s value (an open-loop run?)"
    first = trials[0]
    header = first.metrics.get("simulation")
    header = header if isinstance(header, dict) else {}
    device = str(header.get("device") or first.provenance.get("device") or "an unknown device")
    drafter = header.get("drafter")
    drafter_text = f", drafter {_one_line(drafter)}" if drafter else ""
    caption = (
        f"Simulated serving (peagle-tune simulate; nothing measured): {_one_line(first.model)}{drafter_text} on "
        f"{_one_line(device)} (GPU assumed). Acceptance: {_one_line(header.get('acceptance_source') or '?')}. "
        f"Step cost: {_one_line(header.get('step_cost_source') or '?')}. Study {study}, stored "
        f"{_date(first.created_at)}. TPOT p50 per request; the per-phase oracle is computed from the static "
        "configs' phase times and has no TPOT."
    )
    return SimulationData(
        study=study,
        title=f"Simulated serving: {short_name(first.model)} on {_one_line(device)}",
        caption=caption,
        model=first.model,
        device=device,
        workloads=workloads,
        configs=configs,
        tokens_per_s={k: sorted(v) for k, v in tps.items()},
        tpot_ms_p50={k: sorted(v) for k, v in tpot.items()},
        kinds=kinds,
    ), ""


# ------------------------------------------------------------------------------------------------ recommendations


def same_recommendation_key(rec: RecommendationRecord) -> tuple[str, ...]:
    """What makes two recommendations near-identical for a reader: the same GPU, workload, scenario and config
    (whatever the objective or run that stored them)."""
    return (rec.gpu, rec.workload_hash or rec.workload_name or "", json.dumps(rec.scenario, sort_keys=True),
            json.dumps(rec.best_config, sort_keys=True))


def distinct(recs: Sequence[RecommendationRecord]) -> list[tuple[RecommendationRecord, list[RecommendationRecord]]]:
    """One entry per distinct recommendation (`same_recommendation_key`), in `recs`' order (the first of each kept),
    with the near-identical ones it stands for."""
    groups: dict[tuple[str, ...], list[RecommendationRecord]] = {}
    for r in recs:
        groups.setdefault(same_recommendation_key(r), []).append(r)
    return [(items[0], items[1:]) for items in groups.values()]


@dataclass(frozen=True)
class DrafterRow:
    """One drafter variant's best config at one concurrency (a stored recommendation's ``per_drafter`` entry)."""

    concurrency: int
    drafter: str
    layers: int | None
    parallel_drafting: bool
    hypothetical: bool
    k: int | None
    max_num_seqs: int | None
    tokens_per_s: float | None
    speedup_vs_no_spec: float | None
    speedup_vs_eagle3: float | None
    eagle3_reference: bool
    recommended: bool


def drafter_rows(recs: Sequence[RecommendationRecord]) -> list[DrafterRow]:
    """P-EAGLE vs EAGLE-3 (and 2- vs 4-layer heads) per concurrency, from the recommendations' ``per_drafter``
    (search's comparison of every drafter variant at its best config), lowest concurrency first, fastest first
    within it. Entries another version wrote in another shape are skipped; numbers are kept only when numbers."""
    out: list[DrafterRow] = []
    for rec in sorted(recs, key=lambda r: _positive_int(r.scenario.get("concurrency")) or 0):
        concurrency = _positive_int(rec.scenario.get("concurrency"))
        entries = (rec.metrics or {}).get("per_drafter")
        if concurrency is None or not isinstance(entries, list):
            continue
        best = rec.best_config
        for e in entries:
            config = e.get("best_config") if isinstance(e, dict) else None
            if not isinstance(config, dict) or not isinstance(e.get("drafter"), str):
                continue
            variant = (config.get("drafter"), config.get("drafter_layers"), config.get("parallel_drafting"))
            out.append(DrafterRow(
                concurrency=concurrency,
                drafter=_one_line(re.sub(r":\d+-layer$", "", e["drafter"])),
                layers=_positive_int(e.get("layers")),
                parallel_drafting=e.get("parallel_drafting") is True,
                hypothetical=e.get("hypothetical") is True,
                k=_positive_int(config.get("num_speculative_tokens")),
                max_num_seqs=_positive_int(config.get("max_num_seqs")),
                tokens_per_s=_finite_number(e.get("output_tokens_per_s")),
                speedup_vs_no_spec=_finite_number(e.get("speedup_vs_no_spec")),
                speedup_vs_eagle3=_finite_number(e.get("speedup_vs_eagle3")),
                eagle3_reference=e.get("is_eagle3_reference") is True,
                recommended=variant == (best.get("drafter"), best.get("drafter_layers"), best.get("parallel_drafting")),
            ))
    return out


#: The published points (package data, with their sources) the model backend is calibrated against.
PUBLISHED_POINTS = "model_calibration.yaml"


@dataclass(frozen=True)
class PublishedRatio:
    """A published P-EAGLE over EAGLE-3 throughput ratio (each at its best K) at one concurrency: a figure
    (`low` = `high`) or a range, with the GPU it was measured on and its source."""

    point_id: str
    concurrency: int
    low: float
    high: float
    gpu: str
    """The GPU's catalog key (``b200``)."""
    label: str
    """The source in a few words (``vLLM PR #32887``)."""
    source: str
    """The source whole: what was measured, where and how."""


def source_label(source: str) -> str:
    """A source's first clause, outside brackets: ``vLLM PR #32628 (parallel token drafting for EAGLE-3, gpt-oss-120b):
    ...`` -> ``vLLM PR #32628 (parallel token drafting for EAGLE-3, gpt-oss-120b)``."""
    depth = 0
    for i, ch in enumerate(source):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch in ",:":
            return source[:i].strip()
    return source.strip()


def published_advantage(model: str) -> list[PublishedRatio]:
    """Every published P-EAGLE over EAGLE-3 ratio for `model` (any GPU; catalog names match whatever their
    spelling), lowest concurrency first, from the model backend's calibration points
    (``autotune/backends/model_calibration.yaml``)."""
    from importlib.resources import files

    import yaml

    from autotune.catalogs import model_names

    names = {k.lower(): v for k, v in model_names().items()}  # every name and alias -> the model's short name

    def canonical(name: str) -> str | None:
        return names.get(name.strip().lower())

    wanted = canonical(model) or model
    data = yaml.safe_load(files("autotune.backends").joinpath(PUBLISHED_POINTS).read_text(encoding="utf-8"))
    out: list[PublishedRatio] = []
    for p in data.get("points") or []:
        if p.get("metric") != "ratio" or canonical(str(p.get("model"))) != wanted:
            continue
        published = p["published"]
        low, high = (float(published[0]), float(published[1])) if isinstance(published, list) else \
            (float(published), float(published))
        out += [PublishedRatio(str(p["id"]), int(c), low, high, str(p["gpu"]), source_label(str(p["source"])),
                               " ".join(str(p["source"]).split())) for c in p.get("concurrencies") or []]
    return sorted(out, key=lambda r: (r.concurrency, r.point_id))


@dataclass(frozen=True)
class AdvantageData:
    """P-EAGLE's advantage over EAGLE-3 against concurrency for one search (GPU, workload, objective): each parallel
    drafting variant's predicted (or measured) ratio per concurrency beside the published ones."""

    title: str
    gpu: str
    """The search's GPU as a catalog key (published points on it are drawn filled, others hollow)."""
    series: dict[str, list[tuple[int, float]]]
    """Variant label -> (concurrency, speedup over EAGLE-3 at its best K)."""
    published: list[PublishedRatio]
    kind: str
    """"predicted", "measured" or "mixed": where the series' figures come from."""


def advantage_data(model: str, gpu: str, rows: Sequence[DrafterRow], title: str, kind: str) -> AdvantageData | None:
    """The advantage figure's data from `drafter_rows` (its parallel drafting variants with a speedup over an
    EAGLE-3 reference) and the published ratios for `model`; None when no variant has one."""
    from autotune.catalogs import get_gpu

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.parallel_drafting and r.speedup_vs_eagle3 is not None:
            label = f"{short_name(r.drafter)}{f' {r.layers}L' if r.layers else ''}{'*' if r.hypothetical else ''}"
            series.setdefault(label, []).append((r.concurrency, r.speedup_vs_eagle3))
    if not series:
        return None
    try:
        key = get_gpu(gpu).key
    except (PeagleError, ValueError):
        key = gpu
    return AdvantageData(title, key, series, published_advantage(model), kind)
