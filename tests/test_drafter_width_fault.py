"""A drafter-width patch fault: with one rank the worker falls back to vLLM's own widths; under tensor parallelism
no rank falls back alone (its drafter forward would wait on the others' all-reduces forever), the faulted worker
ends instead and the engine fails. Pure rule first, then the real patch on the fake runner of
tests/test_drafter_width_defer.py (the CPU build runs one rank, so the ranks here are two runner instances)."""

from __future__ import annotations

import importlib.util
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from policies.plugin.drafter_width import DrafterWidthSettings, fault_action, install

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


class WorkerEnded(Exception):
    """Stands in for the worker's exit (``os._exit``) so the test process survives it."""


def test_only_a_single_rank_falls_back_on_its_own() -> None:
    assert fault_action(1) == "fall_back"
    assert [fault_action(tp) for tp in (2, 4, 8)] == ["fail_engine"] * 3
    with pytest.raises(ValueError, match="tensor_parallel_size >= 1"):
        fault_action(0)


def _ranks(tp: int, faulted: set[int]) -> list[tuple[Any, Any]]:
    from test_drafter_width_defer import Runner

    ranks = []
    for rank in range(tp):
        runner = Runner()
        runner.parallel_config = SimpleNamespace(tensor_parallel_size=tp)  # type: ignore[attr-defined]
        status = install(runner, DrafterWidthSettings(fault="propose" if rank in faulted else None), rank)
        assert status.installed
        ranks.append((runner, runner._peagle_drafter_width))  # type: ignore[attr-defined]
    return ranks


def _step(runner: Any, width: int) -> dict[str, Any] | None:
    """One decode step at the scheduler's width (both requests past their prompts); the drafter call it made."""
    from test_drafter_width_defer import PROMPT_E, PROMPT_P

    before = len(runner.drafter.calls)
    runner.step((PROMPT_P, PROMPT_E), {"p": 1, "e": 1}, width=width)
    return runner.drafter.calls[-1] if len(runner.drafter.calls) > before else None


@needs_torch
@pytest.mark.parametrize("faulted", [{0}, {1}])
def test_under_tensor_parallel_a_fault_ends_its_worker_and_no_rank_drafts_another_width(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, faulted: set[int]
) -> None:
    from test_drafter_width_defer import K

    import policies.plugin._drafter_patch as patch_module

    ended: list[int] = []

    def end(code: int) -> None:
        ended.append(code)
        raise WorkerEnded

    monkeypatch.setattr(patch_module, "_end_worker", end)
    widths: list[int | None] = []
    with caplog.at_level(logging.CRITICAL, logger="vllm.peagle_drafter_width"):
        for rank, (runner, _patch) in enumerate(_ranks(2, faulted)):
            try:
                call = _step(runner, 2)
            except WorkerEnded:
                assert rank in faulted
                widths.append(None)
                continue
            widths.append(None if call is None else call["slots"])
    # The healthy rank drafts the planned 2 slots; the faulted one drafts nothing (it is gone), never K = 4.
    assert widths == [None if r in faulted else 2 for r in range(2)] and K not in widths
    assert ended == [70]  # FAULT_EXIT_CODE (EX_SOFTWARE): what vLLM's worker monitor logs as the exit code
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert f"on rank {min(faulted)}" in line and "tensor_parallel_size=2" in line and "drafter_width.enabled" in line


@needs_torch
def test_with_one_rank_a_fault_falls_back_to_full_width_and_serving_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_drafter_width_defer import K

    import policies.plugin._drafter_patch as patch_module

    monkeypatch.setattr(patch_module, "_end_worker", lambda code: pytest.fail("a single rank must not exit"))
    ((runner, patch),) = _ranks(1, {0})
    call = _step(runner, 2)
    # vLLM's parallel drafter cannot take 0 < k < K (vLLM #45695): the fallback drafts K in K slots.
    assert call is not None and (call["k"], call["slots"]) == (K, K)
    assert patch.disabled and patch.counters["faults"] == 1
    assert _step(runner, 2) == call  # and stays at vLLM's widths
