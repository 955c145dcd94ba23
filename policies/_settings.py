"""Tunables of the depth controller: the ``controller`` section of a policy file (see `policies.DepthController`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ControllerSettings"]


@dataclass(frozen=True)
class ControllerSettings:
    """Tunables of `DepthController` (the ``controller`` section of a policy file)."""

    hysteresis: float = 0.03
    """Switch plans only when the new one is predicted to be this much better (0.03 = 3%)."""
    patience: int = 32
    """...or when the same new plan has been preferred for this many consecutive steps."""
    refresh_every: int = 16
    """Rebuild the per-class AL tables and cost coefficients every this many decisions."""
    per_request: bool = True
    """Choose depths per request class (True) or one uniform depth for the batch (False)."""
    drafter_always_runs: bool = True
    """True when depth is applied by trimming drafts (the drafter runs at its configured K even at depth 0)."""
    explore_every: int = 16
    """Every this many steps, one request per class below its cap verifies at its cap (0: never)."""
    explore_budget: float = 0.02
    """While the drafter is off (drafter-width control), explore only as often as keeps the exploration cost (its
    catch-up, measured once seen, a drafter pass and the extra verified tokens) within this fraction of the step time
    (0: never while off)."""
    run_steps: float = 16.0
    """Prior mean length of a drafting run, decisions: turning an idle drafter on must gain its catch-up pass over
    this many steps (the controller then learns the length from its own runs)."""
    reoptimize_churn: float = 0.05
    """Between table refreshes, re-run the depth optimisation only once this fraction of the batch has changed since
    the last optimisation (0: every step); otherwise the last optimum is reused and only re-priced."""
    learn_step_cost: bool = True
    """Refine the step-cost model online from measured step times passed to `observe_step`."""
    decay: float = 0.98
    """Acceptance estimator forgetting factor per step (used when the policy builds the estimator)."""
    prior_strength: float = 20.0
    """Pseudo-trials per position a stored profile is worth in the estimator's prior."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.hysteresis) and 0.0 <= self.hysteresis < 1.0):
            raise ValueError(f"hysteresis must be in [0, 1) (0.03 = 3%), but got {self.hysteresis}.")
        for name in ("patience", "refresh_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, but got {value!r}.")
        if isinstance(self.explore_every, bool) or not isinstance(self.explore_every, int) or self.explore_every < 0:
            raise ValueError(f"explore_every must be an integer >= 0 (0: never), but got {self.explore_every!r}.")
        if not (math.isfinite(self.reoptimize_churn) and 0.0 <= self.reoptimize_churn <= 1.0):
            raise ValueError(
                f"reoptimize_churn must be in [0, 1] (a fraction of the batch), but got {self.reoptimize_churn}."
            )
        if not (math.isfinite(self.explore_budget) and 0.0 <= self.explore_budget < 1.0):
            raise ValueError(f"explore_budget must be in [0, 1) (0.02 = 2% of the step time), but got "
                             f"{self.explore_budget}.")
        if not (math.isfinite(self.run_steps) and self.run_steps >= 1.0):
            raise ValueError(f"run_steps must be >= 1 (decisions), but got {self.run_steps}.")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], e.g. 0.98, but got {self.decay}.")
        if not (math.isfinite(self.prior_strength) and self.prior_strength >= 0):
            raise ValueError(f"prior_strength must be >= 0, but got {self.prior_strength}.")

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

