"""peagle-tune's online side: acceptance math, live acceptance estimator, step-cost model, depth controller, request
policies and the scheduler plugin's depth rules.

The core is pure Python/numpy/scipy and imports no vLLM or torch. Implementation lives in private modules; import
the public names from here, e.g. ``from policies import DepthController``. The scheduler plugin's wire contract
(config, stats, request labels, metrics) is `policies.plugin`; its vLLM adapter `policies.plugin.scheduler` is
imported only by the engine process. Errors: `policies.errors` (root `PolicyError`).

Layers, inner first: `_acceptance` (AL math) <- `_estimator` (live acceptance) and `_step_cost` (T(B, K)) <-
`_batch` (request views, decisions), `_settings` <- `_controller` (per-step depth choice) <- `_request_policy`
(classes, caps, policy files); `_depth_rules` (what the plugin verifies and drafts) stands alone.
"""

from __future__ import annotations

from policies._acceptance import (
    AcceptanceProfile,
    acceptance_length,
    acceptance_lengths,
    conditional_rates,
    mix,
)
from policies._batch import Decision, RequestView, StepTally, TrackedBatch
from policies._benchmark import benchmark_decision_time
from policies._controller import DepthController
from policies._depth_rules import DepthRules, PlanClock, request_outcome
from policies._estimator import AcceptanceEstimator
from policies._files import (
    YAML_MAX_DEPTH,
    YAML_MAX_EXPANDED,
    YAMLDocumentError,
    decode_json_at,
    load_json_text,
    load_yaml_text,
    read_text,
)
from policies._off_steps import MAX_CATCH_UP_TOKENS, OFF_STEP_MODES, REPLAY_MODES, off_step_mode
from policies._request_policy import (
    BUILTIN_CLASSES,
    CLASS_KEY,
    DEFAULT_POLICY_CLASS,
    MAX_CLASSES,
    MAX_K,
    MAX_K_KEY,
    POLICY_FORMAT_VERSION,
    SPECULATE_KEY,
    ClassPolicy,
    ClientRules,
    PolicyFile,
    RequestPolicy,
    classify_prompt,
    client_depth_cap,
    load_policy,
)
from policies._settings import ControllerSettings
from policies._step_cost import (
    FEATURES,
    PARALLEL_FEATURES,
    SEQUENTIAL_FEATURES,
    StepCostModel,
    StepSample,
    tokens_per_second,
)
from policies.errors import PluginConfigError, PolicyError, PolicyFileError

__all__ = [
    "BUILTIN_CLASSES",
    "CLASS_KEY",
    "DEFAULT_POLICY_CLASS",
    "FEATURES",
    "MAX_CATCH_UP_TOKENS",
    "MAX_CLASSES",
    "MAX_K",
    "MAX_K_KEY",
    "OFF_STEP_MODES",
    "REPLAY_MODES",
    "PARALLEL_FEATURES",
    "POLICY_FORMAT_VERSION",
    "SEQUENTIAL_FEATURES",
    "SPECULATE_KEY",
    "AcceptanceEstimator",
    "AcceptanceProfile",
    "ClassPolicy",
    "ClientRules",
    "ControllerSettings",
    "Decision",
    "DepthController",
    "DepthRules",
    "PlanClock",
    "PluginConfigError",
    "PolicyError",
    "PolicyFile",
    "PolicyFileError",
    "RequestPolicy",
    "RequestView",
    "StepCostModel",
    "StepSample",
    "StepTally",
    "TrackedBatch",
    "acceptance_length",
    "acceptance_lengths",
    "benchmark_decision_time",
    "classify_prompt",
    "client_depth_cap",
    "conditional_rates",
    "load_policy",
    "mix",
    "off_step_mode",
    "request_outcome",
    "tokens_per_second",
    "YAML_MAX_DEPTH",
    "YAML_MAX_EXPANDED",
    "YAMLDocumentError",
    "decode_json_at",
    "load_json_text",
    "load_yaml_text",
    "read_text",
]
