"""What went wrong in one engine run: the failure kind (invalid_config, out_of_memory, engine_died, timeout,
stalled) and a one-line reason that says what to do, from the worker's report, the exit status and the engine log."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from autotune.engine._stall import STALL_ENV, STALLED
from autotune.measurement import FailureKind

LOG_TAIL_LINES = 40
_LOG_LINE_MAX_CHARS = 500
#: Lines a worker (``[peagle-worker]``) or a measurement server (``[peagle-serve]``) writes when it enters a phase.
_PHASE_RE = re.compile(r"\[peagle-(?:worker|serve)\] phase=(\w+)")
#: Exceptions that mean "vLLM rejected this configuration" when raised while the engine is being built.
_INVALID_TYPES = frozenset({"ValueError", "ValidationError", "TypeError", "NotImplementedError"})
_OOM_RE = re.compile(
    "|".join(
        [
            r"out of memory",
            r"OutOfMemoryError",
            r"Cannot allocate memory",
            r"(?<![\w.])MemoryError",
            r"No available memory for the cache blocks",
            r"KV cache is needed, which is larger than the available",
            r"less than requested memory for kv",
            r"exit ?code:? ?-9\b",
            r"exitcode[=: ]+-9\b",
        ]
    ),
    re.IGNORECASE,
)
#: vLLM's refusal when memory is already taken at start-up (another engine, another process): its CPU wording
#: (``v1/worker/cpu_worker.py`` 83-93, "Available memory on node ... is less than desired CPU memory utilization")
#: and its GPU wordings (``v1/worker/utils.py`` 740-771: "Free memory on device cuda:0 (.../... GiB) on startup is
#: less than desired GPU memory utilization (0.92, ... GiB)", or "... is less than the engine's budget after
#: excluding external process's weights").
_FREE_MEMORY_RE = re.compile(
    r"less than desired (?:CPU|GPU) memory utilization|on startup is less than the engine's budget", re.IGNORECASE
)
_ERROR_RE = re.compile(r"\b((?:\w+\.)*([A-Z]\w*(?:Error|Exception))): (.+)$")
#: Wrappers vLLM raises around the real error; the root cause is logged before them.
_GENERIC_ERRORS = (
    "Engine core initialization failed",
    "WorkerProc initialization failed",
    "EngineCore encountered an issue",
)
_LOG_LEVELS = (" INFO ", " WARNING ", " DEBUG ")


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of an engine log (each cut to 500 characters; vLLM logs its config on one line)."""
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").replace("\r", "\n")
    tail = [ln[:_LOG_LINE_MAX_CHARS] for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(tail)


def phase_marks(log_text: str) -> list[str]:
    """The phases a worker or measurement server announced in its log, in order."""
    return _PHASE_RE.findall(log_text)


def last_phase(log_text: str, default: str = "start") -> str:
    """The last phase announced in an engine log (`default` when none was)."""
    marks = phase_marks(log_text)
    return marks[-1] if marks else default


def _error_lines(log_text: str) -> list[str]:
    """Log lines that can carry an error: tracebacks and ERROR records, not INFO/WARNING chatter."""
    return [ln for ln in log_text.splitlines() if not any(level in ln for level in _LOG_LEVELS)]


def root_cause(log_text: str) -> tuple[str, str] | None:
    """(exception type, message) of the first real error in an engine log, skipping vLLM's wrappers.

    Example: a log holding ``ValueError: For parallel drafting, ...`` and later ``RuntimeError: Engine core
    initialization failed. See root cause above.`` gives ``("ValueError", "For parallel drafting, ...")``.
    """
    for line in _error_lines(log_text):
        m = _ERROR_RE.search(line)
        if m and not any(g in m[3] for g in _GENERIC_ERRORS):
            return m[2], m[3].strip()
    return None


def _one_line(message: str, limit: int = 400) -> str:
    """Multi-line exception text (pydantic's) as one line, without its documentation links."""
    parts = [p.strip() for p in message.splitlines() if p.strip() and "errors.pydantic.dev" not in p]
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_failure(
    *,
    phase: str,
    exc_types: list[str],
    message: str,
    returncode: int | None,
    timed_out: bool,
    log_text: str,
    timeout_s: float,
    kind_hint: FailureKind | None = None,
) -> tuple[FailureKind, str]:
    """Decide what went wrong in one engine run and say what to do about it.

    `phase` is where the run was (start, import, load, warmup, measure), `exc_types` the MRO names of the
    exception the worker caught (empty when it died without reporting), `returncode` the worker's exit status
    (negative: killed by that signal; None: it did not exit on its own). Order: timeout, a stall (no progress for
    the stall bound, `autotune.engine._stall`), then memory evidence, then a rejected config (an exception such as
    ValueError while building the engine), else the engine died.
    """
    cause = root_cause(log_text)
    generic = not message or any(g in message for g in _GENERIC_ERRORS)
    detail = _one_line(cause[1] if cause and generic else message or (cause[1] if cause else ""))
    evidence = "\n".join([message, *_error_lines(log_text)])

    if timed_out:
        return "timeout", (
            f"No result within timeout_s={timeout_s:g} s (the engine was in phase '{phase}'); raise timeout_s "
            "or measure fewer or shorter requests (Scenario.num_prompts, max_tokens)."
        )
    if STALLED in exc_types:
        return "stalled", (
            f"The engine made {message}. Nothing was measured; if a step of this model can take that long, raise "
            f"{STALL_ENV}, else find what stopped the engine (a stopped process, a swapping machine, a hung device)."
        )
    if _FREE_MEMORY_RE.search(evidence):
        return "out_of_memory", (
            f"Out of memory during {phase}: {detail}. Another process (another engine side by side?) holds the "
            "memory this engine asked for: lower gpu_memory_utilization to what is free, or stop that process."
        )
    oom = _OOM_RE.search(evidence)
    if oom or returncode == -signal.SIGKILL:
        why = detail if oom else "the process was killed by SIGKILL, most likely by the kernel's OOM killer"
        return "out_of_memory", (
            f"Out of memory during {phase}: {why}. Lower max_num_seqs, max_model_len or K, or give the engine "
            "more memory (gpu_memory_utilization on GPU; VLLM_CPU_KVCACHE_SPACE on CPU)."
        )
    if kind_hint == "invalid_config":
        return "invalid_config", f"vLLM rejected a request of this config: {detail}"
    types = set(exc_types) | ({cause[0]} if cause and generic else set())
    if phase in ("start", "load") and exc_types and types & _INVALID_TYPES:
        return "invalid_config", f"vLLM rejected the config: {detail}"
    if returncode is not None and returncode < 0:
        how = f"killed by {signal.Signals(-returncode).name}"
    elif exc_types:
        how = exc_types[0]
    else:
        how = f"exit code {returncode}"
    return "engine_died", (
        f"The engine died during {phase} ({how}){': ' + detail if detail else ''}. See log_tail; "
        "if it repeats, run this config alone to reproduce it."
    )
