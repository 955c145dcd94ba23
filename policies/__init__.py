"""peagle-tune's online side: acceptance math, live acceptance estimator, step-cost model, depth controller and
request policies.

The core is pure Python/numpy/scipy and imports no vLLM or torch. Implementation lives in private modules; import
the public names from here, e.g. ``from policies import DepthController``.
"""

from __future__ import annotations

from policies._acceptance import (
    AcceptanceProfile,
    acceptance_length,
    acceptance_lengths,
    conditional_rates,
    mix,
)
from policies._controller import (
    ControllerSettings,
    Decision,
    DepthController,
    RequestView,
    TrackedBatch,
    benchmark_decision_time,
)
from policies._estimator import AcceptanceEstimator
from policies._request_policy import (
    MAX_K,
    POLICY_FORMAT_VERSION,
    ClassPolicy,
    PolicyFile,
    PolicyFileError,
    RequestPolicy,
    classify_prompt,
    load_policy,
)
from policies._step_cost import (
    FEATURES,
    PARALLEL_FEATURES,
    SEQUENTIAL_FEATURES,
    StepCostModel,
    StepSample,
    tokens_per_second,
)

__all__ = [
    "FEATURES",
    "MAX_K",
    "PARALLEL_FEATURES",
    "POLICY_FORMAT_VERSION",
    "SEQUENTIAL_FEATURES",
    "AcceptanceEstimator",
    "AcceptanceProfile",
    "ClassPolicy",
    "ControllerSettings",
    "Decision",
    "DepthController",
    "PolicyFile",
    "PolicyFileError",
    "RequestPolicy",
    "RequestView",
    "StepCostModel",
    "StepSample",
    "TrackedBatch",
    "acceptance_length",
    "acceptance_lengths",
    "benchmark_decision_time",
    "classify_prompt",
    "conditional_rates",
    "load_policy",
    "mix",
    "tokens_per_second",
]
