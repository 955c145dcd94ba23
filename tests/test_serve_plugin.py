"""Plugin pieces `peagle-tune serve` relies on, without an engine: opt-out as vLLM delivers it, the controller
fault hook, and the plugin config `peagle-tune serve` writes."""

from __future__ import annotations

import pytest

from autotune.serving import TunedConfig, plugin_config
from autotune.spec import SpecConfig
from policies import AcceptanceProfile, ClassPolicy, RequestPolicy, RequestView, StepCostModel, TrackedBatch
from policies.plugin import (
    PluginConfig,
    PluginConfigError,
    PluginFault,
    build_controller,
    normalize_extra_args,
    opted_out,
)
from policies.plugin.factory import check_plugin_fault

POLICY = RequestPolicy(static_k=2, max_k=4, classes={"chat": ClassPolicy(max_k=1)})
COST = StepCostModel({"base": 8.0, "per_request": 0.2, "per_verified_token": 0.1, "drafter_fixed": 1.0})


@pytest.mark.parametrize(
    ("value", "expected"),
    [(False, True), (0, True), ("false", True), ("OFF", True), (True, False), (1, False), ("true", False)],
)
def test_opt_out_survives_the_way_vllm_delivers_it(value: object, expected: bool) -> None:
    # vLLM's OpenAI server validates vllm_xargs values as str | int | float: a JSON false arrives as 0.
    extra = {"peagle_class": "code", "peagle_speculate": value}
    assert opted_out(extra) is expected
    view = POLICY.view("r", normalize_extra_args(extra))
    assert view.speculate is (not expected)


def test_unrecognised_opt_out_values_are_left_for_the_policy_to_reject() -> None:
    extra = {"peagle_speculate": "maybe"}
    assert normalize_extra_args(extra) is extra and not opted_out(extra)
    with pytest.raises(ValueError, match="peagle_speculate"):
        POLICY.view("r", normalize_extra_args(extra))
    assert normalize_extra_args(None) == {} and not opted_out({})


def _adaptive(**more: object) -> PluginConfig:
    return PluginConfig(
        mode="adaptive", static_depth=2,
        adaptive={"policy": POLICY.to_dict(), "cost_model": COST.to_dict(), "acceptance": {}}, **more,  # type: ignore[arg-type]
    )


def test_controller_fault_hook_falls_back_to_the_static_depth_for_that_step_only() -> None:
    _, controller = build_controller(_adaptive(fault_class="faulty", fault_where="controller"), 4)
    batch = TrackedBatch([RequestView("a", "code"), RequestView("b", "faulty")])
    decision = controller.decide_or_fallback(batch)
    assert decision.fallback and "fault_class='faulty'" in decision.reason
    assert decision.depths == {"a": 2, "b": 2}  # every request at the static depth
    batch.remove("b")
    assert not controller.decide_or_fallback(batch).fallback  # without the fault class: adaptive again


def test_fault_where_is_validated() -> None:
    with pytest.raises(PluginConfigError, match="fault_where must be one of plugin, controller"):
        _adaptive(fault_class="x", fault_where="engine")
    _, controller = build_controller(_adaptive(fault_class="faulty"), 4)  # "plugin": the controller is untouched
    assert not controller.decide_or_fallback(TrackedBatch([RequestView("b", "faulty")])).fallback


def test_serve_plugin_config_round_trips_and_builds_the_controller_it_describes() -> None:
    spec = SpecConfig(method="draft_model", drafter="d", num_speculative_tokens=4, parallel_drafting=True)
    tuned = TunedConfig(model="m", spec=spec, policy=POLICY, recommendation={"id": 1}, cost_model=COST)
    config = plugin_config(tuned, "/run/stats.json", overrides={"fault_class": "x", "fault_where": "controller"})
    again = PluginConfig.from_dict(config.to_dict())
    assert again == config
    policy, controller = build_controller(again, 4)
    assert policy == POLICY and controller.static_k == 2 and controller.max_k == 4
    assert again.class_depths == {"chat": 1}  # caps also apply outside the controller (e.g. after a fallback)


def test_the_engine_gets_the_policy_in_every_mode_and_priors_only_of_its_classes() -> None:
    spec = SpecConfig(method="draft_model", drafter="d", num_speculative_tokens=4, parallel_drafting=True)
    static = plugin_config(TunedConfig(model="m", spec=spec, policy=POLICY, recommendation={"id": 1}), None)
    assert static.mode == "static" and static.policy == POLICY.to_dict()  # labels resolved by it in the engine
    prior = AcceptanceProfile(100, (80, 60))
    acceptance = {"chat": prior, **{f"junk-{i}": prior for i in range(500)}}  # e.g. an old, polluted live profile
    tuned = TunedConfig(model="m", spec=spec, policy=POLICY, recommendation={"id": 1}, cost_model=COST,
                        acceptance=acceptance)
    adaptive = plugin_config(tuned, None)
    assert adaptive.adaptive is not None and set(adaptive.adaptive["acceptance"]) == {"chat"}


def test_plugin_fault_hook_fires_only_for_its_class_and_only_on_the_plugin_side() -> None:
    armed = PluginConfig(fault_class="boom")
    check_plugin_fault(armed, ["code", "chat"])  # no request of the fault class: nothing happens
    with pytest.raises(PluginFault, match="fault_class='boom'"):
        check_plugin_fault(armed, ["code", "boom"])
    check_plugin_fault(PluginConfig(fault_class="boom", fault_where="controller"), ["boom"])  # the controller's hook
