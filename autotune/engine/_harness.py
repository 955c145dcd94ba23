"""The engine-subprocess harness every worker runs in: ``python -m <job module> JOB.json RESULT.json``.

One process runs one job on a fresh ``vllm.LLM`` and exits, so engine memory is released and a crash cannot take
the tuner down. The harness loads the engine, announces phases, catches every failure and writes the result
atomically; the job module (`autotune.engine._offline` for measurements, `autotune.profiling._worker` for profiles)
only says what to run on the loaded engine. A watchdog (`autotune.engine._watchdog`) reports an engine core that
dies under the job at once (vLLM would leave the job waiting). The parent (`autotune.engine.run_worker`) writes the
job, watches the process and classifies failures.

Job (JSON): ``model``, ``engine_kwargs`` (passed to ``LLM(...)``) and the job's own keys.
Result (JSON): ``{"ok": true, "timings": {"import_s", "load_s", ...}, ...the job's keys}`` or
``{"ok": false, "phase", "exc_type", "exc_types", "message"}``.

Test hook: ``PEAGLE_VLLM_WORKER_FAULT=SIGNAL@PHASE`` (e.g. ``SIGKILL@measure``) makes the worker send itself SIGNAL
when it enters PHASE (start, import, load, warmup, measure), to test how the parent handles a dying engine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.engine._launch_log import note_launch
from autotune.engine._stall import STALLED, Progress, stall_bound, start_stall_watch, watch_engine_steps
from autotune.engine._watchdog import ENGINE_DIED, start_engine_watchdog
from autotune.workloads import WorkloadRequest

#: Lines the parent reads to know how far the worker got ("phase=load" when it timed out loading the model).
PHASE_MARK = "[peagle-worker] phase="
FAULT_ENV = "PEAGLE_VLLM_WORKER_FAULT"

_state: dict[str, Any] = {"phase": "start", "engine": None}
_result_lock = threading.Lock()  # one result per run: the job's own, or the engine-death report of the watchdog


def enter(phase: str) -> None:
    """Announce `phase` in the log (and fire the fault hook when it names this phase)."""
    _state["phase"] = phase
    print(f"{PHASE_MARK}{phase}", flush=True)
    fault = os.environ.get(FAULT_ENV, "")
    if "@" in fault:
        sig_name, fault_phase = fault.split("@", 1)
        if fault_phase == phase:
            print(f"[peagle-worker] test hook {FAULT_ENV}: sending {sig_name} to self", flush=True)
            os.kill(os.getpid(), getattr(signal, sig_name))


@dataclass
class EngineSession:
    """The loaded engine a job runs on, and the timings (s) the result reports."""

    llm: Any
    """The ``vllm.LLM``."""
    tokenizer: Any
    timings: dict[str, float] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    """Ticked by every engine step (`autotune.engine._stall`): a job reads a measured class's longest gap here."""

    def prompt(self, request: WorkloadRequest) -> str | dict[str, list[int]]:
        """What ``LLM.generate`` / ``LLMEngine.add_request`` get for `request`, decided by
        `WorkloadRequest.is_chat` as serve mode decides its endpoint (`autotune.engine._client`).

        Raw text as it is (vLLM tokenizes it with special tokens, as ``/v1/completions`` does). Chat messages as
        ``/v1/chat/completions`` renders them: the model's chat template with the generation prompt, the text then
        tokenized without adding special tokens (the template writes them; ``add_special_tokens`` defaults to False in
        ``vllm/entrypoints/openai/chat_completion/protocol.py`` 337-346), passed as token ids. vLLM renders gpt-oss
        chats with openai-harmony instead (``vllm/renderers/online_renderer.py`` 185); its ``chat_template.jinja``
        writes the same harmony format. Raises ValueError when the model has no chat template (the server refuses
        such a chat too).
        """
        if not request.is_chat:
            return request.text()
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "the workload has chat requests (\"messages\") but the model's tokenizer has no chat template; "
                "give the requests as \"prompt\" text, or use a model with a chat template"
            )
        text = self.tokenizer.apply_chat_template(list(request.messages or ()), tokenize=False,
                                                  add_generation_prompt=True)
        return {"prompt_token_ids": [int(i) for i in self.tokenizer.encode(str(text), add_special_tokens=False)]}


def request_from_dict(data: Mapping[str, Any]) -> WorkloadRequest:
    """A `WorkloadRequest` from its ``to_dict()`` (extra keys such as "class" are ignored)."""
    messages = data.get("messages")
    return WorkloadRequest(
        prompt=data.get("prompt"),
        messages=tuple(messages) if messages is not None else None,
        max_tokens=int(data.get("max_tokens", 128)),
        temperature=float(data.get("temperature", 0.0)),
    )


def _load(job: Mapping[str, Any]) -> EngineSession:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    enter("import")
    from vllm import LLM

    timings["import_s"] = time.perf_counter() - t
    enter("load")
    note_launch(f"offline {job['model']}")
    t = time.perf_counter()
    llm = _state["engine"] = LLM(model=job["model"], **job["engine_kwargs"])
    timings["load_s"] = time.perf_counter() - t
    return EngineSession(llm, llm.get_tokenizer(), timings)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: the parent never reads half a result


def _report_engine_death(result_path: Path, death: str, exc_type: str = ENGINE_DIED) -> None:
    """The engine core died (or stalled: `exc_type` STALLED) under the job, the watchdog's call: report it now and
    exit, instead of waiting on the engine until the parent's deadline. Nothing happens once the job's own result is
    written."""
    with _result_lock:
        if _state.get("reported"):
            return
        print(f"[peagle-worker] {death}", flush=True)
        result = {
            "ok": False,
            "phase": _state["phase"],
            "exc_type": exc_type,
            "exc_types": [exc_type, "RuntimeError"],
            "message": death,
        }
        _write_json(result_path, result)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _shutdown_engine() -> None:
    """Stop the engine core now (the result is written): the default shutdown waits ~5 s for the engine's worker
    process before killing it anyway. The engine core is terminated, and killed at once if it lingers, so a scheduler
    plugin's statistics must be complete before (the profiling job writes them as its last request ends)."""
    core = getattr(getattr(_state["engine"], "llm_engine", None), "engine_core", None)
    if core is None:
        return
    try:
        core.shutdown(timeout=0)
    except Exception:  # the parent kills the whole process group next, whatever happens here
        traceback.print_exc()


def request_latencies(output: Any) -> tuple[float | None, float | None]:
    """(TTFT ms, TPOT ms) of one finished request from its RequestStateStats; None when not available."""
    stats = getattr(output, "metrics", None)
    if stats is None or not getattr(stats, "first_token_ts", 0.0):
        return None, None
    ttft = (stats.first_token_ts - stats.scheduled_ts) * 1000.0 if stats.scheduled_ts else None
    n = len(output.outputs[0].token_ids) if output.outputs else 0
    tpot = (stats.last_token_ts - stats.first_token_ts) * 1000.0 / (n - 1) if n >= 2 else None
    return ttft, tpot


def worker_main(
    prog: str, argv: list[str], run_job: Callable[[Mapping[str, Any], EngineSession], dict[str, Any]]
) -> int:
    """Run one job: ``argv`` is ``[JOB.json, RESULT.json]``; returns the exit status (0: ok, 1: failed, 2: usage).

    `prog` is the job module's name, for the usage line.
    """
    if len(argv) != 2:
        print(f"usage: python -m {prog} JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    result_path = Path(argv[1])
    enter("start")
    try:
        session = _load(job)
        start_engine_watchdog(session.llm, lambda death: _report_engine_death(result_path, death))
        stall_s = stall_bound(session.timings["load_s"], job.get("stall_s"))
        watch_engine_steps(session.llm, session.progress)
        start_stall_watch(session.progress, stall_s, lambda: str(_state["phase"]),
                          lambda why: _report_engine_death(result_path, why, STALLED), f"worker pid {os.getpid()}")
        payload = run_job(job, session)
        enter("done")
        result: dict[str, Any] = {"ok": True, "timings": session.timings, "stall_s": stall_s, **payload}
    except BaseException as exc:  # report every failure, including SystemExit from deep inside the engine
        traceback.print_exc()
        sys.stderr.flush()
        result = {
            "ok": False,
            "phase": _state["phase"],
            "exc_type": type(exc).__name__,
            "exc_types": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
        }
    with _result_lock:
        _state["reported"] = True
        _write_json(result_path, result)
    sys.stdout.flush()
    _shutdown_engine()
    return 0 if result["ok"] else 1
