"""Inside a worker: notice at once when vLLM's engine core process dies under a job that is waiting on it.

vLLM 0.32's offline ``LLM`` runs its engine core in a child process. When that process dies (killed, crashed), the
client's monitor thread marks the engine dead (``engine_core.resources.engine_dead``) and shuts the client down,
but an ``LLM.generate`` already waiting for outputs keeps waiting: the worker would sit until the parent's deadline
(``timeout_s``, 30 min by default) and the run would be reported as a timeout. The watchdog polls that flag and
hands a one-line description of the death (process, exit status) to the harness, which reports it and exits.

An engine core stopped by SIGTERM instead shuts down gracefully and aborts the requests in flight: ``LLM.generate``
then returns them cut short (finish reason "abort"), which would pass for a measurement. `raise_if_aborted` turns
that into the same failure.

Runs only where vLLM runs (the worker harness); it touches vLLM objects through attribute lookups, so a vLLM that
names them differently leaves the watchdog idle rather than broken.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

WATCH_POLL_S = 0.5
"""How often (s) the watchdog looks at the engine's liveness flag (a death is reported within this time)."""


class EngineCoreDied(RuntimeError):
    """vLLM's engine core stopped under a job (killed, crashed, or shut down with the job's requests in flight)."""


ENGINE_DIED = EngineCoreDied.__name__
"""The exception type name a worker reports when its engine core process died under it."""


def raise_if_aborted(llm: Any, outputs: Any, what: str) -> None:
    """Raise `EngineCoreDied` when vLLM returned requests of ``outputs`` (``RequestOutput``s of ``what``, e.g.
    "class 'code'") aborted instead of finished: figures measured on them would be cut short."""
    aborted = [o for o in outputs if not o.outputs or o.outputs[0].finish_reason in (None, "abort")]
    if aborted:
        death = engine_core_death(llm) or "vLLM's engine core was stopped under them"
        raise EngineCoreDied(
            f"vLLM aborted {len(aborted)} of {len(outputs)} requests of {what} (finish reason "
            f"{aborted[0].outputs[0].finish_reason if aborted[0].outputs else None!r}): {death}"
        )


def engine_core_death(llm: Any) -> str | None:
    """One line describing why the engine core of ``llm`` (a ``vllm.LLM``) is dead, or None while it is alive.

    Example: ``vLLM's engine core process EngineCore exited unexpectedly (exitcode=-15: killed by SIGTERM)``.
    An exit code of -9 (SIGKILL) is what the kernel's OOM killer leaves, so the line keeps vLLM's spelling
    ``exitcode=-9`` that `classify_failure` reads as out of memory.
    """
    resources = getattr(_engine_core(llm), "resources", None)
    if resources is None or not getattr(resources, "engine_dead", False):
        return None
    manager = getattr(resources, "engine_manager", None)
    finished = getattr(manager, "finished_procs", None)
    codes: dict[str, int] = dict(finished()) if callable(finished) else {}
    if not codes:
        return "vLLM's engine core process exited unexpectedly (exit status unknown)"
    parts = [f"{name} exited unexpectedly ({_status(code)})" for name, code in codes.items()]
    return "vLLM's engine core process " + "; ".join(parts)


def start_engine_watchdog(
    llm: Any, on_death: Callable[[str], None], poll_s: float = WATCH_POLL_S
) -> threading.Thread | None:
    """Call ``on_death(description)`` once, from a daemon thread, when vLLM marks the engine of ``llm`` dead.

    Returns the thread, or None when ``llm`` has no engine core process to watch (in-process engine: a crash there
    kills the worker itself, which the parent sees directly).
    """
    if getattr(_engine_core(llm), "resources", None) is None:
        return None

    def watch() -> None:
        while True:
            death = engine_core_death(llm)
            if death is not None:
                on_death(death)
                return
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="peagle-engine-watchdog", daemon=True)
    thread.start()
    return thread


def _engine_core(llm: Any) -> Any:
    return getattr(getattr(llm, "llm_engine", None), "engine_core", None)


def _status(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = ", e.g. by the kernel's OOM killer" if -code == signal.SIGKILL else ""
        return f"exitcode={code}: killed by {name}{why}"
    return f"exitcode={code}"
