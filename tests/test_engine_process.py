"""Engine launches without an engine: a stand-in job module shows how `run_worker` watches, ends and reports a
worker (exit statuses, deadlines, the whole process group), and `poll_until`'s three outcomes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.engine import EngineOptions, LaunchResult, run_worker, start_process_group
from autotune.engine._process import poll_until

# Stands in for a job module: does what the job says (write a result, leave a child behind, exit, hang, signal).
FAKE_WORKER = """
import json, os, signal, subprocess, sys, time
from pathlib import Path

job = json.loads(Path(sys.argv[1]).read_text())
print("[peagle-worker] phase=start", flush=True)
print("[peagle-worker] phase=" + job.get("phase", "load"), flush=True)
if job.get("child"):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if "result" in job:
    Path(sys.argv[2]).write_text(json.dumps(job["result"]))
if "signal" in job:
    os.kill(os.getpid(), getattr(signal, job["signal"]))
if job.get("hang"):
    time.sleep(600)
sys.exit(job.get("exit", 0))
"""


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (from /proc/<pid>/stat field 5)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _run(tmp_path: Path, job: dict[str, object], timeout_s: float = 30.0) -> LaunchResult:
    package = tmp_path / "fakejobs"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "worker.py").write_text(FAKE_WORKER)
    run_dir = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    run_dir.mkdir()
    options = EngineOptions(timeout_s=timeout_s, cpu_kv_cache_gib=None, env={"PYTHONPATH": str(tmp_path)})
    launch = run_worker("fakejobs.worker", job, run_dir, options, shutdown_grace_s=0.5)
    assert launch.pid is not None and group_members(launch.pid) == []  # nothing of the group is left
    return launch


def test_a_worker_that_reports_and_exits_is_ok_with_its_exit_status(tmp_path: Path) -> None:
    launch = _run(tmp_path, {"result": {"ok": True, "classes": {}}, "child": True})
    assert launch.ok and launch.returncode == 0 and not launch.timed_out and launch.failure() is None
    assert "phase=load" in launch.log_tail


def test_a_status_we_caused_is_not_reported(tmp_path: Path) -> None:
    # The worker reports a failure, then does not exit within the shutdown grace: we SIGKILL it. That -9 is ours, so
    # the run is classified from its report (engine died), not as the kernel's OOM killer.
    failed = {"ok": False, "phase": "measure", "exc_types": ["EngineDeadError", "Exception"], "message": "boom"}
    launch = _run(tmp_path, {"result": failed, "hang": True})
    assert launch.returncode is None and not launch.timed_out
    kind, reason = launch.failure() or ("", "")
    assert kind == "engine_died" and "EngineDeadError" in reason and "measure" in reason


def test_exit_statuses_of_workers_that_died_on_their_own_are_reported(tmp_path: Path) -> None:
    launch = _run(tmp_path, {"exit": 3, "phase": "warmup"})
    assert launch.returncode == 3
    kind, reason = launch.failure() or ("", "")
    assert kind == "engine_died" and "exit code 3" in reason and "warmup" in reason  # phase from the log
    launch = _run(tmp_path, {"signal": "SIGKILL", "phase": "measure"})
    assert launch.returncode == -signal.SIGKILL
    assert (launch.failure() or ("",))[0] == "out_of_memory"


def test_a_worker_without_a_result_by_the_deadline_timed_out(tmp_path: Path) -> None:
    started = time.monotonic()
    launch = _run(tmp_path, {"hang": True, "child": True}, timeout_s=1.0)
    assert time.monotonic() - started < 20  # killed at the deadline (plus start-up), not after the child's 600 s
    assert launch.timed_out and launch.returncode is None
    kind, reason = launch.failure() or ("", "")
    assert kind == "timeout" and "timeout_s=1" in reason and "'load'" in reason


def test_poll_until_says_done_exited_or_timeout(tmp_path: Path) -> None:
    env = dict(os.environ)
    sleeper = start_process_group([sys.executable, "-c", "import time; time.sleep(600)"], None, env)
    try:
        assert poll_until(lambda: True, sleeper, time.monotonic() + 5) == "done"
        assert poll_until(lambda: False, sleeper, time.monotonic() + 0.3, interval_s=0.05) == "timeout"
    finally:
        sleeper.kill()
        sleeper.wait()
    quick = start_process_group([sys.executable, "-c", "pass"], tmp_path / "log", env)
    assert poll_until(lambda: False, quick, time.monotonic() + 30) == "exited" and quick.returncode == 0


@pytest.mark.parametrize("grace_s", [0.0, 2.0])
def test_kill_process_group_ends_children_of_the_leader(tmp_path: Path, grace_s: float) -> None:
    from autotune.engine import kill_process_group

    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \
        "time.sleep(600)"
    proc = start_process_group([sys.executable, "-c", code], None, dict(os.environ))
    deadline = time.monotonic() + 10
    while len(group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_process_group(proc, grace_s=grace_s)
    assert proc.poll() is not None and group_members(proc.pid) == []


# Starts an engine-like group (a command with a child of its own), prints the group id, then waits to be killed.
# SIGHUP at its default action, as for a command in a terminal (under `nohup`, or a runner that ignores SIGHUP, the
# child would inherit SIG_IGN and outlive the hang-up, as `nohup` intends).
PARENT = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from autotune.engine import start_process_group
engine = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \\
    "time.sleep(600)"
proc = start_process_group([sys.executable, "-c", engine], None, dict(os.environ), remove=[Path(sys.argv[1])])
print(proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_an_engine_group_ends_when_the_process_that_started_it_dies(tmp_path: Path, signum: int) -> None:
    # Issue 44.2: `kill -9` of `search` (or a closed terminal) left the worker, EngineCore and VLLM::Worker running,
    # and the launch's temporary run directory behind.
    run_dir = tmp_path / "ptune-run-x"
    (run_dir / "sub").mkdir(parents=True)
    (run_dir / "sub" / "engine.log").write_text("log")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pgid = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while len(group_members(pgid)) < 3:  # the leash, the command and its child
        assert time.monotonic() < deadline, group_members(pgid)
        time.sleep(0.05)
    parent.send_signal(signum)
    parent.wait(timeout=30)
    # The leash notices within its poll (0.5 s) and ends the group; these commands die at the first SIGTERM.
    deadline = time.monotonic() + 10
    while group_members(pgid):
        assert time.monotonic() < deadline, f"left running: {group_members(pgid)}"
        time.sleep(0.1)
    assert not run_dir.exists()


def test_only_a_temporary_run_directory_is_left_to_the_leash_to_remove(tmp_path: Path) -> None:
    # A kept run directory (--log-dir) holds the logs a user asked for: never removed.
    from autotune.engine._runs import run_directory, temporary

    with run_directory(None, "ptune-run-") as run_dir:
        assert temporary(run_dir) == (run_dir,)
    assert temporary(run_dir) == ()
    with run_directory(tmp_path / "logs", "ptune-run-") as kept:
        assert temporary(kept) == ()
