"""Run several configs on the same workloads and loads, and compute the per-phase oracle.

The per-phase oracle is computed, not simulated: in closed loop the phases are separated by a barrier, so serving
each phase with its own best static config (no speculation included) takes the sum over phases of the shortest
static phase time. It is the ceiling a controller that knew each phase in advance could reach with static depths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from autotune.errors import UsageError
from autotune.simulate._acceptance import AcceptanceModel
from autotune.simulate._configs import ServingConfig
from autotune.simulate._cost import StepCostSource
from autotune.simulate._engine import SimRun, simulate
from autotune.simulate._requests import Phase
from autotune.simulate._result import ConfigResult, result_from_run

__all__ = ["ORACLE_LABEL", "oracle_result", "run_configs"]

ORACLE_LABEL = "per-phase oracle"


def oracle_result(
    runs: Sequence[tuple[ServingConfig, SimRun]], workload: str, concurrency: int | None
) -> ConfigResult | None:
    """The per-phase oracle over the static configs (kinds "none" and "static") of one workload and load."""
    statics = [(c, r) for c, r in runs if c.kind in ("none", "static")]
    if not statics:
        return None
    n_phases = len(statics[0][1].phase_spans)
    total_ms = 0.0
    tokens = 0
    choice = []
    phase_tps = []
    for p in range(n_phases):
        best_cfg, best_ms, best_tokens = None, float("inf"), 0
        for cfg, run in statics:
            start, end, tok = run.phase_spans[p]
            if end - start < best_ms:
                best_cfg, best_ms, best_tokens = cfg, end - start, tok
        assert best_cfg is not None
        total_ms += best_ms
        tokens += best_tokens
        choice.append(best_cfg.label)
        phase_tps.append(best_tokens / best_ms * 1000.0 if best_ms > 0 else 0.0)
    return ConfigResult(
        config=ORACLE_LABEL,
        kind="oracle",
        workload=workload,
        concurrency=concurrency,
        request_rate=None,
        output_tokens=tokens,
        duration_s=total_ms / 1000.0,
        output_tokens_per_s=tokens / total_ms * 1000.0 if total_ms > 0 else 0.0,
        phase_tokens_per_s=tuple(phase_tps),
        notes={"per_phase": choice},
    )


def run_configs(
    workloads: Mapping[str, Sequence[Phase]],
    configs_for: Callable[[int], Sequence[ServingConfig]],
    cost: StepCostSource,
    acceptance: AcceptanceModel,
    *,
    concurrencies: Sequence[int] = (),
    request_rate: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int = 8192,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[ConfigResult]:
    """Every config on every workload at every load; rows in that order, the oracle after each group's configs.

    Closed loop: one group per concurrency c, with ``max_num_seqs`` = c unless given. Open loop
    (``request_rate``): one group, ``max_num_seqs`` default 256. ``configs_for(max_num_seqs)`` builds the configs
    of a group (the batch-size schedule and the static fallback depend on it). Speedups are over the group's
    no-speculation row.
    """
    if request_rate is None and not concurrencies:
        raise UsageError("run_configs needs concurrencies (closed loop) or a request_rate (open loop).")
    loads: list[tuple[int | None, float | None]] = (
        [(None, request_rate)] if request_rate is not None else [(c, None) for c in concurrencies]
    )
    rows: list[ConfigResult] = []
    for name, phases in workloads.items():
        for concurrency, rate in loads:
            seqs = max_num_seqs if max_num_seqs is not None else (concurrency if concurrency is not None else 256)
            group: list[ConfigResult] = []
            runs: list[tuple[ServingConfig, SimRun]] = []
            for config in configs_for(seqs):
                if progress is not None:
                    load = f"c={concurrency}" if concurrency is not None else f"{rate} req/s"
                    progress(f"{name} {load}: {config.label}")
                run = simulate(
                    phases, config, cost, acceptance,
                    concurrency=concurrency, request_rate=rate, max_num_seqs=seqs,
                    max_num_batched_tokens=max_num_batched_tokens, seed=seed,
                )
                runs.append((config, run))
                group.append(result_from_run(run, config.kind, name, concurrency, rate))
            if concurrency is not None:
                oracle = oracle_result(runs, name, concurrency)
                if oracle is not None:
                    group.append(oracle)
            base = next((r for r in group if r.kind == "none"), None)
            if base is not None:
                group = [r.with_speedup(base.output_tokens_per_s) for r in group]
            rows.extend(group)
    return rows
