"""The plugin's Prometheus series: what a user scraping /metrics sees after a decision and a step, and that an engine
keeps them only where /metrics can show them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from policies import AcceptanceEstimator, DepthController, RequestView, StepCostModel, TrackedBatch
from policies.plugin import PluginMetrics
from policies.plugin.metrics import GuardedMetrics

prometheus_client = pytest.importorskip("prometheus_client")


def _value(name: str, **labels: str) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(name, labels)


def test_decision_estimates_and_measured_counters_are_exported() -> None:
    cost = StepCostModel({"base": 10.0, "per_request": 0.1, "per_verified_token": 0.1, "drafter_fixed": 1.0})
    est = AcceptanceEstimator(4)
    est.observe_many("code", [4] * 50, [4] * 50)  # every draft accepted
    controller = DepthController(cost, est, max_k=4, static_k=2, explore_every=0)
    batch = TrackedBatch([RequestView("a", "code"), RequestView("b", "code")])
    decision = controller.decide(batch)

    metrics = PluginMetrics(4, static_depth=2, engine="t1")
    metrics.observe_decision(decision, controller)
    metrics.observe_requests([("code", 4, 4), ("code", 4, 1), ("chat", 0, 0)])
    metrics.push()

    assert _value("peagle:static_depth", engine="t1") == 2
    assert _value("peagle:depth", engine="t1", **{"class": "code"}) == decision.plan["code"]
    assert _value("peagle:batch_depth", engine="t1") == decision.batch_depth
    assert _value("peagle:predicted_goodput_tokens_per_second", engine="t1") == pytest.approx(
        decision.predicted_goodput
    )
    assert _value("peagle:predicted_step_seconds", engine="t1") == pytest.approx(decision.predicted_step_ms / 1000)
    al = est.acceptance_lengths("code", 4)
    assert _value("peagle:estimated_acceptance_length", engine="t1", **{"class": "code"}) == pytest.approx(
        al[decision.plan["code"]]
    )
    assert _value("peagle:estimated_survival", engine="t1", position="0", **{"class": "code"}) == pytest.approx(
        al[1] - al[0]
    )
    # Measured counters: two drafts of 4 tokens; 4 + 1 accepted; position 0 accepted twice, 1-3 once.
    code = {"engine": "t1", "class": "code"}
    assert _value("peagle:drafts_total", **code) == 2
    assert _value("peagle:draft_tokens_total", **code) == 8
    assert _value("peagle:accepted_tokens_total", **code) == 5
    assert [_value("peagle:accepted_tokens_per_pos_total", position=str(i), **code) for i in range(4)] == [2, 1, 1, 1]
    assert _value("peagle:drafts_total", engine="t1", **{"class": "chat"}) is None  # no draft verified
    assert _value("peagle:decisions_total", engine="t1") == 1 and _value("peagle:fallback", engine="t1") == 0


def test_fallback_is_visible() -> None:
    cost = StepCostModel({"base": 10.0})
    controller = DepthController(cost, AcceptanceEstimator(3), max_k=3, static_k=2)
    batch = [RequestView("a", "chat")]
    metrics = PluginMetrics(3, static_depth=2, engine="t2")
    metrics.observe_decision(controller.fallback_decision(batch, "test"), controller)
    metrics.push()
    assert _value("peagle:fallback", engine="t2") == 1
    assert _value("peagle:fallback_decisions_total", engine="t2") == 1
    assert _value("peagle:batch_depth", engine="t2") == 2  # the static depth


def test_pushes_are_throttled() -> None:
    metrics = PluginMetrics(2, static_depth=1, engine="t3", min_interval_s=1.0)
    metrics.observe_requests([("code", 2, 2)])
    metrics.maybe_push(now=100.0)
    metrics.observe_requests([("code", 2, 2)])
    metrics.maybe_push(now=100.5)  # within 1 s of the last push: kept in memory
    assert _value("peagle:drafts_total", engine="t3", **{"class": "code"}) == 1
    metrics.maybe_push(now=101.0)
    assert _value("peagle:drafts_total", engine="t3", **{"class": "code"}) == 2


def test_a_metrics_error_turns_the_metrics_off_and_never_reaches_the_plugin(caplog: pytest.LogCaptureFixture) -> None:
    guard = GuardedMetrics(logging.getLogger("test.peagle.metrics"))
    guard.start(2, static_depth=1, engine="t4")
    assert guard.active
    guard.call("observe_requests", [("code", 2)])  # a malformed row: the metrics fail, the caller must not
    assert not guard.active
    assert "Prometheus metrics disabled after an error in observe_requests" in caplog.text
    guard.call("push")  # off: a no-op, not an error


@pytest.mark.parametrize(
    ("env", "kept"),
    [
        ({"PROMETHEUS_MULTIPROC_DIR": "prometheus"}, True),  # peagle-tune serve, vllm serve with several API servers
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, True),  # the engine core inside the API server's process
        ({}, False),  # an offline engine, or vllm serve's engine-core process: nothing can scrape it
    ],
)
def test_the_engine_keeps_the_series_only_where_metrics_can_show_them(
    env: dict[str, str], kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm")
    from test_async_depth import FakeEngineCore
    from test_plugin_off_steps import SyncExecutor

    from policies.plugin import CONFIG_ENV, PluginConfig
    from policies.scheduler import PeagleScheduler

    for name in ("PROMETHEUS_MULTIPROC_DIR", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(tmp_path / value) if name == "PROMETHEUS_MULTIPROC_DIR" else value)
    config = PluginConfig(mode="static", static_depth=2)
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(SyncExecutor()).build(PeagleScheduler)  # type: ignore[arg-type]
    assert scheduler._active
    assert scheduler._metrics.active is kept
