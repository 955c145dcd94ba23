"""Per-request depth under vLLM's async scheduler, without a model: the plugin's `PeagleAsyncScheduler` (a real vLLM
``AsyncScheduler`` subclass) is driven step by step with fake runner outputs, in the order vLLM's engine core uses
with async scheduling (step n+1 is scheduled before step n's output is applied).

Under async scheduling the drafts never reach the scheduler: ``AsyncScheduler._update_after_schedule`` gives each
request ``num_spec_tokens_to_schedule`` placeholder drafts and the runner copies that many drafts of the request's row
from the device. The plugin sets each request's placeholders to its planned depth, so what is asserted here is what
the runner would verify: scheduled tokens = 1 + depth, scheduled spec tokens = depth, and vLLM's own accounting
(placeholders, computed tokens, spec-decode counters) stays consistent. The CPU platform forces async scheduling off
in real engines, hence no engine here: the scheduler config has ``async_scheduling=True`` set directly, as a GPU's
has it. The handshake is answered by a fake executor found the way the plugin finds vLLM's (the ``model_executor``
of the engine core constructing it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fakes import FakeEngineCore

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
K = 4
CAPS = {"short": 1, "none": 0}  # class -> verified depth; "full" verifies K
PROMPT_LEN = 12


class FakeExecutor:
    """Answers the drafter-width handshake as one worker would (async: off-steps run a one-slot sync pass)."""

    def __init__(self, installed: bool = True) -> None:
        self.installed = installed
        self.calls: list[str] = []

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()) -> list[Any]:
        from policies.plugin.drafter_width import WorkerStatus

        self.calls.append(method)
        if not self.installed:
            raise NotImplementedError(f"Method {method!r} is not implemented.")
        return [WorkerStatus(True, "async scheduling: off-steps run a one-slot sync pass", 0, k_max=K,
                             method="draft_model", parallel=True, lower_width=True, off_steps="sync_pass").to_dict()]


@pytest.fixture
def plugin_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from policies.plugin import CONFIG_ENV, PluginConfig

    stats = tmp_path / "stats.json"
    config = PluginConfig(mode="static", class_depths=CAPS, stats_path=str(stats))
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    return stats


def _add(scheduler: Any, name: str, cls: str) -> None:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=64, ignore_eos=True, extra_args={"peagle_class": cls})
    scheduler.add_request(Request(name, list(range(1, PROMPT_LEN + 1)), params, None))


def _runner_output(output: Any, accepted: dict[str, int]) -> Any:
    """What the runner returns for `output`: per request 1 + accepted tokens (a prefill samples its first token)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    spec = output.scheduled_spec_decode_tokens
    sampled = [[7] * (1 + min(accepted.get(r, 0), len(spec.get(r, ())))) for r in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)


def _steps(scheduler: Any, accepted: dict[str, int], n: int) -> Iterator[Any]:
    """Async engine-core order: schedule n+1, then apply n's output. Yields each SchedulerOutput after scheduling."""
    pending = None
    for _ in range(n):
        output = scheduler.schedule()
        yield output
        if pending is not None:
            scheduler.update_from_output(pending, _runner_output(pending, accepted))
        pending = output
    if pending is not None:
        scheduler.update_from_output(pending, _runner_output(pending, accepted))


@pytest.fixture
def async_scheduler(plugin_env: Path) -> tuple[Any, FakeExecutor]:
    from policies.scheduler import PeagleAsyncScheduler

    executor = FakeExecutor()
    scheduler = FakeEngineCore(executor).build(PeagleAsyncScheduler, async_scheduling=True)
    for i, cls in enumerate(("short", "none", "full")):
        _add(scheduler, f"{cls}-{i}", cls)
    return scheduler, executor


def test_each_request_gets_as_many_placeholders_as_its_depth(async_scheduler: tuple[Any, FakeExecutor]) -> None:
    scheduler, executor = async_scheduler
    assert executor.calls == ["peagle_drafter_width_handshake"]
    depth = {"short-0": 1, "none-1": 0, "full-2": K}
    outputs = []
    for output in _steps(scheduler, {r: d for r, d in depth.items()}, 6):
        outputs.append(output)
        if output is outputs[0]:  # prefill: the placeholders for the next step are set after schedule()
            assert output.num_scheduled_tokens == dict.fromkeys(depth, PROMPT_LEN)
            assert output.num_spec_tokens_to_schedule == K  # widest planned depth: "full" at K
        for req_id, d in depth.items():
            assert scheduler.requests[req_id].spec_token_ids == [-1] * d, req_id
    for output in outputs[1:]:  # every decode step verifies exactly the planned depth per request
        assert output.num_scheduled_tokens == {r: 1 + d for r, d in depth.items()}
        assert {r: len(t) for r, t in output.scheduled_spec_decode_tokens.items()} == {"short-0": 1, "full-2": K}


def test_vllm_accounting_stays_consistent_under_partial_acceptance(
    async_scheduler: tuple[Any, FakeExecutor], plugin_env: Path,
) -> None:
    scheduler, _ = async_scheduler
    accepted = {"short-0": 0, "full-2": 2}  # short rejects its draft, full accepts 2 of 4
    steps = 8
    list(_steps(scheduler, accepted, steps))
    for req_id in ("short-0", "none-1", "full-2"):
        request = scheduler.requests[req_id]
        assert request.num_output_placeholders == 0, req_id  # every step's output applied
        # Every token computed is a prompt token or an accepted output token, rejected drafts rolled back.
        assert request.num_computed_tokens == request.num_tokens - 1, req_id
    decode_steps = steps - 1
    assert len(scheduler.requests["none-1"].output_token_ids) == steps  # 1 token per step, no drafts
    assert len(scheduler.requests["short-0"].output_token_ids) == steps  # its draft is always rejected
    assert len(scheduler.requests["full-2"].output_token_ids) == 1 + decode_steps * 3  # 2 accepted + 1 bonus
    # The plugin counted what the runner verified: placeholders are drafts under async scheduling.
    scheduler.shutdown()
    from policies.plugin import PluginStats

    stats = PluginStats.load(plugin_env)
    assert stats.info["async_scheduling"] is True
    assert stats.info["drafter_width"]["lower_width"] is True and stats.info["drafter_width"]["skip_drafter"] is False
    full = stats.acceptance("full", K)
    assert full is not None and full.num_drafts == decode_steps and full.accepted_per_position == (
        decode_steps, decode_steps, 0, 0)
    short = stats.acceptance("short", 1)
    assert short is not None and short.num_drafts == decode_steps and short.accepted_per_position == (0,)
    assert stats.acceptance("none", 1) is None and stats.depth_histogram()[0] >= decode_steps


def test_width_follows_the_deepest_planned_depth(plugin_env: Path) -> None:
    from policies.scheduler import PeagleAsyncScheduler

    scheduler = FakeEngineCore(FakeExecutor()).build(PeagleAsyncScheduler, async_scheduling=True)
    _add(scheduler, "a", "short")
    _add(scheduler, "b", "none")
    widths = [o.num_spec_tokens_to_schedule for o in _steps(scheduler, {}, 4)]
    assert widths == [1, 1, 1, 1]  # "short" (1) is the deepest: the drafter drafts one slot per request
    assert scheduler.requests["a"].spec_token_ids == [-1] and scheduler.requests["b"].spec_token_ids == []


def test_without_the_worker_patch_the_width_stays_k_and_depths_still_apply(plugin_env: Path) -> None:
    from policies.scheduler import PeagleAsyncScheduler

    executor = FakeExecutor(installed=False)
    scheduler = FakeEngineCore(executor).build(PeagleAsyncScheduler, async_scheduling=True)
    _add(scheduler, "a", "short")
    outputs = list(_steps(scheduler, {"a": 1}, 3))
    # Parallel drafting cannot draft fewer than K without the patch (vLLM #45695): the runner copies the first
    # placeholder-many drafts of each K-wide row instead.
    assert [o.num_spec_tokens_to_schedule for o in outputs] == [K] * 3
    assert [o.num_scheduled_tokens["a"] for o in outputs[1:]] == [2, 2]
    assert "worker_extension_cls" in (scheduler._stats.info["drafter_width"]["reason"] or "")


def test_engine_kwargs_install_the_async_variant_with_the_worker_patch() -> None:
    from policies.plugin import ASYNC_SCHEDULER_CLS, engine_kwargs

    assert engine_kwargs(async_scheduling=True)["scheduler_cls"] == ASYNC_SCHEDULER_CLS
    assert engine_kwargs(async_scheduling=False)["worker_extension_cls"] == engine_kwargs(
        async_scheduling=True)["worker_extension_cls"]


def _spy(obj: Any, name: str, before: Any) -> None:
    """Call ``before(*args, **kwargs)`` ahead of each call of ``obj.name`` (replaced on the instance only)."""
    method = getattr(obj, name)

    def spied(*args: Any, **kwargs: Any) -> Any:
        before(*args, **kwargs)
        return method(*args, **kwargs)

    setattr(obj, name, spied)


def test_a_synchronous_plugin_under_async_scheduling_refuses_in_one_line(plugin_env: Path) -> None:
    # Served anyway, it would speculate nothing: the async engine core never hands it the drafts
    # (vllm/v1/engine/core.py:693) while its depth decisions still cost every step.
    from policies.scheduler import PeagleScheduler

    with pytest.raises(RuntimeError) as refused:
        FakeEngineCore(FakeExecutor()).build(PeagleScheduler, async_scheduling=True)
    message = str(refused.value)
    assert "\n" not in message
    assert "PeagleAsyncScheduler" in message and "--no-async-scheduling" in message


def test_each_step_verifies_the_depth_planned_one_step_before_and_records_its_own_drafting_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from policies.plugin import CONFIG_ENV, DepthPlan, PluginConfig
    from policies.scheduler import PeagleAsyncScheduler

    plan = DepthPlan((K, 0, 2, 1), block_steps=1)  # a new width every step
    config = PluginConfig(mode="plan", plan=plan, stats_path=str(tmp_path / "stats.json"))
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(FakeExecutor()).build(PeagleAsyncScheduler, async_scheduling=True)
    for name in ("a", "b"):
        _add(scheduler, name, "full")
    recorded: list[int] = []  # the drafting width each applied step was recorded with
    _spy(scheduler._stats, "observe_tally", lambda *a, drafting_depth, **kw: recorded.append(drafting_depth))
    outputs = list(_steps(scheduler, {"a": K, "b": 0}, 9))
    # schedule(n) plans the drafts of step n (verified in step n + 1): the plan's n-th depth, one clock per batch size.
    widths = [o.num_spec_tokens_to_schedule for o in outputs]
    assert widths == [plan.depth_at(n) for n in range(9)]
    for n in range(1, 9):
        assert {r: len(t) for r, t in outputs[n].scheduled_spec_decode_tokens.items()} == (
            dict.fromkeys("ab", widths[n - 1]) if widths[n - 1] else {}), n
        assert outputs[n].num_scheduled_tokens == dict.fromkeys("ab", 1 + widths[n - 1])
    # Step n's output is applied after schedule(n + 1) decided the next width: it is still recorded with its own.
    assert recorded == widths and scheduler._active


def test_the_controller_decides_from_acceptance_one_step_older_and_vllm_schedules_its_depths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from policies.plugin import CONFIG_ENV, PluginConfig
    from policies.scheduler import PeagleAsyncScheduler

    # "always" accepts every draft, "never" none (priors and outcomes agree: the controller verifies K and 0).
    adaptive = {
        "policy": {"version": 1, "static_k": K, "max_k": K, "default_class": "always",
                   "classes": {"never": {"min_k": 0}}, "controller": {"explore_every": 0}},
        "cost_model": {"version": 1, "sequential": False, "coefficients": {
            "base": 3.0, "per_request": 0.1, "per_verified_token": 0.1, "drafter_fixed": 1.0,
            "drafter_per_request": 0.3}},
        "acceptance": {"always": {"num_drafts": 100, "accepted_per_position": [100] * K},
                       "never": {"num_drafts": 100, "accepted_per_position": [0] * K}},
    }
    config = PluginConfig(mode="adaptive", adaptive=adaptive, stats_path=str(tmp_path / "stats.json"))
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(FakeExecutor()).build(PeagleAsyncScheduler, async_scheduling=True)
    _add(scheduler, "a", "always")
    _add(scheduler, "n", "never")
    observed: list[int] = []  # drafted tokens of each step the controller learnt from
    seen_at_decision: list[int] = []  # steps the controller had learnt from when it decided
    decided: list[dict[str, int]] = []
    _spy(scheduler._controller, "observe_tally", lambda tally, *a: observed.append(tally.verified - tally.size))
    _spy(scheduler._controller, "decide", lambda batch: seen_at_decision.append(len(observed)))
    decide = scheduler._decider.decide

    def record_depths(output: Any, requests: Any) -> dict[str, int]:
        depths = decide(output, requests)
        decided.append(dict(depths))
        return depths

    scheduler._decider.decide = record_depths
    steps = 8
    outputs = list(_steps(scheduler, {"a": K, "n": K}, steps))
    # schedule(n) comes before step n - 1's output is applied: the decision sees steps 0 .. n - 2, one fewer than
    # under synchronous scheduling (0 .. n - 1).
    assert seen_at_decision == [0, 0, *range(1, steps - 1)]
    assert observed == [0] + [K] * (steps - 1)  # prefill verifies nothing; then "a" verifies K, "n" none
    # What the controller chose per request in schedule(n) is what vLLM verifies in step n + 1.
    assert decided[0] == {"a": K, "n": 0}
    for n in range(1, steps):
        assert {r: len(outputs[n].scheduled_spec_decode_tokens.get(r, ())) for r in "an"} == decided[n - 1], n
    scheduler.shutdown()
    from policies.plugin import PluginStats

    stats = PluginStats.load(tmp_path / "stats.json")
    always = stats.acceptance("always", K)
    assert always is not None and always.num_drafts == steps - 1 and not stats.fallback
