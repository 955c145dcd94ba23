"""The plugin's statistics file is written off the engine's thread once the engine stays idle (`IdleWriter`), never
while a step runs, and completely at the end of a burst.

Plain callables for the writer itself; then vLLM's real ``Scheduler`` (the plugin's `PeagleScheduler`) with fake
runner outputs: the step that ends a burst returns without writing the file (its outputs are not held up by the disk),
the file has the burst's final figures the idle delay later, and a burst that starts before then writes nothing in
between."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from policies.plugin.idle_writer import IdleWriter

DELAY_S = 0.05
WAIT_S = 5.0  # generous: the writer thread is scheduled by a shared machine


def _wait_for(condition: Any, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def test_an_idle_engine_is_written_once_after_the_delay_and_a_busy_one_never() -> None:
    written: list[float] = []
    writer = IdleWriter(lambda: written.append(time.monotonic()), delay_s=DELAY_S)
    writer.busy()
    idle_at = time.monotonic()
    writer.idle()
    assert _wait_for(lambda: written)
    assert written[0] - idle_at >= DELAY_S
    time.sleep(5 * DELAY_S)
    assert len(written) == 1 and writer.writes == 1  # one write per idle period

    # A step starts before the delay is over: nothing is written for that idle period, nor while the engine is busy.
    writer.idle()
    writer.busy()
    time.sleep(5 * DELAY_S)
    assert len(written) == 1
    writer.idle()  # idle again: written once more
    assert _wait_for(lambda: len(written) == 2)
    writer.stop()
    writer.idle()  # after stop: the engine writes on its own thread, the writer never again
    time.sleep(5 * DELAY_S)
    assert len(written) == 2


def test_a_step_waits_for_a_write_in_progress() -> None:
    started, release = threading.Event(), threading.Event()
    events: list[str] = []

    def slow_write() -> None:
        started.set()
        release.wait(WAIT_S)
        events.append("written")

    writer = IdleWriter(slow_write, delay_s=0.0)
    writer.idle()
    assert started.wait(WAIT_S)
    step = threading.Thread(target=lambda: (writer.busy(), events.append("step")))
    step.start()
    time.sleep(0.05)
    assert events == []  # the step did not start while the file was being written
    release.set()
    step.join(WAIT_S)
    assert events == ["written", "step"]
    writer.stop()
    assert writer.writes == 1


def test_the_writer_thread_does_not_keep_an_owner_that_was_dropped_alive() -> None:
    import gc
    import weakref

    class Owner:  # a scheduler dropped without shutdown (tests build many)
        def __init__(self) -> None:
            self.writer = IdleWriter(self.write, delay_s=10.0)
            self.writer.idle()  # its thread waits for the delay

        def write(self) -> None:
            pass

    owner = Owner()
    thread, gone = owner.writer._thread, weakref.ref(owner)
    assert thread is not None and thread.is_alive()
    del owner
    gc.collect()
    assert gone() is None


def test_the_delay_must_be_a_number_of_seconds() -> None:
    with pytest.raises(ValueError, match="delay_s must be >= 0"):
        IdleWriter(lambda: None, delay_s=float("nan"))


# -- in vLLM's scheduler -------------------------------------------------------------------------------------------

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@needs_vllm
def test_the_last_step_of_a_burst_returns_before_the_file_is_written_and_the_file_is_complete_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_async_depth import FakeEngineCore
    from test_plugin_off_steps import MAX_TOKENS, SyncExecutor, _add, _step

    from policies.plugin import CONFIG_ENV, PluginConfig, PluginStats
    from policies.scheduler import PeagleScheduler

    # Longer than the default 0.25 s, so that a stall of the machine between two bursts does not pass for idleness.
    delay_s = 1.5
    stats_path = tmp_path / "stats.json"
    config = PluginConfig(mode="static", class_depths={"none": 0}, stats_path=str(stats_path),
                          idle_write_delay_s=delay_s)
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(SyncExecutor()).build(PeagleScheduler)  # type: ignore[arg-type]

    def burst(names: tuple[str, ...]) -> float:
        """Runs the burst; returns when its last step started (the engine went idle during that step)."""
        for name in names:
            _add(scheduler, name)
        started = time.monotonic()
        while scheduler.get_num_unfinished_requests():
            started = time.monotonic()
            _step(scheduler)
        return started

    last_step = burst(("a", "b"))
    assert not stats_path.exists()  # the step that ended the burst did not write it
    assert _wait_for(stats_path.is_file)
    assert time.monotonic() - last_step >= delay_s  # written delay_s after the engine went idle, not before
    first = PluginStats.load(stats_path)
    assert first.depth_histogram() == {0: 2 * MAX_TOKENS}  # every request-step of the burst

    # Bursts back to back (each starts before the delay is over): nothing written in between ...
    mtime = stats_path.stat().st_mtime_ns
    for names in (("c",), ("d",), ("e",)):
        burst(names)
    assert stats_path.stat().st_mtime_ns == mtime
    # ... and the last one's figures after it.
    assert _wait_for(lambda: stats_path.stat().st_mtime_ns != mtime)
    assert PluginStats.load(stats_path).depth_histogram() == {0: 5 * MAX_TOKENS}
    scheduler.shutdown()
    assert scheduler._idle_writer is not None and scheduler._idle_writer.writes == 2


@needs_vllm
def test_with_no_delay_the_step_that_ends_a_burst_writes_the_file_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the profiling job runs with: its process ends right after its last request, so the file must be complete
    # when the caller has the outputs.
    from test_async_depth import FakeEngineCore
    from test_plugin_off_steps import MAX_TOKENS, SyncExecutor, _add, _step

    from policies.plugin import CONFIG_ENV, PluginConfig, PluginConfigError, PluginStats
    from policies.scheduler import PeagleScheduler

    with pytest.raises(PluginConfigError, match="idle_write_delay_s must be a number of seconds >= 0"):
        PluginConfig(idle_write_delay_s=-1.0)
    stats_path = tmp_path / "stats.json"
    config = PluginConfig(mode="static", class_depths={"none": 0}, stats_path=str(stats_path), idle_write_delay_s=0)
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(SyncExecutor()).build(PeagleScheduler)  # type: ignore[arg-type]
    _add(scheduler, "a")
    while scheduler.get_num_unfinished_requests():
        _step(scheduler)
    assert PluginStats.load(stats_path).depth_histogram() == {0: MAX_TOKENS}  # no wait
    assert scheduler._idle_writer is None
    scheduler.shutdown()


@needs_vllm
def test_aborting_every_request_at_shutdown_writes_the_file_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's shutdown without a drain timeout (its default) aborts every request and the API server kills the engine
    # core right after, usually before `Scheduler.shutdown` runs: the steps since the last write must be on disk then.
    from test_async_depth import FakeEngineCore
    from test_plugin_off_steps import SyncExecutor, _add, _step
    from vllm.v1.request import RequestStatus

    from policies.plugin import CONFIG_ENV, PluginConfig, PluginStats
    from policies.scheduler import PeagleScheduler

    stats_path = tmp_path / "stats.json"
    config = PluginConfig(mode="static", class_depths={"none": 0}, stats_path=str(stats_path),
                          idle_write_delay_s=60.0, flush_every_s=60.0)  # neither timer writes during the test
    monkeypatch.setenv(CONFIG_ENV, str(config.save(tmp_path / "plugin.json")))
    scheduler = FakeEngineCore(SyncExecutor()).build(PeagleScheduler)  # type: ignore[arg-type]
    _add(scheduler, "a")
    _add(scheduler, "b")
    steps = 3
    for _ in range(steps):
        _step(scheduler)
    assert not stats_path.exists()
    aborted = scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    assert {r.request_id for r in aborted} == {"a", "b"}
    # Every request-step so far, as a burst's file has them (both requests were in each of the steps).
    assert PluginStats.load(stats_path).depth_histogram() == {0: 2 * steps}
    scheduler.shutdown()
