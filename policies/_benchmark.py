"""How long one depth decision takes on this machine: the number behind "the controller costs microseconds per step"."""

from __future__ import annotations

import time

import numpy as np

from policies._batch import RequestView, TrackedBatch
from policies._controller import DepthController
from policies._estimator import AcceptanceEstimator
from policies._step_cost import StepCostModel

__all__ = ["benchmark_decision_time"]


def benchmark_decision_time(
    batch_size: int = 256, repeats: int = 2000, max_k: int = 8, tracked: bool = True
) -> float:
    """Mean wall time of one `DepthController.decide` in µs (measured here, on this machine).

    3 classes, every 7th request capped at 3, every 50th opted out; tables refresh every 16 decisions (the default).
    Each step one request finishes and another of a different class joins, so the composition changes and every
    call takes the full path (never the "same batch as last step" shortcut). ``tracked=True`` keeps the batch in a
    `TrackedBatch` (the add/remove is included in the time); ``tracked=False`` passes a list, which adds the O(B)
    counting of the batch.
    """
    cost = StepCostModel(
        {"base": 6.0, "per_request": 0.04, "per_verified_token": 0.015, "drafter_fixed": 1.2,
         "drafter_per_request": 0.01}
    )
    est = AcceptanceEstimator(max_k)
    rng = np.random.default_rng(0)
    for cls, rate in (("code", 0.8), ("math", 0.7), ("chat", 0.55)):
        drafted = np.full(200, max_k)
        accepted = np.minimum(rng.geometric(1 - rate, 200) - 1, max_k)
        est.observe_many(cls, drafted, accepted)
    ctl = DepthController(cost, est, max_k=max_k, static_k=min(5, max_k), explore_every=0)
    names = ("code", "math", "chat")

    def view(i: int) -> RequestView:
        return RequestView(f"r{i}", names[i % 3], max_k=3 if i % 7 == 0 else None, speculate=i % 50 != 1)

    views = [view(i) for i in range(batch_size)]
    batch = TrackedBatch(views)
    total = 0.0
    for step in range(repeats + 50):
        # one request leaves, one of another class joins
        start = time.perf_counter()
        if tracked:
            batch.remove(views[step % batch_size].request_id)
            fresh = view(batch_size + step)
            batch.add(fresh)
            ctl.decide(batch)
        else:
            fresh = view(batch_size + step)
            ctl.decide(views)
        elapsed = time.perf_counter() - start
        views[step % batch_size] = fresh
        if step >= 50:
            total += elapsed
    return total / repeats * 1e6
