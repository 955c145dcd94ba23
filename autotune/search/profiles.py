"""Drafter profiles for model-guided search: reuse a stored one, or profile the drafter with one engine launch.

The search (not the strategy) owns this: `Search` hands `store_or_profile`, bound to its store, backend and model,
to the strategy context, and a strategy asks ``ctx.profile(drafter)``. Profiling uses the backend's own engine
options (`Backend.options`), so a profile is taken the way the trials it predicts are measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.base import Backend
from autotune.errors import UsageError
from autotune.search.space import DrafterChoice
from autotune.workloads import Workload
from store import Store

if TYPE_CHECKING:
    from autotune.search.strategy import StrategyContext


@dataclass
class DrafterProfile:
    """What model-guided predicts one drafter from: a measured profile (acceptance per class, fitted step cost)."""

    drafter: str
    acceptance: dict[str, Any]
    """Workload class -> `policies.AcceptanceProfile` (measured)."""
    cost_model: Any
    """`policies.StepCostModel` fitted on the profile's measured step times."""
    label: str
    """Where it came from, e.g. ``stored profile #3`` or ``new profile #4``."""
    profile_id: int | None = None
    launches: int = 0
    """Engine launches spent to get it in this search (0: a stored profile was reused)."""


def _drafter_names(name: str) -> list[str]:
    """The names a stored profile of drafter `name` may be filed under (as given, resolved path, vLLM-safe alias)."""
    out = [name]
    if Path(name).expanduser().is_dir():
        from autotune.engine import safe_draft_model_path

        resolved = str(Path(name).expanduser().resolve())
        out += [resolved, safe_draft_model_path(resolved, create=False)]  # a name to look up; no link needed
    return list(dict.fromkeys(out))


def stored_profile(
    store: Store, model: str, device: str, workload: Workload, drafter: DrafterChoice, k_max: int
) -> Any | None:
    """The newest stored profile of `drafter` for `model` on `device` and `workload` (same content hash) that covers
    K up to `k_max`, or None."""
    for name in _drafter_names(drafter.name):
        record = store.latest_profile(model, drafter=name, device=device, workload_hash=workload.content_hash())
        if record is not None and int(record.max_k) >= k_max:
            return record
    return None


def store_or_profile(
    ctx: StrategyContext,
    drafter: DrafterChoice,
    *,
    store: Store,
    backend: Backend,
    model: str,
    device: str,
    concurrencies: Sequence[int] = (),
) -> DrafterProfile:
    """Reuse the stored profile of `drafter` (same model, drafter, device, workload hash; K_max >= the space's), else
    profile it with ONE engine launch on `backend`'s target with its engine options, at concurrency 1, the
    scenario's and `concurrencies`, and store it.

    Raises UsageError when there is no stored profile and the backend cannot launch an engine, or profiling fails.
    """
    from autotune.profiling import predictor_from_profile, profile

    workload, k_max = ctx.workload, ctx.space.k_max
    record = stored_profile(store, model, device, workload, drafter, k_max)
    if record is not None:
        acceptance, cost = predictor_from_profile(record)
        return DrafterProfile(drafter.name, acceptance, cost, f"stored profile #{record.id}", record.id, 0)
    target, options = backend.target_model, backend.options
    if target is None or options is None:
        raise UsageError(
            f"--strategy model-guided predicts from a profile, but none is stored for drafter {drafter.name} with "
            f"model {model} on {device} and workload {workload.name} (hash {workload.content_hash()[:12]}, "
            f"K_max >= {k_max}), and the {backend.name} backend cannot make one. Run `peagle-tune profile` for it, "
            "use --backend vllm, or use --strategy blackbox."
        )
    [result] = profile(
        target, [drafter.name], workload, concurrencies=sorted({1, ctx.scenario.concurrency, *concurrencies}),
        max_k=k_max, store=store, model_name=model, method=drafter.method,
        parallel_drafting=ctx.space.parallel_options(drafter)[0], options=options,
    )
    if not result.ok or result.cost_model is None:
        raise UsageError(
            f"Profiling drafter {drafter.name} failed ({result.failure_kind}: {result.failure_reason}), so "
            "model-guided has nothing to predict from. Fix the cause (see the engine log) or use --strategy blackbox."
        )
    label = f"new profile #{result.profile_id}" if result.profile_id is not None else "new profile"
    return DrafterProfile(drafter.name, dict(result.acceptance), result.cost_model, label, result.profile_id,
                          result.engine_launches)
