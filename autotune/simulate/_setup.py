"""What a simulation is built from: the step-cost source, the acceptance model, and the configs to compare.

Two starting points:

- `gpu_setup`: a catalog model on a catalog GPU. Step cost from the model backend's roofline (`RooflineStepCost`);
  acceptance per class from the drafter's published acceptance (the catalog's per-position curve through the
  published acceptance lengths: a prediction), or from measured profiles when given.
- `profile_setup`: a stored profile (``peagle-tune profile``): its measured acceptance per class and its fitted
  `policies.StepCostModel` (`FittedStepCost`), completed by the terms the fit cannot see (`profile_terms`: a skipped
  drafter's step measured in the profile, the drafter's cost per extra token derived from the two models' shapes).
  Steps are priced with the same model refitted on the profile's per-shape *mean* step times when it recorded them
  (`mean_cost_model`: a run pays the mean step; the stored fit, which the controller starts from, is on medians),
  else with the stored fit; the cost source says which. This is how the CPU fixtures are simulated for validation.

`Setup.configs` builds, for one ``max_num_seqs``: no speculation, static K = 1..K_max, vLLM's batch-size schedule
(best K per batch size predicted from the same cost and acceptance, as ``benchmarks/bench_runtime.py`` chooses it),
and the adaptive controller with trimming and with drafter-width control. The controller starts as it would in
production: priors from the class profiles, a linear step-cost model fitted to a profile of the device
(`controller_cost_model` for a GPU; the stored fit for a profile), the best static K for the mix as fallback.
Drafter-width control treats off-steps as the plugin's workers would for the drafter (`off_step_mode`: a token-only
``draft_model`` drafter skips and catches up; an EAGLE head, such as the GPU catalog's P-EAGLE drafters, runs a
one-slot sync pass). On a GPU (the roofline) steps other than a launch's uniform decode step pay the PIECEWISE
CUDA-graph penalty (`policies._graphs`), the controller launches at the static K and prices the penalty too, and the
plugin schedules async as vLLM does there (its decisions one step late); on a profile of the CPU build there are no
graphs and scheduling is synchronous.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autotune.catalogs import DrafterSpec, drafters_for, get_drafter, reference_survival, resolve_model
from autotune.errors import UsageError
from autotune.search.compare import TIE, tie_margin
from autotune.search.schedule import best_depth_per_batch, default_batch_sizes, merge_schedule
from autotune.simulate._acceptance import AcceptanceModel, RequestTrace
from autotune.simulate._configs import (
    OFF_STEP_MODES,
    Adaptive,
    BatchSizeSchedule,
    NoSpeculation,
    ServingConfig,
    StaticDepth,
    off_step_mode,
)
from autotune.simulate._cost import (
    FittedStepCost,
    RooflineStepCost,
    StepCostSource,
    StepShape,
    controller_cost_model,
)
from autotune.simulate._requests import Phase
from autotune.simulate._terms import ProfileTerms, mean_cost_model, profile_step_means, profile_terms
from autotune.spec import MAX_K, SpecConfig
from autotune.workloads import REFERENCE_FOR_CLASS
from policies import AcceptanceProfile, RequestPolicy, StepCostModel

if TYPE_CHECKING:
    from autotune.backends.model import Calibration

__all__ = [
    "CONFIG_KINDS",
    "SYNC_HOST_SHARE",
    "Setup",
    "gpu_setup",
    "mean_context",
    "profile_setup",
    "published_profiles",
    "token_weights",
]

CONFIG_KINDS = ("none", "static", "schedule", "adaptive", "adaptive-width")
SYNC_HOST_SHARE = 0.034
"""Host time per step that async scheduling overlaps and synchronous scheduling pays, as a share of the single-stream
step: vLLM PR #25872 measured ~3.4% TPOT at concurrency 1 from the overlap alone (EAGLE-3)."""


def tie_margin_for(step_cost_source: str) -> float:
    """The search's tie margin for figures priced by `step_cost_source`: the model backend's predicted spread when
    its roofline priced the steps (`autotune.search.compare.tie_margin`, as the search uses for the model
    backend), else 0.1% (`TIE`; a measured profile's fit)."""
    from autotune.backends._roofline import speedup_log_sigma

    return tie_margin(speedup_log_sigma()) if step_cost_source.startswith("model backend") else TIE


@dataclass
class Setup:
    """Everything a comparison needs besides the workload. ``context_tokens``: mean decoding context (tokens) for
    the schedule's and the controller's step-cost fits."""

    model: str
    drafter: str | None
    device: str
    cost: StepCostSource
    acceptance: AcceptanceModel
    max_k: int
    controller_cost: Mapping[bool, StepCostModel]
    """drafter_width -> the controller's step-cost model (trimming: False; drafter-width control: True)."""
    context_tokens: float
    policy: RequestPolicy | None = None
    """A user policy (classes, caps, controller settings); None: defaults with the predicted static fallback."""
    warnings: list[str] = field(default_factory=list)
    off_steps: str = "catch_up"
    """What drafter-width control does in a step where every depth is 0 (`off_step_mode` of the drafter)."""
    async_scheduling: bool | None = None
    """How the adaptive configs' plugin schedules; None: as vLLM would on the device (async on a GPU, whose
    `StepCostSource.full_graphs` is True; sync on the CPU build). Plain vLLM (no speculation, static, schedule) runs
    as vLLM would. Synchronous scheduling on a GPU pays the host time async overlaps: `SYNC_HOST_SHARE` of the
    launch's single-stream step, per step."""
    parallel_drafting: bool = True
    """The drafter drafts all positions in one pass (P-EAGLE, PARD): a vLLM schedule's K = 0 step still runs its
    K-slot pass (`BatchSizeSchedule`); a sequential drafter runs one pass then."""

    def uniform_step_ms(self, batch_size: int, k: int) -> float:
        """Predicted step time of B requests all verifying k drafts with the drafter at k (vLLM static K)."""
        return self.cost.step_ms(StepShape(batch_size, batch_size * (k + 1), k, self.context_tokens))

    def mixed_acceptance_length(self, k: int, token_weights: Mapping[str, float]) -> float:
        """AL(k) of the class mix: output tokens / request-steps, ``sum w / sum (w / AL_c)`` (token weights)."""
        if k == 0:
            return 1.0
        total = sum(token_weights.values())
        return total / sum(w / self.acceptance.acceptance_length(c, k) for c, w in token_weights.items() if w > 0)

    def best_static(self, batch_size: int, token_weights: Mapping[str, float]) -> int:
        """The static K >= 1 with the highest predicted goodput at this batch size by the search's pick rule (ties
        within `tie_margin_for` go to the smallest K): the controller's fallback and its launch K, as the search
        and `serve` pick it."""
        goodput = self._goodput(token_weights)
        return best_depth_per_batch(goodput, [batch_size], list(range(1, self.max_k + 1)),
                                    tie_margin_for(self.cost.label))[batch_size]

    def fastest_static(self, batch_size: int, token_weights: Mapping[str, float]) -> int:
        """The static K >= 1 with the highest predicted goodput at this batch size, no ties: the adaptive engine's
        launch K on a GPU (as the search stores it, `launch_k`). Only the launch K replays FULL graphs and the
        controller goes below it, never above, so it launches at the fastest K and falls back to `best_static`."""
        goodput = self._goodput(token_weights)
        return best_depth_per_batch(goodput, [batch_size], list(range(1, self.max_k + 1)))[batch_size]

    def schedule(self, max_num_seqs: int, token_weights: Mapping[str, float]) -> BatchSizeSchedule:
        """vLLM's batch-size schedule: best K in 0..K_max at powers of two up to max_num_seqs, merged (the pick
        rule of `best_static`, as `export --format schedule` builds it)."""
        goodput = self._goodput(token_weights)
        best = best_depth_per_batch(goodput, default_batch_sizes(max_num_seqs), list(range(self.max_k + 1)),
                                    tie_margin_for(self.cost.label))
        return BatchSizeSchedule(tuple(merge_schedule(best, max_num_seqs)),
                                 zero_depth_drafting=None if self.parallel_drafting else 1)

    def _goodput(self, token_weights: Mapping[str, float]) -> Any:
        def goodput(b: int, k: int) -> float:
            return 1000.0 * b * self.mixed_acceptance_length(k, token_weights) / self.uniform_step_ms(b, k)

        return goodput

    def configs(
        self,
        max_num_seqs: int,
        token_weights: Mapping[str, float],
        kinds: Iterable[str] = CONFIG_KINDS,
        static_ks: Sequence[int] | None = None,
    ) -> list[ServingConfig]:
        """The configs to compare at this ``max_num_seqs`` (see the module docstring)."""
        kinds = set(kinds)
        unknown = kinds - set(CONFIG_KINDS)
        if unknown:
            raise UsageError(f"unknown config kind(s) {sorted(unknown)}; known: {', '.join(CONFIG_KINDS)}.")
        out: list[ServingConfig] = []
        if "none" in kinds:
            out.append(NoSpeculation())
        if "static" in kinds:
            ks = static_ks if static_ks is not None else range(1, self.max_k + 1)
            out += [StaticDepth(k) for k in ks if 1 <= k <= self.max_k]
        if "schedule" in kinds:
            out.append(self.schedule(max_num_seqs, token_weights))
        if kinds & {"adaptive", "adaptive-width"}:
            policy = self.controller_policy(max_num_seqs, token_weights)
            priors = dict(self.acceptance.profiles)
            gpu = self.cost.full_graphs
            graphs = policy.max_k if gpu else None  # the launch's FULL-graph depth
            run_async = gpu if self.async_scheduling is None else self.async_scheduling
            host_ms = 0.0 if run_async or not gpu else SYNC_HOST_SHARE * self.uniform_step_ms(1, policy.max_k)
            if "adaptive" in kinds:
                out.append(Adaptive(policy, self.controller_cost[False].with_graphs(graphs), priors,
                                    drafter_width=False, async_scheduling=run_async, plugin_ms_per_step=host_ms))
            if "adaptive-width" in kinds:
                out.append(Adaptive(policy, self.controller_cost[True].with_graphs(graphs), priors,
                                    drafter_width=True, off_steps=self.off_steps, async_scheduling=run_async,
                                    plugin_ms_per_step=host_ms))
        return out

    def controller_policy(self, max_num_seqs: int, token_weights: Mapping[str, float]) -> RequestPolicy:
        """The user's policy (max_k clipped to the drafter's K), or defaults with the predicted best static K.

        On a device with FULL CUDA graphs the default launch is at the fastest static K (`fastest_static`), as
        `peagle-tune serve` launches there (the search's ``launch_k``): only the launch's K replays FULL graphs, so a
        deeper launch would pay the PIECEWISE penalty at every depth the controller picks below it
        (`policies._graphs`). Without graphs the launch is at the drafter's K."""
        if self.policy is not None:
            p = self.policy
            if p.max_k > self.max_k:
                p = replace(p, max_k=self.max_k, static_k=min(p.static_k, self.max_k))
            return p
        classes = sorted(token_weights)
        static_k = self.best_static(max_num_seqs, token_weights)
        launch_k = max(self.fastest_static(max_num_seqs, token_weights), static_k)
        return RequestPolicy(
            static_k=static_k,
            max_k=launch_k if self.cost.full_graphs else self.max_k,
            default_class=classes[0] if classes else "chat",
        )


def token_weights(workloads: Iterable[Sequence[Phase]]) -> dict[str, float]:
    """Output tokens per class over all phases of all workloads (the class mix the schedule is tuned for)."""
    weights: dict[str, float] = {}
    for phases in workloads:
        for phase in phases:
            for r in phase.requests:
                weights[r.cls] = weights.get(r.cls, 0.0) + r.output_tokens
    return weights


def mean_context(workloads: Iterable[Sequence[Phase]]) -> float:
    """Mean decoding context, tokens: prompt plus half the output, over all requests."""
    values = [r.prompt_tokens + r.output_tokens / 2.0 for phases in workloads for p in phases for r in p.requests]
    return sum(values) / len(values) if values else 1024.0


def published_profiles(
    drafter: DrafterSpec, classes: Sequence[str], max_k: int
) -> tuple[dict[str, AcceptanceProfile], dict[str, str], list[str]]:
    """Per class, a profile from the drafter's published acceptance: the catalog's per-position curve
    (`autotune.catalogs.reference_survival`, the same curve the model backend predicts with).

    A class maps to its reference benchmark (`REFERENCE_FOR_CLASS`: chat -> mt-bench, code -> humaneval, math ->
    gsm8k) or to a benchmark of its own name; an unmapped class gets the drafter's lowest published acceptance, with
    a warning. Returns (profiles, source per class, warnings).
    """
    refs = drafter.reference_acceptance
    if not refs:
        raise UsageError(
            f"drafter {drafter.name} has no published acceptance; simulate from a measured profile (--profile) "
            "instead."
        )
    profiles: dict[str, AcceptanceProfile] = {}
    sources: dict[str, str] = {}
    warnings: list[str] = []
    for cls in classes:
        dataset = cls if cls in refs else REFERENCE_FOR_CLASS.get(cls)
        if dataset not in refs:
            dataset = min(refs, key=lambda d: refs[d]["acceptance_length"] / (refs[d]["k"] + 1))
            warnings.append(f"class {cls!r} has no published benchmark; assumed {dataset}, the lowest published.")
        ref = refs[str(dataset)]
        profiles[cls] = AcceptanceProfile.from_survival(reference_survival(ref, max_k), num_drafts=100_000)
        sources[cls] = f"{dataset} AL {ref['acceptance_length']}@K={ref['k']}"
        if "nearest" in ref:
            sources[cls] = f"{ref['nearest']} AL {ref['acceptance_length']}@K={ref['k']} for {dataset}"
            warnings.append(f"{drafter.name} has no published acceptance on {dataset}; {ref['nearest']} is used.")
    return profiles, sources, warnings


def _default_drafter(model: str) -> DrafterSpec:
    candidates = drafters_for(model)
    published = [d for d in candidates if d.reference_acceptance]
    if not published:
        raise UsageError(
            f"no catalog drafter of {model} has published acceptance; pass --drafter and a measured --profile."
        )
    return next((d for d in published if d.parallel_drafting), published[0])


def gpu_setup(
    model: str,
    gpu: str | None,
    workloads: Mapping[str, Sequence[Phase]],
    *,
    drafter: str | None = None,
    max_k: int | None = None,
    calibration: Calibration | None = None,
    acceptance: Mapping[str, AcceptanceProfile] | None = None,
    acceptance_label: str | None = None,
    autocorrelation: float = 0.0,
    traces: Iterable[RequestTrace] = (),
    policy: RequestPolicy | None = None,
    seed: int = 0,
    controller_batch_sizes: Sequence[int] | None = None,
) -> Setup:
    """A catalog model and drafter on a catalog GPU (see the module docstring). ``acceptance``: measured class
    profiles replacing the published ones for those classes."""
    from autotune.backends.model import ModelBackend

    spec = resolve_model(model)
    d = get_drafter(drafter, target=spec) if drafter else _default_drafter(spec.name)
    k = max_k if max_k is not None else (d.trained_k or 8)
    if not 1 <= k <= MAX_K:
        raise UsageError(f"max_k (the drafter's K) must be in [1, {MAX_K}], but got {k}.")
    backend = ModelBackend(spec, gpu, calibration=calibration)
    config = SpecConfig(
        method=d.method,  # type: ignore[arg-type]
        drafter=d.name,
        num_speculative_tokens=k,
        parallel_drafting=d.parallel_drafting,
        drafter_layers=d.num_layers,
    )
    cost = RooflineStepCost(backend, config)
    classes = sorted({r.cls for phases in workloads.values() for p in phases for r in p.requests})
    measured = dict(acceptance or {})
    need = [c for c in classes if c not in measured]
    profiles: dict[str, AcceptanceProfile] = {}
    sources: dict[str, str] = {}
    warnings: list[str] = []
    if need:
        profiles, sources, warnings = published_profiles(d, need, k)
    for c in classes:
        if c in measured:
            profiles[c] = measured[c]
            sources[c] = acceptance_label or "measured profile"
    label = "published AL (" + ", ".join(f"{c}: {s}" for c, s in sorted(sources.items())) + ")"
    if measured and not need:
        label = acceptance_label or "measured profile"
    model_acc = AcceptanceModel(profiles, k, autocorrelation=autocorrelation, traces=traces, seed=seed, source=label)
    context = mean_context(workloads.values())
    sizes = list(controller_batch_sizes or default_batch_sizes(64))
    controller = {
        False: controller_cost_model(cost, k, sizes, context, drafter_always_runs=True),
        True: controller_cost_model(cost, k, sizes, context, drafter_always_runs=False),
    }
    return Setup(spec.name, d.name, backend.device, cost, model_acc, k, controller, context, policy, warnings,
                 off_step_mode(d.method), d.parallel_drafting)


def profile_setup(
    record: Any,
    workloads: Mapping[str, Sequence[Phase]],
    *,
    autocorrelation: float = 0.0,
    traces: Iterable[RequestTrace] = (),
    policy: RequestPolicy | None = None,
    step_overhead_ms: float = 0.0,
    seed: int = 0,
    device: str | None = None,
    terms: ProfileTerms | None = None,
    off_steps: str | None = None,
    step_means: bool = True,
) -> Setup:
    """A stored profile (a `store.ProfileRecord`, its dict, or a `autotune.profiling.ProfileResult`): measured
    acceptance per class and the fitted step-cost model (see the module docstring). ``step_means``: price steps
    with the model refitted on the profile's per-shape means when it has them (`profile_step_means`); False: the
    stored fit (on medians) as it is. The controller starts from the stored fit either way, as in production.
    ``terms``: the step-cost terms beyond the fit; None derives them from the record (`profile_terms`; from the
    per-shape means and the refit when steps are priced with them), ``ProfileTerms()`` prices none.
    ``off_steps``: what drafter-width control's off-steps do (e.g. as an engine's plugin statistics recorded it);
    None: `off_step_mode` of the record's ``method``."""
    from autotune.profiling import predictor_from_profile

    acceptance, fit = predictor_from_profile(record)

    def get(key: str) -> Any:
        return record.get(key) if isinstance(record, Mapping) else getattr(record, key, None)

    max_k = int(get("max_k") or max(p.max_k for p in acceptance.values()))
    classes = sorted({r.cls for phases in workloads.values() for p in phases for r in p.requests})
    missing = [c for c in classes if c not in acceptance]
    if missing:
        raise UsageError(
            f"the profile has acceptance for classes {sorted(acceptance)}, but the workload also has {missing}; "
            "profile those classes or choose the workload's classes with --classes."
        )
    pid = get("id") if get("id") is not None else get("profile_id")
    label = f"measured profile #{pid}" if pid is not None else "measured profile"
    means = profile_step_means(record) if step_means else None
    if means is None:
        cost_model, source, terms_record = fit, "fit on per-shape medians", record
    else:
        cost_model, source = mean_cost_model(fit, *means), "fit on per-shape means"
        terms_record = {"step_samples": means[0], "baseline_samples": means[1], "model": get("model"),
                        "drafter": get("drafter"), "prompt_steps": get("prompt_steps"), "notes": get("notes")}
    if terms is None:
        terms = profile_terms(terms_record, cost_model)
    cost = FittedStepCost(cost_model, label=f"fitted step-cost model of {label} ({source})",
                          step_overhead_ms=step_overhead_ms, drafter_token_ms=terms.drafter_token_ms,
                          idle_drafter_ms=terms.idle_drafter_ms, draft_fetch_ms=terms.draft_fetch_ms,
                          prompt_token_ms=terms.prompt_token_ms)
    model_acc = AcceptanceModel(
        {c: acceptance[c] for c in classes}, max_k, autocorrelation=autocorrelation, traces=traces, seed=seed,
        source=label,
    )
    provenance = get("provenance")
    dev = device or get("device") or (provenance.get("device") if isinstance(provenance, Mapping) else None)
    if dev is None and provenance is not None:
        dev = getattr(provenance, "device", None)
    if off_steps is not None and off_steps not in OFF_STEP_MODES:
        raise UsageError(f"off_steps must be one of {OFF_STEP_MODES}, but got {off_steps!r}.")
    off = off_step_mode(get("method")) if off_steps is None else off_steps
    return Setup(
        str(get("model") or "?"), get("drafter"), str(dev or "unknown device"), cost, model_acc, max_k,
        {False: fit, True: fit}, mean_context(workloads.values()), policy, off_steps=off,
        parallel_drafting=get("parallel_drafting") is not False,
    )
