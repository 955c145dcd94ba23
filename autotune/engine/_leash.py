"""Run a command so that it dies with the process that started it: ``python _leash.py PID [DIR ...] -- CMD ...``.

An engine runs in a process group of its own, so that ending the group ends its engine core and workers with it.
That also puts it out of reach of what ends its parent: a `kill -9` of `peagle-tune search`, a closed terminal or
the OOM killer would leave the engine running, holding its memory (GPU memory on a GPU) until someone finds it. The
leash leads the group: it runs the command as its child and, once every `POLL_S`, checks that the process `PID`
that started it is still its parent. When it is not, it ends the whole group (SIGTERM, then SIGKILL after
`GRACE_S`) and removes the directories named after the PID (a launch's temporary run directory, which its dead
parent would have removed). It imports only the standard library and runs as a script
(`autotune.engine._process` starts it with ``python -I``), so it costs a few MB and milliseconds per launch.

Signals sent to the group (`autotune.engine._process.kill_process_group`) reach the command as before; the leash
waits for it and exits as it did (a command killed by a signal leaves the leash killed by the same signal), so exit
statuses mean what they meant without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

POLL_S = 0.5
"""How often (s) the leash checks that its parent is alive: an orphaned engine is ended within this time."""
GRACE_S = 10.0
"""How long (s) an orphaned engine gets to shut down on SIGTERM before the group is killed."""
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _exit_as(returncode: int) -> None:
    """Exit with `returncode` as `subprocess` reports it: a negative one is death by that signal."""
    if returncode < 0:
        try:
            signal.signal(-returncode, signal.SIG_DFL)  # Python ignores SIGPIPE; the leash ignores SIGTERM ...
        except (OSError, ValueError):
            pass  # SIGKILL's action cannot be set, nor need be
        os.kill(os.getpid(), -returncode)
        time.sleep(1)  # a signal that does not end us (it cannot be caught: SIGKILL always ends us)
    os._exit(returncode & 0xFF)


def _end_group(proc: subprocess.Popen[bytes], remove: list[str]) -> None:
    """The parent is gone: SIGTERM to the group (the command shuts down), remove `remove` once the command is gone
    (or after `GRACE_S`), then SIGKILL."""
    os.killpg(os.getpgrp(), signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the rest of the group, and the leash itself


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        sys.exit("usage: python _leash.py PARENT_PID [DIR_TO_REMOVE ...] -- COMMAND ...")
    split = argv.index("--")
    parent, remove, command = int(argv[0]), argv[1:split], argv[split + 1:]
    # The group's signals are the command's to act on; the leash outlives them to report its status.
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_IGN)
    if os.getppid() != parent:  # the parent died before we started
        for path in remove:
            shutil.rmtree(path, ignore_errors=True)
        os._exit(1)
    proc = subprocess.Popen(command, preexec_fn=_default_signals)  # safe: the leash runs no threads
    while True:
        try:
            _exit_as(proc.wait(timeout=POLL_S))
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            _end_group(proc, remove)


def _default_signals() -> None:
    """In the command: the signals the leash ignores act as usual again."""
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_DFL)


if __name__ == "__main__":
    main(sys.argv[1:])
