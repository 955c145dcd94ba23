"""Run a command so that it dies with the process that started it: ``python _leash.py PID [DIR ...] -- CMD ...``.

The leash leads an engine's process group and runs the command as its child. Every `POLL_S` it checks that `PID`
is still its parent; when it is not (`kill -9`, a closed terminal), it ends the group (SIGTERM, SIGKILL after
`GRACE_S`) and removes the DIRs (the launch's temporary run directory). Group signals reach the command as before,
and the leash exits as the command did. Standard library only: it runs as a script under ``python -I``.
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
