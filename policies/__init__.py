"""peagle-tune's online side: acceptance math, acceptance estimator, step-cost model, depth controller and
request policies. The core is pure Python/numpy/scipy and imports no vLLM or torch."""

from __future__ import annotations

from policies._acceptance import (
    AcceptanceProfile,
    acceptance_length,
    acceptance_lengths,
    conditional_rates,
    mix,
)

__all__ = [
    "AcceptanceProfile",
    "acceptance_length",
    "acceptance_lengths",
    "conditional_rates",
    "mix",
]
