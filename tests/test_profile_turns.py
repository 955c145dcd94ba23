"""Two profile launches taking turns (`autotune.profiling._turns`): the parent's side against workers that follow the
protocol in threads (what `autotune.profiling._worker` does around each phase), no engine."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from autotune.profiling._turns import TurnAborted, Turns, take_turns, turn_order


def test_the_launches_alternate_phase_by_phase_and_swap_who_goes_first() -> None:
    assert turn_order(["baseline", "speculative"], 4) == [
        (0, "baseline"), (0, "speculative"), (1, "speculative"), (1, "baseline"),
        (2, "baseline"), (2, "speculative"), (3, "speculative"), (3, "baseline"),
    ]
    assert turn_order(["a", "b"], 0) == []


class _Worker(threading.Thread):
    """A launch: warm-up, then ``phases`` phases, each only when told; ``die_after`` phases, then it ends early."""

    def __init__(self, turns: Turns, phases: int, log: list[tuple[str, int, str]], lock: threading.Lock,
                 die_after: int | None = None, warmup_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.turns, self.phases, self.log, self.lock = turns, phases, log, lock
        self.die_after, self.warmup_s = die_after, warmup_s
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            time.sleep(self.warmup_s)
            self.turns.ready()
            for n in range(self.phases):
                if self.die_after is not None and n == self.die_after:
                    return  # the engine died
                self.turns.wait_go(n)
                with self.lock:
                    self.log.append((self.turns.name, n, "start"))
                time.sleep(0.01)
                with self.lock:
                    self.log.append((self.turns.name, n, "end"))
                self.turns.done(n)
        except BaseException as exc:  # noqa: BLE001 - recorded for the test
            self.error = exc


def _run(tmp_path: Path, phases: int, die_after: dict[str, int] | None = None,
         warmup_s: dict[str, float] | None = None) -> tuple[str | None, list[tuple[str, int, str]], dict[str, _Worker]]:
    log: list[tuple[str, int, str]] = []
    lock = threading.Lock()
    names = ("baseline", "speculative")
    workers = {
        name: _Worker(Turns(tmp_path, name), phases, log, lock, (die_after or {}).get(name),
                      (warmup_s or {}).get(name, 0.0))
        for name in names
    }
    for w in workers.values():
        w.start()
    first_out = take_turns(tmp_path, names, phases, lambda name: workers[name].is_alive(), settle_s=0.0)
    for w in workers.values():
        w.join(timeout=10)
        assert not w.is_alive()
    return first_out, log, workers


def test_each_phase_runs_alone_in_turn_order_after_both_launches_warmed_up(tmp_path: Path) -> None:
    # The baseline is slow to warm up: the speculative launch must not start measuring before it is ready.
    first_out, log, workers = _run(tmp_path, 3, warmup_s={"baseline": 0.2})
    assert first_out is None
    assert all(w.error is None for w in workers.values())
    expected = []
    for n, name in turn_order(["baseline", "speculative"], 3):
        expected += [(name, n, "start"), (name, n, "end")]
    assert log == expected  # never two phases at once, in the alternating order
    assert not (tmp_path / "abort").exists()


def test_a_launch_that_dies_is_named_and_the_other_stops_instead_of_waiting(tmp_path: Path) -> None:
    first_out, log, workers = _run(tmp_path, 3, die_after={"baseline": 1})
    assert first_out == "baseline"
    assert (tmp_path / "abort").exists()
    # The speculative launch ran its phases 0 and 1 (its turn in phase 1 comes before the baseline's), then stopped.
    assert [(name, n) for name, n, what in log if what == "end"] == [("baseline", 0), ("speculative", 0),
                                                                       ("speculative", 1)]
    assert isinstance(workers["speculative"].error, TurnAborted)


def test_a_launch_that_dies_before_its_first_phase_is_named_and_the_other_stops(tmp_path: Path) -> None:
    first_out, log, workers = _run(tmp_path, 2, die_after={"speculative": 0})
    assert first_out == "speculative"
    assert [(name, n) for name, n, what in log if what == "end"] == [("baseline", 0)]
    assert isinstance(workers["baseline"].error, TurnAborted)


def test_a_launch_whose_parent_is_gone_stops_waiting(tmp_path: Path) -> None:
    turns = Turns(tmp_path, "baseline", parent=-1)  # no process has that id: this one was re-parented
    with pytest.raises(TurnAborted, match="gone"):
        turns.wait_go(0)
