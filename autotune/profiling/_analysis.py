"""From the plugin's statistics to a profile: acceptance per class, step-cost samples, the fitted cost model.

Pure (no vLLM): it works on `policies.plugin.PluginStats` read back from the engine, and on stored
profile records.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autotune.engine import SPEC_FIELDS, add_positions, empty_snapshot
from policies import AcceptanceProfile, StepCostModel, StepSample
from policies.plugin import PluginStats


def acceptance_per_class(
    stats: PluginStats, max_k: int, phases: Iterable[str]
) -> dict[str, AcceptanceProfile]:
    """Measured acceptance per class at full depth: the requests that verified exactly ``max_k`` drafts.

    Only full-depth steps are used, so every position is judged on the same drafts (prefix consistency then gives
    AL(K) for every K <= max_k). Classes that never verified at full depth are left out.
    """
    phases = list(phases)
    out = {}
    for cls in stats.classes(phases):
        profile = stats.acceptance(cls, max_k, phases)
        if profile is not None:
            out[cls] = profile
    return out


def phase_totals(stats: PluginStats, phases: Iterable[str]) -> dict[str, Any]:
    """The plugin's draft counters summed over ``phases`` (the same quantities as vLLM's spec-decode counters)."""
    wanted = set(phases)
    totals = empty_snapshot()
    for entry in stats.to_dict()["acceptance"]:
        if entry["phase"] not in wanted:
            continue
        n, depth, acc = entry["num_drafts"], entry["depth"], entry["accepted_per_position"]
        totals["num_drafts"] += n
        totals["num_draft_tokens"] += n * depth
        totals["num_accepted_tokens"] += sum(acc)
        add_positions(totals["accepted_per_position"], acc)
    return totals


def metrics_check(plugin: Mapping[str, Any], vllm: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the plugin's counters with vLLM's ``vllm:spec_decode_*`` deltas over the same phases.

    They count the same events (one draft per request per step that verified drafts; accepted tokens per position),
    so they must be equal; a mismatch means the plugin missed steps or misread the outputs.
    """
    width = max(len(plugin["accepted_per_position"]), len(vllm["accepted_per_position"]))

    def pad(v: list[int]) -> list[int]:
        return list(v) + [0] * (width - len(v))

    p_pos, v_pos = pad(plugin["accepted_per_position"]), pad(vllm["accepted_per_position"])
    match = all(int(plugin[f]) == int(vllm[f]) for f in SPEC_FIELDS) and p_pos == v_pos
    return {
        "match": match,
        "plugin": {**{f: int(plugin[f]) for f in SPEC_FIELDS}, "accepted_per_position": p_pos},
        "vllm": {**{f: int(vllm[f]) for f in SPEC_FIELDS}, "accepted_per_position": v_pos},
    }


def first_phase_outliers(phases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """First measured phases that ran slower than the later phases of their shape: a first use (a compile, the
    allocator growing, cold caches) that the warm-up did not take out of the figures.

    ``phases``: the worker's measured phases in launch order, with "concurrency", "max_k" (None: the launch's depth
    or plan), "step_ms" (mean ``LLMEngine.step`` ms) and "step_ms_iqr". A shape is (concurrency, max_k). Its first
    phase is an outlier when its mean step exceeds the median of the later phases' means by more than their spread:
    the range of those means, or, when wider, the median interquartile range of their single steps (one later phase
    has no range of means; a gap smaller than the spread of single steps is what a different mix of steps gives).
    Shapes measured once are not judged. Returns [{"phase", "index", "concurrency", "max_k", "step_ms",
    "later_median_ms", "spread_ms", "later_phases"}] in launch order.

    Example: means 30, 10, 11 ms at one shape (IQRs 1 ms) -> the first is an outlier (30 > 10.5 + 1).
    """
    shapes: dict[tuple[int, Any], list[tuple[int, Mapping[str, Any]]]] = {}
    for i, phase in enumerate(phases):
        if phase.get("step_ms") is not None:
            shapes.setdefault((int(phase["concurrency"]), phase.get("max_k")), []).append((i, phase))
    out = []
    for (concurrency, max_k), measured in shapes.items():
        if len(measured) < 2:
            continue
        (index, first), later = measured[0], [p for _, p in measured[1:]]
        means = [float(p["step_ms"]) for p in later]
        iqrs = [float(p["step_ms_iqr"]) for p in later if p.get("step_ms_iqr") is not None]
        spread = max(max(means) - min(means), statistics.median(iqrs) if iqrs else 0.0)
        median = statistics.median(means)
        if float(first["step_ms"]) > median + spread:
            out.append({
                "phase": first.get("name"), "index": index, "concurrency": concurrency, "max_k": max_k,
                "step_ms": float(first["step_ms"]), "later_median_ms": median, "spread_ms": spread,
                "later_phases": len(later),
            })
    return sorted(out, key=lambda o: int(o["index"]))


def outlier_warning(outlier: Mapping[str, Any]) -> str:
    """One line for the launch log: which first phase was slow, by how much, and what to do."""
    depth = "" if outlier.get("max_k") is None else f", K={outlier['max_k']}"
    return (
        f"warning: the first measured phase at concurrency {outlier['concurrency']}{depth} ({outlier['phase']}) "
        f"averaged {outlier['step_ms']:.1f} ms a step against {outlier['later_median_ms']:.1f} ms in the "
        f"{outlier['later_phases']} later phase(s) of that shape (spread {outlier['spread_ms']:.1f} ms): a first use "
        "landed in it; its figure is slow, measure again to confirm"
    )


def fit_cost_model(samples: list[StepSample], sequential: bool,
                   full_graph_depth: int | None = None) -> StepCostModel | None:
    """Least-squares `StepCostModel` of the measured samples (None with fewer than 2 samples). ``full_graph_depth``:
    the launch's K on a device with FULL CUDA graphs (`policies._graphs.full_graph_depth`), else None."""
    if len(samples) < 2:
        return None
    return StepCostModel.fit(samples, sequential=sequential, full_graph_depth=full_graph_depth)


def step_cost_entries(samples: Iterable[StepSample]) -> list[dict[str, Any]]:
    """Samples in the store's step_costs form (extra keys say how the step was shaped)."""
    return [
        {
            "batch_size": s.batch_size,
            "depth": s.depth,
            "step_ms": s.step_ms,
            "n": s.n,
            "verified_tokens": s.tokens,
            "drafter_ran": s.drafted,
        }
        for s in samples
    ]


def _get(record: Any, key: str) -> Any:
    if isinstance(record, Mapping):
        return record.get(key)
    return getattr(record, key, None)


def predictor_from_profile(record: Any) -> tuple[dict[str, AcceptanceProfile], StepCostModel]:
    """What the model backend needs to predict from a stored profile: measured acceptance per class and a cost model.

    ``record``: a `store.ProfileRecord`, its ``to_dict()``, or a `ProfileResult`. The cost model is the stored fit
    (``cost_model``) when there is one, else fitted here from the stored step costs. Use as
    ``ModelBackend(acceptance=acceptance, cost_model=cost_model)``.
    Raises ValueError when the profile has no acceptance or too few step-cost samples.
    """
    raw_acceptance = _get(record, "acceptance") or {}
    acceptance = {}
    for cls, entry in raw_acceptance.items():
        if isinstance(entry, AcceptanceProfile):
            acceptance[str(cls)] = entry
        else:
            acceptance[str(cls)] = AcceptanceProfile(int(entry["num_drafts"]), tuple(entry["accepted_per_position"]))
    if not acceptance:
        raise ValueError(
            f"Profile {_get(record, 'id')!r} has no acceptance per class; re-run `peagle-tune profile`."
        )
    cost = _get(record, "cost_model")
    if isinstance(cost, StepCostModel):
        return acceptance, cost
    if isinstance(cost, Mapping) and cost:
        return acceptance, StepCostModel.from_dict(cost)
    entries = _get(record, "step_costs") or _get(record, "step_samples") or []
    samples = [
        e if isinstance(e, StepSample) else StepSample(
            int(e["batch_size"]), int(e["depth"]), float(e["step_ms"]), n=int(e.get("n", 1)),
            verified_tokens=e.get("verified_tokens"), drafter_ran=e.get("drafter_ran"),
        )
        for e in entries
    ]
    parallel = bool(_get(record, "parallel_drafting"))
    model = fit_cost_model(samples, sequential=not parallel)
    if model is None:
        raise ValueError(
            f"Profile {_get(record, 'id')!r} has {len(samples)} step-cost sample(s); fitting a cost model needs "
            "at least 2. Re-run `peagle-tune profile` with more concurrencies or prompts."
        )
    return acceptance, model
