"""Engine processes: process groups, health checks and the one poll-with-deadline loop.

An engine (``LLM`` or ``vllm serve``) spawns an engine core and workers; they join the leader's process group, so
ending the group ends all of them and releases their memory. The leader is a leash (`autotune.engine._leash`) that
runs the command and ends the group when the process that started it dies, so no engine outlives a killed
`peagle-tune`. Exit statuses follow one rule: a status is reported
only when the process exited on its own; one we caused (SIGKILL after a deadline) says nothing about the run and is
reported as None.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from autotune.engine._constants import GROUP_EXIT_WAIT_S, HEALTH_TIMEOUT_S, LOOPBACK, ORPHAN_GRACE_S, POLL_S

PollOutcome = Literal["done", "exited", "timeout"]


#: The leash script: run as a file with ``python -I`` (the standard library only, no package imports).
LEASH = Path(__file__).with_name("_leash.py")


def start_process_group(
    cmd: Sequence[str], log_path: Path | None, env: Mapping[str, str], *, remove: Sequence[Path] = ()
) -> subprocess.Popen[bytes]:
    """Start `cmd` in a new process group (its engine children join it), led by a leash that ends the group when
    this process dies, and then removes the directories `remove`; the leash exits as `cmd` does, so the returned
    process's status is `cmd`'s.

    Output goes to `log_path` (appended, stderr included), or to this process's stdout/stderr when None.
    """
    cmd = [sys.executable, "-I", str(LEASH), str(os.getpid()), *(str(p) for p in remove), "--", *cmd]
    if log_path is None:
        return subprocess.Popen(list(cmd), env=dict(env), start_new_session=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )


def signal_process_group(proc: subprocess.Popen[Any], signum: int) -> None:
    """Send `signum` to every process in `proc`'s group (started by `start_process_group`). Never raises."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)  # start_new_session made the leader's pid the group id


def kill_process_group(proc: subprocess.Popen[Any], grace_s: float = 0.0) -> None:
    """End `proc` and every process in its group: SIGTERM, `grace_s` to exit, then SIGKILL. Never raises.

    Returns only when no member of the group is left (or after `GROUP_EXIT_WAIT_S`), so the next engine does not
    start while this one still holds memory.
    """
    if grace_s > 0 and proc.poll() is None:
        signal_process_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if proc.poll() is not None:
        # The leader exited on its own: let the rest of the group finish too. Python's resource_tracker unlinks
        # the engine's /dev/shm segments only after the leader is gone; SIGKILL now would leak them.
        _wait_group_gone(proc.pid, ORPHAN_GRACE_S)
    # Orphaned engine-core/worker processes would keep their memory.
    signal_process_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GROUP_EXIT_WAIT_S)
    # SIGKILL is asynchronous: wait until the group's other members (not our children) are really gone.
    _wait_group_gone(proc.pid, GROUP_EXIT_WAIT_S)


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for process group `pgid` to have no live member; True when it has none."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def poll_until(
    done: Callable[[], bool],
    proc: subprocess.Popen[Any],
    deadline: float,
    *,
    interval_s: float = POLL_S,
    on_tick: Callable[[], None] | None = None,
) -> PollOutcome:
    """Wait until `done()` ("done"), `proc` exits ("exited") or ``time.monotonic()`` passes `deadline` ("timeout").

    `done` is checked first, so a worker that wrote its result and exited counts as done. `on_tick` runs once per
    poll (e.g. to report progress from the log).
    """
    while True:
        if on_tick is not None:
            on_tick()
        if done():
            return "done"
        if proc.poll() is not None:
            return "exited"
        if time.monotonic() > deadline:
            return "timeout"
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=interval_s)


def own_returncode(proc: subprocess.Popen[Any], outcome: PollOutcome) -> int | None:
    """`proc`'s exit status when it exited on its own ("exited" or "done" and already gone), else None."""
    return proc.returncode if outcome != "timeout" and proc.poll() is not None else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def is_healthy(base_url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """True when ``GET {base_url}/health`` answers 200 within `timeout_s`."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout_s) as resp:  # noqa: S310 - our server
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
