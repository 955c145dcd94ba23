"""Off-steps of an unchanged batch are observed once and repeated (the plugin's fast path): the statistics a user reads
are exactly what counting every request in every step gives. The time between steps is recorded while requests are
unfinished, never while the engine is idle; steps with prompt tokens are timed apart. Real vLLM ``Scheduler`` (the
plugin's `PeagleScheduler`), fake runner outputs, synchronous engine-core order; no model."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from test_async_depth import MODELS, PROMPT_LEN, FakeEngineCore, _runner_output

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

MAX_TOKENS = 10


class SyncExecutor:
    """Answers the drafter-width handshake as a synchronous worker with the patch (off-steps skip the drafter)."""

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()) -> list[Any]:
        from policies.plugin.drafter_width import WorkerStatus

        return [WorkerStatus(True, None, 0, k_max=4, method="draft_model", parallel=True, lower_width=True,
                             off_steps="catch_up").to_dict()]


@pytest.fixture
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from policies.plugin import CONFIG_ENV, PluginConfig
    from policies.scheduler import PeagleScheduler

    assert MODELS.is_dir()
    config = PluginConfig(mode="static", class_depths={"none": 0}, stats_path=str(tmp_path / "stats.json"))
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    return FakeEngineCore(SyncExecutor()).build(PeagleScheduler)  # type: ignore[arg-type]


def _add(scheduler: Any, name: str) -> None:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, extra_args={"peagle_class": "none"})
    scheduler.add_request(Request(name, list(range(1, PROMPT_LEN + 1)), params, None))


def _step(scheduler: Any) -> Any:
    output = scheduler.schedule()
    scheduler.update_from_output(output, _runner_output(output, {}))
    return output


def test_off_steps_of_an_unchanged_batch_are_counted_like_any_step(scheduler: Any) -> None:
    from policies.plugin import PluginStats

    # Three requests prefill together (a step with prompt tokens that samples their first token), then decode one
    # token per step at depth 0 until their 10th. A fourth joins after 4 decode steps: its prefill shares a step with
    # the others' 6th token, then it decodes alongside them (batch 4) and, once they are done, alone.
    for name in ("a", "b", "c"):
        _add(scheduler, name)
    outputs = [_step(scheduler) for _ in range(5)]  # the prefill step and 4 decode steps
    _add(scheduler, "d")
    while scheduler.get_num_unfinished_requests():
        outputs.append(_step(scheduler))
    assert all(not o.scheduled_spec_decode_tokens for o in outputs)  # depth 0: every step is an off-step
    stats = scheduler._stats
    # Request-steps: 10 tokens per request, one per step, each step counted once.
    assert stats.depth_histogram() == {0: 4 * MAX_TOKENS}
    # Steps with prompt tokens: the first (a, b, c) and d's prefill; the rest decode.
    assert stats.mixed_steps == 2 and stats.decode_steps == len(outputs) - 2
    by_batch: dict[int, int] = {}
    for e in stats.step_costs():
        by_batch[e["batch_size"]] = by_batch.get(e["batch_size"], 0) + e["n"]
    # a, b, c decode 9 tokens after their first: 4 steps at batch 3, the shared step with d's prefill, then 4 at batch
    # 4; d decodes 9 tokens: 4 alongside them (batch 4) and 5 alone.
    assert by_batch == {3: 4, 4: 4, 1: 5}
    assert stats.step_samples() and all(s.depth == 0 and s.drafter_ran is False for s in stats.step_samples())
    # The two steps with prompt tokens are timed on their own, without the drafter: 3 prompts, then d's beside 3
    # decoding requests (a prompt's last position samples the request's first token, so it counts as decoding).
    assert list(stats.mixed_costs) == [("default", False)]
    n, total_ms, prompt_tokens, requests = stats.mixed_costs["default", False]
    assert (n, prompt_tokens, requests) == (2, 4 * (PROMPT_LEN - 1), 3 + 4) and total_ms > 0
    assert PluginStats.from_dict(stats.to_dict()).mixed_costs == stats.mixed_costs


def test_time_between_steps_is_recorded_while_requests_are_unfinished_and_not_while_idle(
    scheduler: Any, tmp_path: Path
) -> None:
    import time

    from policies.plugin import PluginStats

    gap_s = 0.02  # the engine core's work between two steps, played by a sleep

    def burst(names: tuple[str, ...]) -> int:
        for name in names:
            _add(scheduler, name)
        steps = 0
        while scheduler.get_num_unfinished_requests():
            if steps:
                time.sleep(gap_s)
            _step(scheduler)
            steps += 1
        return steps

    first = burst(("a", "b"))  # both finish in the same step (10 tokens each)
    time.sleep(1.0)  # idle: the engine waits for work, which is not time between steps
    second = burst(("c",))
    stats = scheduler._stats
    # Every gap follows a step that left requests unfinished; every step was an off-step (depth 0: no drafter).
    assert set(stats.between_steps) == {"no_drafter"}
    n, total_ms = stats.between_steps["no_drafter"]
    assert n == (first - 1) + (second - 1)
    assert total_ms >= n * gap_s * 1000.0  # each gap at least its sleep; the idle second is not in it
    assert total_ms < n * gap_s * 1000.0 + 1000.0
    scheduler._flush(force=True)
    loaded = PluginStats.load(scheduler._config.stats_path)
    assert loaded.between_steps == {"no_drafter": [n, total_ms]}


class FetchingExecutor(SyncExecutor):
    """A synchronous worker whose drafts' fetch takes ``fetch_s`` (the multiprocess executor's round trip)."""

    max_concurrent_batches = 1
    fetch_s = 0.005

    def __init__(self) -> None:
        self.fetches = 0

    def take_draft_token_ids(self) -> Any:
        import time

        self.fetches += 1
        time.sleep(self.fetch_s)
        return None  # the test hands the scheduler its drafts itself


def test_the_controller_prices_a_drafting_step_with_the_drafts_fetch_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.outputs import DraftTokenIds

    from policies.plugin import CONFIG_ENV, PluginConfig
    from policies.scheduler import PeagleScheduler

    # "always" accepts every draft (the controller drafts it at depth 4), "never" accepts none (depth 0: off-steps).
    adaptive = {
        "policy": {"version": 1, "static_k": 4, "max_k": 4, "default_class": "always",
                   "classes": {"never": {"min_k": 0}}, "controller": {"explore_every": 0}},
        "cost_model": {"version": 1, "sequential": False, "coefficients": {
            "base": 3.0, "per_request": 0.1, "per_verified_token": 0.1, "drafter_fixed": 1.0,
            "drafter_per_request": 0.3}},
        "acceptance": {"always": {"num_drafts": 100, "accepted_per_position": [100, 100, 100, 100]},
                       "never": {"num_drafts": 100, "accepted_per_position": [0, 0, 0, 0]}},
    }
    config = PluginConfig(mode="adaptive", adaptive=adaptive, stats_path=str(tmp_path / "stats.json"))
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    executor = FetchingExecutor()
    scheduler = FakeEngineCore(executor).build(PeagleScheduler)  # type: ignore[arg-type]
    assert scheduler._width.fetch_skipped  # the plugin skips the fetch after an off-step

    seen: list[tuple[float | None, float | None, bool, float | None]] = []  # (step ms, learnt ms, off-step, fetch)
    record_stats, learn = scheduler._stats.observe_tally, scheduler._controller.observe_tally

    def stats_tally(tally: Any, step_ms: float | None = None, **kw: Any) -> None:
        seen.append((step_ms, None, scheduler._width.off_step, scheduler._width.fetch_cost.ms))
        record_stats(tally, step_ms=step_ms, **kw)

    def controller_tally(tally: Any, step_ms: float | None = None, drafting: int | None = None) -> None:
        seen[-1] = (seen[-1][0], step_ms, *seen[-1][2:])
        learn(tally, step_ms, drafting)

    scheduler._stats.observe_tally = stats_tally
    scheduler._controller.observe_tally = controller_tally

    def burst(cls: str) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, extra_args={"peagle_class": cls})
        scheduler.add_request(Request(cls, list(range(1, PROMPT_LEN + 1)), params, None))
        while scheduler.get_num_unfinished_requests():
            output = scheduler.schedule()
            accepted = {cls: 4 if cls == "always" else 0}
            scheduler.update_from_output(output, _runner_output(output, accepted))
            scheduler._width.executor.take_draft_token_ids()  # what EngineCore.post_step does (wrapped by the plugin)
            width = output.num_spec_tokens_to_schedule
            if width and cls in scheduler.requests:
                scheduler.update_draft_token_ids(DraftTokenIds([cls], [[5] * width]))

    burst("always")
    burst("never")
    decode = [s for s in seen if s[0] is not None and s[1] is not None]
    drafting = [s for s in decode if not s[2]]
    off = [s for s in decode if s[2]]
    assert drafting and off
    # A step the drafts are fetched after is learnt with the fetch (as smoothed before it), an off-step as measured.
    for step_ms, learnt_ms, _off, fetch_ms in drafting:
        assert learnt_ms == pytest.approx(step_ms + (fetch_ms or 0.0))
    assert any((f or 0.0) >= FetchingExecutor.fetch_s * 1000.0 for *_, f in drafting)  # each fetch slept 5 ms
    assert all(learnt_ms == step_ms for step_ms, learnt_ms, *_ in off)
    # The statistics keep the step's own time; the fetches are recorded apart, each one the workers answered.
    assert scheduler._stats.draft_fetches == executor.fetches > 0
    assert all(s.step_ms < FetchingExecutor.fetch_s * 1000.0 for s in scheduler._stats.step_samples())  # not a fetch
