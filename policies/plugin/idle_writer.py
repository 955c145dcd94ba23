"""Writing the plugin's statistics file when the engine goes idle, off the engine core's thread.

The scheduler plugin used to write ``stats.json`` inside ``update_from_output`` of the step that left no request
unfinished, before vLLM sends that step's outputs to the frontend: at concurrency 1 every request's last tokens waited
for the file (0.94 ms per write on this machine: 0.33 ms to serialise, 0.6 ms to write and rename; 0.6-1.4% of a short
request's time, docs/benchmarks/runtime.md). `IdleWriter` writes it on a background thread once the engine has stayed
idle for ``delay_s``: in a closed loop the next request arrives first and nothing is written; at the end of a burst the
file is complete ``delay_s`` later (and at shutdown, which writes it on the engine's thread as before).

The statistics' tables are only changed by the engine's thread while it runs steps (after the last step of a burst
the drafts' hand-over may still add to a scalar counter, which a write reads whole), so the two threads share a lock:
the engine holds it from the first ``schedule()`` after an idle period until it is idle again (`busy` / `idle`), and
the writer writes only with it held (it never waits for it: a busy engine means a new idle period, and a new write, is
coming). An engine step that starts while a write is in progress waits for it (at most one write's time).
"""

from __future__ import annotations

import threading
import time
import types
import weakref
from collections.abc import Callable


class IdleWriter:
    """Calls ``write()`` on a daemon thread once the engine has been idle for ``delay_s`` seconds.

    Engine thread: `busy` before a step touches the statistics, `idle` when no request is left, `stop` at shutdown
    (then write on the engine's own thread). ``write`` must not raise (the plugin's `_flush` logs its own errors).
    A bound method is held weakly: the writer thread never keeps a scheduler that was dropped without `shutdown`
    alive (tests build many).
    """

    def __init__(self, write: Callable[[], None], delay_s: float) -> None:
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be >= 0, but got {delay_s!r}.")
        self._write: Callable[[], Callable[[], None] | None] = (
            weakref.WeakMethod(write) if isinstance(write, types.MethodType) else lambda: write
        )
        self._delay_s = delay_s
        self._lock = threading.Lock()  # held by the engine while it runs steps, by the writer while it writes
        self._busy = False  # the engine holds the lock (engine thread only)
        self._wake = threading.Condition()
        self._due: float | None = None  # when to write (monotonic), None: nothing to write
        self._idle_periods = 0  # counts `idle` calls: a write is for the idle period it was armed in
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.writes = 0
        """Files written by the writer thread (not counting the engine's own writes)."""

    def busy(self) -> None:
        """The engine is about to run a step (waits for a write in progress)."""
        if not self._busy:
            self._lock.acquire()
            self._busy = True

    def idle(self) -> None:
        """No request is left: write the file after ``delay_s`` unless a step starts first."""
        if self._busy:
            self._busy = False
            self._lock.release()
        with self._wake:
            if self._stopped:
                return
            self._idle_periods += 1
            self._due = time.monotonic() + self._delay_s
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="peagle-stats-writer", daemon=True)
                self._thread.start()
            self._wake.notify()

    def stop(self, timeout_s: float = 5.0) -> None:
        """No more writes from the writer thread (a write in progress finishes first)."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (self._due is None or self._due > time.monotonic()):
                    self._wake.wait(None if self._due is None else self._due - time.monotonic())
                if self._stopped:
                    return
                self._due = None
                period = self._idle_periods
            if not self._lock.acquire(blocking=False):  # the engine is running steps again
                continue
            try:
                with self._wake:
                    current = period == self._idle_periods and not self._stopped
                write = self._write() if current else None
                if write is not None:
                    write()
                    self.writes += 1
            finally:
                self._lock.release()
