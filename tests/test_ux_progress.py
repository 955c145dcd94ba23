"""Long work shows progress (issue 13.8): every engine launch reports start, its phases with the elapsed time, and
its end to `observe_launches`; the CLI turns that into one live line on stderr (phase, elapsed, ETA) in a terminal,
and stays quiet when piped or with --json."""

from __future__ import annotations

import io
import time
from pathlib import Path

from rich.console import Console

from autotune.cli._progress import LaunchLine, clock, launch_progress
from autotune.engine import EngineOptions, LaunchEvent, observe_launches, run_worker

# A stand-in job module: announces phases the way the worker harness does, a second apart, then reports.
SLOW_WORKER = """
import json, sys, time
from pathlib import Path

print("[peagle-worker] phase=load", flush=True)
time.sleep(1.6)
print("[peagle-worker] phase=measure", flush=True)
time.sleep(1.6)
Path(sys.argv[2]).write_text(json.dumps({"ok": True}))
"""


def _run(tmp_path: Path) -> None:
    package = tmp_path / "slowjobs"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "worker.py").write_text(SLOW_WORKER)
    run_dir = tmp_path / f"run-{time.monotonic_ns()}"
    run_dir.mkdir()
    options = EngineOptions(timeout_s=60.0, cpu_kv_cache_gib=None, env={"PYTHONPATH": str(tmp_path)})
    launch = run_worker("slowjobs.worker", {}, run_dir, options, shutdown_grace_s=0.5)
    assert launch.raw == {"ok": True}


def test_every_launch_reports_its_phases_elapsed_time_and_end(tmp_path: Path) -> None:
    events: list[LaunchEvent] = []
    with observe_launches(events.append):
        _run(tmp_path)
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("tick") >= 2
    phases = [e.phase for e in events if e.kind == "tick"]
    assert "load" in phases and "measure" in phases and phases.index("load") < phases.index("measure")
    elapsed = [e.elapsed_s for e in events]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 3.2  # the worker slept 2 x 1.6 s
    assert events[-1].ok is True and events[-1].timeout_s == 60.0


def test_nothing_is_observed_outside_the_block(tmp_path: Path) -> None:
    events: list[LaunchEvent] = []
    with observe_launches(events.append):
        pass
    _run(tmp_path)
    assert events == []


def _event(kind: str, elapsed: float, phase: str = "load") -> LaunchEvent:
    return LaunchEvent(kind, "measurement", phase, elapsed, 1800.0, None if kind != "end" else True)  # type: ignore[arg-type]


def test_the_line_has_phase_elapsed_and_an_eta_from_earlier_launches() -> None:
    line = LaunchLine()
    first = line.update(_event("start", 0.0))
    assert first is not None and "engine launch 1 (measurement): load, 0:00 elapsed" in first
    assert "ETA ?" in first and "30:00" in first  # nothing to estimate from yet; the deadline is said
    assert line.update(_event("end", 90.0)) is None
    line.update(_event("start", 0.0))
    later = line.update(_event("tick", 30.0, "measure"))
    assert later is not None and "engine launch 2 (measurement): measure, 0:30 elapsed, ETA ~1:00" in later
    assert clock(3725) == "1:02:05"


def test_progress_only_in_a_terminal() -> None:
    piped = Console(file=io.StringIO(), force_terminal=False)
    with launch_progress(piped, enabled=True) as line:
        assert line is None
    shown: list[str | None] = []
    terminal = Console(file=io.StringIO(), force_terminal=True)
    with launch_progress(terminal, enabled=False) as line:
        assert line is None
    with launch_progress(terminal, enabled=True, show=shown.append) as line:
        assert line is not None
        with observe_launches(lambda e: None):
            pass
    assert shown == []  # no launch happened


def test_search_json_and_piped_output_have_no_progress(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from autotune.cli import main

    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--concurrency", "1", "--max-k", "2",
                                       "--trials", "5", "--json", "--db", str(tmp_path / "p.db")])
    assert result.exit_code == 0, result.output
    assert "engine launch" not in result.stderr and "complete" not in result.stderr
    assert "\n\n" not in result.stderr.strip()


def test_search_progress_shows_the_launch_on_its_own_line() -> None:
    from rich.console import Group

    from autotune.cli._progress import ProgressWithLaunch

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    progress = ProgressWithLaunch(console=console, auto_refresh=False)
    task = progress.add_task("ok 3, failed 0", total=10, completed=3)
    assert task == 0
    progress.launch_line = "engine launch 4 (measurement): load, 0:12 elapsed, ETA ~0:40"
    console.print(Group(*progress.get_renderables()))
    lines = out.getvalue().splitlines()
    assert "ok 3, failed 0" in lines[0] and lines[1] == "  " + progress.launch_line
