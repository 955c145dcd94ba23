"""The scheduler plugin's pure side (no vLLM): depth plans, config round trip and errors, recorded statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies import AcceptanceProfile, StepCostModel
from policies.plugin import (
    CONFIG_ENV,
    SCHEDULER_CLS,
    DepthPlan,
    PluginConfig,
    PluginConfigError,
    PluginStats,
    build_controller,
    engine_kwargs,
    serve_args,
)

# ---------------------------------------------------------------------------------------------------------- plans


def test_sweep_interleaves_full_depth_so_half_the_blocks_measure_every_position() -> None:
    plan = DepthPlan.sweep(3, block_steps=2)
    assert plan.depths == (3, 0, 3, 1, 3, 2)
    # blocks of 2 steps: 3 3 0 0 3 3 1 1 3 3 2 2, then the cycle repeats
    assert [plan.depth_at(s) for s in range(14)] == [3, 3, 0, 0, 3, 3, 1, 1, 3, 3, 2, 2, 3, 3]
    assert plan.cycle_steps == 12 and plan.max_depth == 3
    assert DepthPlan.sweep(3, interleave_full=False).depths == (0, 1, 2, 3)


def test_every_depth_appears_in_one_cycle() -> None:
    for k in (1, 4, 8):
        plan = DepthPlan.sweep(k)
        seen = {plan.depth_at(s) for s in range(plan.cycle_steps)}
        assert seen == set(range(k + 1))


@pytest.mark.parametrize(
    ("depths", "block", "message"),
    [
        ((), 4, "at least one depth"),
        ((2, -1), 4, r"plan.depths\[1\]"),
        ((2, True), 4, r"plan.depths\[1\]"),
        ((2,), 0, "block_steps"),
    ],
)
def test_bad_plans_name_the_field(depths: tuple[int, ...], block: int, message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        DepthPlan(depths, block)


def test_sweep_rejects_a_depth_out_of_range() -> None:
    with pytest.raises(PluginConfigError, match="max_k must be an integer in"):
        DepthPlan.sweep(0)


# --------------------------------------------------------------------------------------------------------- config


def test_config_round_trips_through_a_file(tmp_path: Path) -> None:
    config = PluginConfig(
        mode="plan",
        stats_path=str(tmp_path / "stats.json"),
        plan=DepthPlan((4, 0, 4, 2), block_steps=3),
        class_depths={"chat": 2},
        lower_drafting_depth=False,
        flush_every_s=1.5,
    )
    path = config.save(tmp_path / "plugin.json")
    loaded = PluginConfig.load(path)
    assert loaded == config
    assert PluginConfig.from_env({CONFIG_ENV: str(path)}) == config
    assert json.loads(path.read_text())["version"] == 1


def test_without_the_environment_variable_the_plugin_is_static_and_records_nothing() -> None:
    config = PluginConfig.from_env({})
    assert config.mode == "static" and config.stats_path is None and config.static_depth is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mode": "turbo"}, "mode must be one of static, plan, adaptive"),
        ({"mode": "plan"}, "mode 'plan' needs a plan"),
        ({"mode": "static", "sttaic_depth": 2}, r"unknown key\(s\) \['sttaic_depth'\]"),
        ({"class_depths": {"chat": -1}}, "class_depths.chat must be an integer depth"),
        ({"static_depth": 2.5}, "static_depth must be an integer depth"),
        ({"version": 2}, "version must be 1"),
        ({"mode": "plan", "plan": {"depths": [1], "blocks": 2}}, r"plan: unknown key\(s\) \['blocks'\]"),
        ({"mode": "adaptive"}, "needs an 'adaptive' object"),
        ({"mode": "adaptive", "adaptive": {"policy": {}}}, "adaptive.cost_model is missing"),
        ({"flush_every_s": 0}, "flush_every_s must be a number of seconds > 0"),
    ],
)
def test_config_errors_name_the_source_and_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message) as info:
        PluginConfig.from_dict(data, source="cfg.json")
    assert str(info.value).startswith("cfg.json: ")


def test_an_unreadable_or_invalid_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(PluginConfigError, match="cannot read the plugin config"):
        PluginConfig.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{mode: plan")
    with pytest.raises(PluginConfigError, match=f"{bad}: not valid JSON"):
        PluginConfig.load(bad)


def test_engine_arguments_install_the_scheduler_that_matches_the_scheduling() -> None:
    # Async scheduling never calls update_draft_token_ids, so the trimming plugin runs synchronously and the async
    # variant sets placeholders; the worker extension carries the drafter-width patch (policies.plugin.drafter_width).
    extension = "policies.plugin.drafter_width.DrafterWidthExtension"
    assert engine_kwargs(async_scheduling=False) == {"scheduler_cls": SCHEDULER_CLS, "async_scheduling": False,
                                                     "worker_extension_cls": extension}
    assert serve_args(async_scheduling=False) == ["--scheduler-cls", SCHEDULER_CLS, "--no-async-scheduling",
                                                  "--worker-extension-cls", extension]
    assert serve_args(async_scheduling=True) == ["--scheduler-cls", "policies.scheduler.PeagleAsyncScheduler",
                                                 "--async-scheduling", "--worker-extension-cls", extension]
    assert SCHEDULER_CLS == "policies.scheduler.PeagleScheduler"


def test_adaptive_config_builds_a_controller_clipped_to_the_engine_depth() -> None:
    policy = {"version": 1, "static_k": 5, "max_k": 8, "classes": {"chat": {"max_k": 2}}}
    cost = StepCostModel({"base": 10.0, "per_verified_token": 1.0}).to_dict()
    config = PluginConfig(
        mode="adaptive",
        adaptive={"policy": policy, "cost_model": cost, "acceptance": {"code": {"num_drafts": 10,
                                                                                 "accepted_per_position": [9, 8]}}},
    )
    request_policy, controller = build_controller(config, max_k=4)
    # The engine drafts K=4, so neither the policy nor the controller may ask for more.
    assert request_policy.max_k == 4 and controller.max_k == 4 and controller.static_k == 4
    assert request_policy.limits("chat") == (0, 2)


# ---------------------------------------------------------------------------------------------------------- stats


def _two_steps() -> PluginStats:
    stats = PluginStats()
    # Step 1 (decode only, uniform depth 2): code accepts 2 and 1, chat accepts 0.
    stats.observe_step(
        step_ms=10.0, prompt_tokens=0, drafting_depth=2,
        requests=[("code", "c4", 2, 2), ("code", "c4", 2, 1), ("chat", "c4", 2, 0)],
    )
    # Step 2 (same shape): code 2, chat 1, chat 2.
    stats.observe_step(
        step_ms=14.0, prompt_tokens=0, drafting_depth=2,
        requests=[("code", "c4", 2, 2), ("chat", "c4", 2, 1), ("chat", "c4", 2, 2)],
    )
    return stats


def test_acceptance_counts_drafts_and_accepted_prefixes_per_class_and_depth() -> None:
    stats = _two_steps()
    # code: accepted (2, 1, 2) -> 3 drafts, position 1 accepted 3x, position 2 accepted 2x.
    assert stats.acceptance("code", 2) == AcceptanceProfile(3, (3, 2))
    # chat: accepted (0, 1, 2) -> 3 drafts, position 1 accepted 2x, position 2 accepted 1x.
    assert stats.acceptance("chat", 2) == AcceptanceProfile(3, (2, 1))
    assert stats.acceptance("code", 3) is None
    # totals: 6 drafts of 2 tokens, 2+1+0+2+1+2 = 8 accepted; per position 5 and 3.
    assert stats.totals() == {
        "num_drafts": 6, "num_draft_tokens": 12, "num_accepted_tokens": 8, "accepted_per_position": [5, 3],
    }


def test_step_samples_are_medians_per_batch_size_and_depth_from_decode_only_steps() -> None:
    stats = _two_steps()
    # A step that also prefilled a prompt is not a decode step: it must not become a sample.
    stats.observe_step(step_ms=99.0, prompt_tokens=40, drafting_depth=2, requests=[("code", "c4", 0, 0)] * 3)
    [sample] = stats.step_samples(["c4"])
    # B=3, depth 2 -> V = 3 * (2 + 1) = 9; median of 10 and 14 ms is 12 ms over 2 steps.
    assert (sample.batch_size, sample.depth, sample.tokens, sample.n, sample.step_ms) == (3, 2, 9, 2, 12.0)
    assert sample.drafted  # depth is applied by trimming: the drafter ran
    assert stats.decode_steps == 2 and stats.mixed_steps == 1
    assert stats.step_samples(["warmup"]) == []


def test_sequential_samples_keep_only_steps_that_drafted_as_deep_as_they_verified() -> None:
    stats = PluginStats()
    stats.observe_step(step_ms=5.0, prompt_tokens=0, drafting_depth=3, requests=[("a", "p", 1, 1)])
    stats.observe_step(step_ms=4.0, prompt_tokens=0, drafting_depth=1, requests=[("a", "p", 1, 0)])
    # Parallel drafting: both steps verified depth 1 -> one sample (median of 5 and 4 ms).
    [par] = stats.step_samples()
    assert (par.depth, par.n, par.step_ms) == (1, 2, 4.5)
    # Sequential: the drafter cost depends on the drafting depth; only the step with drafting depth 1 matches.
    [seq] = stats.step_samples(sequential=True)
    assert (seq.depth, seq.n, seq.step_ms) == (1, 1, 4.0)


def test_non_uniform_steps_are_kept_apart_from_uniform_samples() -> None:
    stats = PluginStats()
    stats.observe_step(step_ms=8.0, prompt_tokens=0, drafting_depth=4, requests=[("a", "p", 4, 0), ("b", "p", 2, 0)])
    assert stats.step_samples() == []
    [mixed] = stats.step_samples(uniform_only=False)
    # V = (4 + 1) + (2 + 1) = 8 verified tokens for B = 2.
    assert mixed.tokens == 8 and mixed.batch_size == 2


def test_sample_reservoir_is_capped_but_counts_every_step() -> None:
    stats = PluginStats(max_samples_per_key=5)
    for i in range(50):
        stats.observe_step(step_ms=1.0 + i, prompt_tokens=0, drafting_depth=1, requests=[("a", "p", 1, 1)])
    [entry] = stats.step_costs()
    assert entry["n"] == 50 and len(entry["samples_ms"]) == 5
    assert entry["mean_ms"] == pytest.approx(sum(1.0 + i for i in range(50)) / 50)


def test_stats_round_trip_through_json(tmp_path: Path) -> None:
    stats = _two_steps()
    stats.info = {"num_speculative_tokens": 2}
    stats.record_error("schedule: RuntimeError: boom")
    stats.save(tmp_path / "s.json")
    loaded = PluginStats.load(tmp_path / "s.json")
    assert loaded.to_dict() == stats.to_dict()
    assert loaded.fallback and loaded.errors == ["schedule: RuntimeError: boom"]


def test_missing_or_malformed_stats_say_what_to_check(tmp_path: Path) -> None:
    with pytest.raises(PluginConfigError, match="scheduler_cls"):
        PluginStats.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text(json.dumps({"version": 1, "steps": 1}))
    with pytest.raises(PluginConfigError, match="malformed plugin stats"):
        PluginStats.load(tmp_path / "bad.json")


def test_an_accepted_count_beyond_the_drafts_is_rejected() -> None:
    with pytest.raises(ValueError, match="accepted drafts must be in"):
        PluginStats().observe_step(step_ms=1.0, prompt_tokens=0, drafting_depth=2, requests=[("a", "p", 2, 3)])


def test_importing_policies_does_not_import_the_vllm_plugin() -> None:
    import subprocess
    import sys

    code = (
        "import policies, policies.plugin, sys; "
        "print('policies.scheduler' in sys.modules, 'policies.plugin.scheduler' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False"]
