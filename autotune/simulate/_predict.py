"""`predict`: a whole comparison from a `Setup` and workloads, returned as a `SimulationResult` (predicted)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from autotune.measurement import Provenance
from autotune.simulate._compare import run_configs
from autotune.simulate._requests import Phase
from autotune.simulate._result import SimulationResult
from autotune.simulate._setup import CONFIG_KINDS, Setup, token_weights

__all__ = ["predict"]


def predict(
    setup: Setup,
    workloads: Mapping[str, Sequence[Phase]],
    *,
    concurrencies: Sequence[int] = (),
    request_rate: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int = 8192,
    kinds: Iterable[str] = CONFIG_KINDS,
    static_ks: Sequence[int] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> SimulationResult:
    """Simulate every config of ``kinds`` on every workload at every load (see `run_configs`).

    The class mix the batch-size schedule and the static fallback are tuned for is the output-token share of each
    class over all ``workloads``. Every figure of the result is predicted.
    """
    kinds = tuple(kinds)
    weights = token_weights(workloads.values())
    rows = run_configs(
        workloads,
        lambda seqs: setup.configs(seqs, weights, kinds, static_ks),
        setup.cost,
        setup.acceptance,
        concurrencies=concurrencies,
        request_rate=request_rate,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        seed=seed,
        progress=progress,
    )
    acceptance = setup.acceptance.describe()
    provenance = Provenance(
        kind="predicted",
        backend="simulate",
        device=setup.device,
        profile=f"acceptance: {acceptance}; step cost: {setup.cost.label}",
    )
    fit = setup.controller_cost[False]
    try:
        fit_error: dict[str, float] | None = fit.fit_error()
    except ValueError:
        fit_error = None
    policy = setup.policy
    return SimulationResult(
        provenance=provenance,
        model=setup.model,
        drafter=setup.drafter,
        device=setup.device,
        acceptance_source=acceptance,
        step_cost_source=setup.cost.label,
        controller_cost_fit=fit_error,
        settings={
            "max_k": setup.max_k,
            "concurrencies": list(concurrencies),
            "request_rate": request_rate,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "seed": seed,
            "autocorrelation": setup.acceptance.autocorrelation,
            "class_token_weights": weights,
            "context_tokens": setup.context_tokens,
            "controller": None if policy is None else policy.controller.to_dict(),
            "workloads": {name: [p.name for p in phases] for name, phases in workloads.items()},
            "cuda_graphs": setup.cost.full_graphs,
            "async_scheduling": setup.cost.full_graphs if setup.async_scheduling is None else setup.async_scheduling,
        },
        rows=rows,
        warnings=list(setup.warnings),
    )
