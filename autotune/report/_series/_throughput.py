"""Step time T(B, K) and predicted tokens/s against K per batch size: from a stored profile (measured samples and
its fitted step-cost model) or from the model backend (roofline; nothing measured)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import PeagleError
from autotune.report._series._acceptance import profile_acceptances, published_references
from autotune.report._series._labels import date_text, measured_caption, profile_label, short_name
from autotune.search.compare import TIE, pick_tied, tie_margin, tie_note
from autotune.spec import SpecConfig
from policies import AcceptanceProfile, StepCostModel, StepSample
from store import ProfileRecord, RecommendationRecord


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
    margin: float = TIE
    """Relative gap under which two K tie (`autotune.search.compare.tie_margin`): the model backend's predicted
    spread for its figures, 0.1% otherwise."""

    def _tied(self, batch_size: int) -> tuple[int, list[int]] | None:
        pairs = [(k, v) for k, v in zip(self.ks, self.tokens_per_s[batch_size], strict=True) if math.isfinite(v)]
        if not pairs:
            return None
        chosen, tied = pick_tied(pairs, lambda p: p[1], self.margin, lambda p: p[0])
        return chosen[0], [k for k, _ in tied]

    def best_k(self, batch_size: int) -> int | None:
        """The search's pick rule (`autotune.search.compare.pick_tied`): the smallest K within `margin` of the
        highest tokens/s at `batch_size`, as the search and the schedule pick; None if all are nan."""
        tied = self._tied(batch_size)
        return None if tied is None else tied[0]

    def caption_with_ties(self) -> str:
        """The caption, then each batch size where several K tie: which, and the K chosen (`tie_note`)."""
        ties = [f"B = {b}: {note}." for b in sorted(self.tokens_per_s) if (note := self.tie_note(b))]
        return " ".join([self.caption, *ties])

    def tie_note(self, batch_size: int) -> str | None:
        """``K 3-5 within 4.8%; K=3 chosen: fewer verified tokens`` when several K tie at `batch_size`."""
        tied = self._tied(batch_size)
        return None if tied is None else tie_note(tied[1], tied[0], self.margin)


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
    _, _, published_k = published_references(profile.drafter, profile.model)
    classes = ", ".join(sorted(per_class))
    return GoodputData(
        title=f"Tokens/s vs K per batch size: {short_name(profile.model)} / {short_name(profile.drafter)}",
        caption=(
            f"Predicted from measured {profile_label(profile)} ({profile.device}, vLLM "
            f"{profile.vllm_version or '?'}, {date_text(profile.created_at)}): tokens/s = B x AL(K) / T(B, K); AL "
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
    from autotune.backends._roofline import speedup_log_sigma
    from autotune.profiling import predicted_goodput

    predicted = predicted_goodput(ctx.model, ctx.gpu, ctx.workload, ctx.config, ctx.batch_sizes, max_k)
    if predicted is None:
        return None, f"the model backend cannot load {ctx.model} / workload {ctx.workload}"
    values, provenance = predicted
    ks = list(range(max_k + 1))
    _, _, published_k = published_references(ctx.config.drafter, ctx.model)
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
            margin=tie_margin(speedup_log_sigma()),
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
