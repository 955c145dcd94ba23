"""One line per vLLM engine launch, appended to the file ``PEAGLE_LAUNCH_LOG`` names (unset: nothing is written).

The test suite sets it (tests/conftest.py) and prints the count per test file at the end of a run: engines are what a
run of the suite spends its time on. Called where an engine starts: `autotune.engine._harness` (offline measurements
and profiling runs), `run_vllm_cli` (``vllm serve``) and the tests' own engine drivers.
"""

from __future__ import annotations

import json
import os
import time

LAUNCH_LOG_ENV = "PEAGLE_LAUNCH_LOG"


def note_launch(what: str) -> None:
    """Append ``{"what", "test", "pid", "t"}`` (one JSON line; `test` is pytest's current test, inherited from the
    test process's environment) to the launch log, if one is set. One short ``O_APPEND`` write: concurrent launches
    (pytest-xdist workers, side-by-side engines) never interleave."""
    path = os.environ.get(LAUNCH_LOG_ENV)
    if not path:
        return
    line = json.dumps({"what": what, "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "pid": os.getpid(),
                       "t": round(time.time(), 3)}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
