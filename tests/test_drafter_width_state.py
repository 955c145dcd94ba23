"""Whether drafter-width control is in effect, and if not which fallback and why: the handshake's state, what the
plugin's stats and its Prometheus series ``peagle:drafter_width_active`` / ``peagle:drafter_width_state`` say.

Plain objects for the handshake and the metrics; a real vLLM `Scheduler` (the plugin's `PeagleScheduler`, built as
vLLM's engine core builds it, with a fake executor answering the handshake) for what an operator scrapes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from policies.plugin.drafter_width import DRAFTER_WIDTH_STATES, WorkerStatus, install
from policies.plugin.drafting import HandshakeResult, combine, handshake
from policies.plugin.metrics import PluginMetrics

prometheus_client = pytest.importorskip("prometheus_client")


def _value(name: str, **labels: str) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(name, labels)


def _worker(rank: int = 0, **changes: Any) -> WorkerStatus:
    fields: dict[str, Any] = {"installed": True, "rank": rank, "k_max": 4, "method": "eagle3", "parallel": False,
                              "lower_width": True, "off_steps": "sync_pass", "state": "active"}
    return WorkerStatus(**{**fields, **changes})


def test_the_handshake_says_which_fallback_is_in_effect() -> None:
    assert combine([_worker(0), _worker(1)]).state == "active"
    v2 = combine([_worker(0), _worker(1, installed=False, lower_width=False, state="v2_runner", reason="V2")])
    assert v2.state == "v2_runner" and not v2.lower_width
    # A worker of an older version answers without a state: its refusal counts as unsupported.
    assert combine([_worker(0, installed=False, lower_width=False, state="")]).state == "unsupported"
    assert combine([]).state == "install_failed"
    assert handshake(None).state == "install_failed"
    assert HandshakeResult.refused("off", "disabled").info()["state"] == "disabled"
    with pytest.raises(ValueError, match="state must be one of"):
        HandshakeResult.refused("x", "sleeping")


def test_a_v2_model_runner_is_refused_with_the_fix() -> None:
    runner_cls = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})
    runner = runner_cls()
    runner.speculative_config = type("Spec", (), {"num_speculative_tokens": 3, "method": "eagle3",
                                                  "parallel_drafting": False})()
    status = install(runner)
    assert not status.installed and status.state == "v2_runner"
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in str(status.reason)
    assert not hasattr(runner, "_peagle_drafter_width")  # nothing patched
    assert combine([status]).state == "v2_runner"


def test_the_metrics_show_the_state_as_one_active_gauge_and_one_series_per_state() -> None:
    metrics = PluginMetrics(3, static_depth=2, engine="w1")
    metrics.set_drafter_width("active")
    assert _value("peagle:drafter_width_active", engine="w1") == 1
    assert _value("peagle:drafter_width_state", engine="w1", state="active") == 1
    metrics.set_drafter_width("fell_back")
    assert _value("peagle:drafter_width_active", engine="w1") == 0
    assert {s: _value("peagle:drafter_width_state", engine="w1", state=s) for s in DRAFTER_WIDTH_STATES} == {
        s: (1 if s == "fell_back" else 0) for s in DRAFTER_WIDTH_STATES}
    with pytest.raises(ValueError, match="drafter-width state must be one of"):
        metrics.set_drafter_width("unknown")  # label values stay bounded


# ----------------------------------------------------------------------------------- the plugin in vLLM's scheduler
requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


class Refusing:
    """An engine started without the worker extension: the handshake RPC does not exist."""

    def __init__(self) -> None:
        self.calls = 0

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()) -> Any:
        self.calls += 1
        raise NotImplementedError(f"Method {method!r} is not implemented.")


def _scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: Any, **plugin: Any) -> tuple[Any, Any]:
    from test_async_depth import FakeEngineCore

    from policies.plugin import CONFIG_ENV, PluginConfig, PluginStats
    from policies.scheduler import PeagleScheduler

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: metrics kept
    config = PluginConfig(mode="static", stats_path=str(tmp_path / "stats.json"), **plugin)
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(executor).build(PeagleScheduler)
    assert scheduler._active and scheduler._metrics.active
    scheduler._flush(force=True)
    return scheduler, PluginStats.load(tmp_path / "stats.json")


def _scraped() -> tuple[float | None, list[str]]:
    on = [s for s in DRAFTER_WIDTH_STATES if _value("peagle:drafter_width_state", engine="0", state=s) == 1]
    return _value("peagle:drafter_width_active", engine="0"), on


@requires_vllm
def test_a_scraper_sees_drafter_width_active_when_every_worker_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_plugin_off_steps import SyncExecutor

    _, stats = _scheduler(tmp_path, monkeypatch, SyncExecutor())
    assert _scraped() == (1, ["active"])
    assert stats.info["drafter_width"]["state"] == "active"


@requires_vllm
def test_a_scraper_sees_why_depth_falls_back_to_trimming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refusing = Refusing()
    _, stats = _scheduler(tmp_path, monkeypatch, refusing)
    assert _scraped() == (0, ["install_failed"])
    assert "worker_extension_cls" in stats.info["drafter_width"]["reason"]

    (tmp_path / "off").mkdir()
    _, stats = _scheduler(tmp_path / "off", monkeypatch, refusing, drafter_width={"enabled": False})
    assert _scraped() == (0, ["disabled"]) and stats.info["drafter_width"]["state"] == "disabled"


@requires_vllm
def test_under_the_v2_model_runner_the_plugin_trims_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The V2 runner needs Triton, which this CPU build lacks: vLLM's own switch is made to answer V2 (and its check
    # for Triton to pass).
    from vllm.config import VllmConfig

    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: True))
    monkeypatch.setattr(VllmConfig, "_validate_v2_model_runner", lambda self: None)
    refusing = Refusing()
    _, stats = _scheduler(tmp_path, monkeypatch, refusing)
    assert _scraped() == (0, ["v2_runner"])
    assert stats.info["drafter_width"]["state"] == "v2_runner"
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in stats.info["drafter_width"]["reason"]
    assert refusing.calls == 0  # no handshake attempted
