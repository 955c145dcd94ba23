"""Depth advice that comes with a recommendation: the best K per batch size (vLLM's batch-size -> K schedule) and
per workload class (the runtime policy's caps).

Both evaluate many configs the search never tried (every batch size, every K, each class alone), so they are only
computed with a backend that predicts (`Capabilities.predicts`); with a real engine they would need a profile, and
are left empty.
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.backends.base import Backend
from autotune.measurement import Measurement
from autotune.search.compare import tie_margin
from autotune.search.schedule import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule
from autotune.search.space import SearchSpace
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload

Measure = Callable[[SpecConfig, Workload, Scenario], Measurement]


def goodput(
    measure: Measure, config: SpecConfig, workload: Workload, spreads: list[float] | None = None
) -> Callable[[int, int], float]:
    """Output tokens/s of `config`'s drafter at batch b and depth k (k=0: no speculation), from `measure`; each
    figure's predicted spread (``prediction_log_sigma``, one sigma, log scale) is appended to `spreads`."""

    def value(b: int, k: int) -> float:
        c = config.with_(max_num_seqs=max(b, 1))
        if k:
            c = c.with_(num_speculative_tokens=k)
        else:
            c = SpecConfig(max_num_seqs=c.max_num_seqs, tensor_parallel_size=c.tensor_parallel_size)
        m = measure(c, workload, Scenario(concurrency=b))
        sigma = (m.extra or {}).get("prediction_log_sigma")
        if spreads is not None and isinstance(sigma, int | float):
            spreads.append(float(sigma))
        return float(m.output_tokens_per_s or 0.0) if m.ok else 0.0

    return value


def _depths(space: SearchSpace) -> list[int]:
    return [0, *range(space.k_min, space.k_max + 1)]


def depth_schedule(
    backend: Backend, measure: Measure, config: SpecConfig, workload: Workload, space: SearchSpace
) -> list[ScheduleEntry]:
    """Best K per batch-size range for `config`'s drafter, up to its max_num_seqs ([] unless `backend` predicts)."""
    if not backend.capabilities.predicts:
        return []
    sizes = default_batch_sizes(max(config.max_num_seqs, 1))
    return merge_schedule(_best_depths(measure, config, workload, sizes, space), config.max_num_seqs)


def _best_depths(
    measure: Measure, config: SpecConfig, workload: Workload, sizes: list[int], space: SearchSpace
) -> dict[int, int]:
    """The best K per batch size by the search's pick rule: ties within the predictions' spread (`tie_margin`) go
    to the smallest K, so the schedule names the K the search picked at the concurrency."""
    spreads: list[float] = []
    value = goodput(measure, config, workload, spreads)
    figures = {(b, k): value(b, k) for b in sizes for k in _depths(space)}
    return best_depth_per_batch(lambda b, k: figures[b, k], sizes, _depths(space),
                                tie_margin(max(spreads, default=0.0)))


def class_caps(
    backend: Backend, config: SpecConfig, workload: Workload, scenario: Scenario, space: SearchSpace
) -> dict[str, dict[str, int]]:
    """Per-class K cap: the best K for each workload class alone at `scenario` ({} unless `backend` predicts)."""
    if not backend.capabilities.predicts or len(workload.classes) < 1:
        return {}
    out: dict[str, dict[str, int]] = {}
    for cls, reqs in sorted(workload.classes.items()):
        sub = Workload(f"{workload.name}:{cls}", {cls: reqs}, workload.source)
        best = _best_depths(backend.measure, config, sub, [scenario.concurrency], space)
        out[cls] = {"max_k": best[scenario.concurrency]}
    return out
