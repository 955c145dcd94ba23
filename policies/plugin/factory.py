"""What the plugin builds from its config: the adaptive mode's request policy and depth controller, and the
``fault_class`` test hooks that show the engine keeps serving when the plugin or the controller fails.

The ``adaptive`` section of a `PluginConfig` is plain JSON: ``policy`` (a policy-file dict), ``cost_model``
(`StepCostModel.to_dict()`, e.g. a stored profile's) and ``acceptance`` ({class: `AcceptanceProfile` dict} seeding the
estimator, may be empty). `build_controller` turns it into live objects for a drafter with the engine's K.

Fault hooks (``fault_class``, tests only): with ``fault_where="plugin"`` `check_plugin_fault` raises `PluginFault` in
the plugin's own logic (the plugin turns itself off); with ``fault_where="controller"`` the controller's ``decide``
raises `ControllerFault` (that step falls back to the static depth).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from policies import AcceptanceEstimator, AcceptanceProfile, DepthController, RequestPolicy, StepCostModel
from policies._graphs import full_graph_depth
from policies.errors import ControllerFault, PluginConfigError, PluginFault
from policies.plugin.config import PluginConfig

__all__ = ["build_controller", "check_plugin_fault", "inject_controller_fault"]


def build_controller(config: PluginConfig, max_k: int,
                     graph_mode: str | None = None) -> tuple[RequestPolicy, DepthController]:
    """The request policy and depth controller of an adaptive config, for a drafter with K = ``max_k``.

    The policy's max_k (and static_k) are clipped to the engine's K: the controller never asks for drafts the engine
    does not make. The estimator is seeded from ``adaptive.acceptance`` with the policy's ``prior_strength``.
    ``graph_mode``: the engine's CUDA-graph mode (vLLM's ``compilation_config.cudagraph_mode`` name; None: no
    graphs): with FULL graphs the cost model prices every step but the uniform one at ``max_k`` PIECEWISE
    (`policies._graphs`), so the controller leaves K only where the saving beats that.
    """
    if config.adaptive is None:
        raise PluginConfigError("build_controller needs a config with an 'adaptive' section.")
    policy = RequestPolicy.from_dict(dict(config.adaptive["policy"]), source="adaptive.policy")
    if policy.max_k > max_k:
        policy = dataclasses.replace(policy, max_k=max_k, static_k=min(policy.static_k, max_k))
    cost = StepCostModel.from_dict(config.adaptive["cost_model"]).with_graphs(full_graph_depth(graph_mode, max_k))
    profiles = {
        str(name): AcceptanceProfile.from_dict(p) for name, p in (config.adaptive.get("acceptance") or {}).items()
    }
    settings = policy.controller
    if profiles:
        est = AcceptanceEstimator.from_profiles(
            profiles, max_k=policy.max_k, prior_strength=settings.prior_strength, decay=settings.decay
        )
    else:
        est = AcceptanceEstimator(max(policy.max_k, 1), decay=settings.decay)
    controller = DepthController(cost, est, policy.max_k, policy.static_k, settings=settings)
    if config.fault_class is not None and config.fault_where == "controller":
        inject_controller_fault(controller, config.fault_class)
    return policy, controller


def check_plugin_fault(config: PluginConfig, classes: Iterable[str]) -> None:
    """Raise `PluginFault` when the config's plugin-side hook is armed and one of ``classes`` is its class."""
    fault = config.fault_class
    if fault is not None and config.fault_where == "plugin" and any(cls == fault for cls in classes):
        raise PluginFault(f"fault_class={fault!r} test hook")


def inject_controller_fault(controller: DepthController, fault_class: str) -> None:
    """Make ``controller.decide`` raise `ControllerFault` whenever the batch holds a request of ``fault_class``."""
    decide = controller.decide

    def faulty_decide(batch: Any) -> Any:
        if any(view.cls == fault_class for view in batch):
            raise ControllerFault(f"fault_class={fault_class!r} test hook (controller)")
        return decide(batch)

    controller.decide = faulty_decide  # type: ignore[method-assign]
