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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from policies._depth import MAX_K
    from policies._depth_rules import DepthRules, PlanClock, request_outcome
    from policies._estimator import AcceptanceEstimator
    from policies._files import (
        YAML_MAX_DEPTH,
        YAML_MAX_EXPANDED,
        YAMLDocumentError,
        decode_json_at,
        load_json_text,
        load_yaml_text,
        read_bytes,
        read_text,
    )
    from policies._off_steps import MAX_CATCH_UP_TOKENS, OFF_STEP_MODES, REPLAY_MODES, off_step_mode
    from policies._request_policy import (
        BUILTIN_CLASSES,
        CLASS_KEY,
        DEFAULT_POLICY_CLASS,
        MAX_CLASSES,
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

#: Where each public name lives: imported on first use (PEP 562), so importing one module of the package does not
#: load them all.
_HOMES = {
    "AcceptanceProfile": "policies._acceptance",
    "acceptance_length": "policies._acceptance",
    "acceptance_lengths": "policies._acceptance",
    "conditional_rates": "policies._acceptance",
    "mix": "policies._acceptance",
    "Decision": "policies._batch",
    "RequestView": "policies._batch",
    "StepTally": "policies._batch",
    "TrackedBatch": "policies._batch",
    "benchmark_decision_time": "policies._benchmark",
    "DepthController": "policies._controller",
    "DepthRules": "policies._depth_rules",
    "PlanClock": "policies._depth_rules",
    "request_outcome": "policies._depth_rules",
    "AcceptanceEstimator": "policies._estimator",
    "YAML_MAX_DEPTH": "policies._files",
    "YAML_MAX_EXPANDED": "policies._files",
    "YAMLDocumentError": "policies._files",
    "decode_json_at": "policies._files",
    "load_json_text": "policies._files",
    "load_yaml_text": "policies._files",
    "read_bytes": "policies._files",
    "read_text": "policies._files",
    "MAX_CATCH_UP_TOKENS": "policies._off_steps",
    "OFF_STEP_MODES": "policies._off_steps",
    "REPLAY_MODES": "policies._off_steps",
    "off_step_mode": "policies._off_steps",
    "BUILTIN_CLASSES": "policies._request_policy",
    "CLASS_KEY": "policies._request_policy",
    "DEFAULT_POLICY_CLASS": "policies._request_policy",
    "MAX_CLASSES": "policies._request_policy",
    "MAX_K": "policies._depth",
    "MAX_K_KEY": "policies._request_policy",
    "POLICY_FORMAT_VERSION": "policies._request_policy",
    "SPECULATE_KEY": "policies._request_policy",
    "ClassPolicy": "policies._request_policy",
    "ClientRules": "policies._request_policy",
    "PolicyFile": "policies._request_policy",
    "RequestPolicy": "policies._request_policy",
    "classify_prompt": "policies._request_policy",
    "client_depth_cap": "policies._request_policy",
    "load_policy": "policies._request_policy",
    "ControllerSettings": "policies._settings",
    "FEATURES": "policies._step_cost",
    "PARALLEL_FEATURES": "policies._step_cost",
    "SEQUENTIAL_FEATURES": "policies._step_cost",
    "StepCostModel": "policies._step_cost",
    "StepSample": "policies._step_cost",
    "tokens_per_second": "policies._step_cost",
    "PluginConfigError": "policies.errors",
    "PolicyError": "policies.errors",
    "PolicyFileError": "policies.errors",
}

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
    "read_bytes",
    "read_text",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'policies' has no attribute {name!r}")
