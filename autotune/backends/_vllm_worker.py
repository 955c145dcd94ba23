"""Engine subprocess of the vllm backend: ``python -m autotune.backends._vllm_worker JOB.json RESULT.json``.

One process runs one measurement on a fresh ``vllm.LLM`` and exits, so engine memory is released and a crash
cannot take the tuner down. The parent (`autotune.backends.vllm`) writes the job, tails this process's log and
classifies failures; this module only runs the engine and reports what happened.

Job (JSON): ``model``, ``engine_kwargs`` (passed to ``LLM(...)``), ``classes`` ({class: [request dicts]}),
``warmup_requests``, ``ignore_eos``, ``return_outputs``.

Result (JSON): ``{"ok": true, "timings": {...}, "classes": {class: {"wall_s", "output_tokens", "ttft_ms",
"tpot_ms", "spec", "outputs"?}}}`` or ``{"ok": false, "phase", "exc_type", "exc_types", "message"}``.

Measured per request (from ``RequestOutput.metrics``, a ``RequestStateStats``; engine-core monotonic clock):
- TTFT (ms) = ``first_token_ts - scheduled_ts``: from the step that first schedules the request to its first
  token. All prompts are queued at once, so waiting for a free slot (which a closed-loop client at the same
  concurrency would spend before sending) is excluded.
- TPOT (ms) = ``(last_token_ts - first_token_ts) / (generated tokens - 1)``, for requests with >= 2 tokens.
Speculative counters are deltas of ``LLM.get_metrics()`` around each class's measured sub-phase.

Test hook: ``PEAGLE_VLLM_WORKER_FAULT=SIGNAL@PHASE`` (e.g. ``SIGKILL@measure``) makes this process send itself
SIGNAL when it enters PHASE (start, load, warmup, measure), to test how the parent handles a dying engine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune.workloads import WorkloadRequest

#: Lines the parent greps to know how far the worker got ("phase=load" when it timed out loading the model).
PHASE_MARK = "[peagle-worker] phase="
FAULT_ENV = "PEAGLE_VLLM_WORKER_FAULT"
#: Warm-up requests are cut to this many tokens: enough to run prefill, drafting and verification.
WARMUP_MAX_TOKENS = 16

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

_phase = "start"
_engine: Any = None


def _enter(phase: str) -> None:
    global _phase
    _phase = phase
    print(f"{PHASE_MARK}{phase}", flush=True)
    fault = os.environ.get(FAULT_ENV, "")
    if "@" in fault:
        sig_name, fault_phase = fault.split("@", 1)
        if fault_phase == phase:
            print(f"[peagle-worker] test hook {FAULT_ENV}: sending {sig_name} to self", flush=True)
            os.kill(os.getpid(), getattr(signal, sig_name))


def spec_snapshot(metrics: list[Any]) -> dict[str, Any]:
    """Sum vLLM's cumulative speculative counters over label sets (engines) from ``LLM.get_metrics()``."""
    snap: dict[str, Any] = {field: 0 for field in SPEC_COUNTERS.values()}
    per_pos: list[int] = []
    for m in metrics:
        if m.name in SPEC_COUNTERS:
            snap[SPEC_COUNTERS[m.name]] += int(m.value)
        elif m.name == SPEC_PER_POS:
            values = [int(v) for v in m.values]
            per_pos += [0] * (len(values) - len(per_pos))
            for i, v in enumerate(values):
                per_pos[i] += v
    snap["accepted_per_position"] = per_pos
    return snap


def spec_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """after - before, per counter and per draft position."""
    out: dict[str, Any] = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    b, a = before["accepted_per_position"], after["accepted_per_position"]
    b = b + [0] * (len(a) - len(b))
    out["accepted_per_position"] = [x - y for x, y in zip(a, b, strict=False)]
    return out


def _prompt(request: WorkloadRequest, tokenizer: Any) -> str:
    """Plain prompts as they are; chat messages through the tokenizer's chat template when it has one."""
    if request.prompt is not None or not getattr(tokenizer, "chat_template", None):
        return request.text()
    text = tokenizer.apply_chat_template(list(request.messages or ()), tokenize=False, add_generation_prompt=True)
    return str(text)


def _request_latencies(output: Any) -> tuple[float | None, float | None]:
    """(TTFT ms, TPOT ms) of one finished request from its RequestStateStats; None when not available."""
    stats = getattr(output, "metrics", None)
    if stats is None or not getattr(stats, "first_token_ts", 0.0):
        return None, None
    ttft = (stats.first_token_ts - stats.scheduled_ts) * 1000.0 if stats.scheduled_ts else None
    n = len(output.outputs[0].token_ids) if output.outputs else 0
    tpot = (stats.last_token_ts - stats.first_token_ts) * 1000.0 / (n - 1) if n >= 2 else None
    return ttft, tpot


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    _enter("import")
    from vllm import LLM, SamplingParams

    timings["import_s"] = time.perf_counter() - t

    _enter("load")
    t = time.perf_counter()
    global _engine
    llm = _engine = LLM(model=job["model"], **job["engine_kwargs"])
    timings["load_s"] = time.perf_counter() - t
    tokenizer = llm.get_tokenizer()

    classes = {c: [WorkloadRequest(**_request_kwargs(r)) for r in reqs] for c, reqs in job["classes"].items()}
    ignore_eos = bool(job.get("ignore_eos", False))

    def params(r: WorkloadRequest, max_tokens: int | None = None) -> Any:
        return SamplingParams(temperature=r.temperature, max_tokens=max_tokens or r.max_tokens, ignore_eos=ignore_eos)

    _enter("warmup")
    t = time.perf_counter()
    warm = [r for reqs in classes.values() for r in reqs][: int(job.get("warmup_requests", 0))]
    if warm:
        llm.generate(
            [_prompt(r, tokenizer) for r in warm],
            [params(r, min(r.max_tokens, WARMUP_MAX_TOKENS)) for r in warm],
            use_tqdm=False,
        )
        # The measured phase must prefill its prompts, not hit the cache the warm-up filled.
        llm.reset_prefix_cache()
    timings["warmup_s"] = time.perf_counter() - t

    _enter("measure")
    per_class: dict[str, Any] = {}
    for name, reqs in classes.items():
        before = spec_snapshot(llm.get_metrics())
        t = time.perf_counter()
        outs = llm.generate([_prompt(r, tokenizer) for r in reqs], [params(r) for r in reqs], use_tqdm=False)
        wall = time.perf_counter() - t
        after = spec_snapshot(llm.get_metrics())
        lat = [_request_latencies(o) for o in outs]
        entry: dict[str, Any] = {
            "wall_s": wall,
            "num_requests": len(outs),
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "prompt_tokens": sum(len(o.prompt_token_ids or ()) for o in outs),
            "ttft_ms": [x for x, _ in lat if x is not None],
            "tpot_ms": [y for _, y in lat if y is not None],
            "spec": spec_delta(before, after),
        }
        if job.get("return_outputs"):
            entry["outputs"] = [{"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text} for o in outs]
        per_class[name] = entry
    timings["measure_s"] = sum(c["wall_s"] for c in per_class.values())
    _enter("done")
    return {"ok": True, "timings": timings, "classes": per_class}


def _request_kwargs(d: dict[str, Any]) -> dict[str, Any]:
    d = dict(d)
    if d.get("messages") is not None:
        d["messages"] = tuple(d["messages"])
    return d


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: the parent never reads half a result


def _shutdown_engine() -> None:
    """Stop the engine core at once (the result is already written); the default shutdown waits ~5 s for
    the engine's worker process before killing it anyway."""
    core = getattr(getattr(_engine, "llm_engine", None), "engine_core", None)
    if core is None:
        return
    try:
        core.shutdown(timeout=0)
    except Exception:  # the parent kills the whole process group next, whatever happens here
        traceback.print_exc()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m autotune.backends._vllm_worker JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    _enter("start")
    try:
        result = run_job(job)
    except BaseException as exc:  # report every failure, including SystemExit from deep inside the engine
        traceback.print_exc()
        sys.stderr.flush()
        result = {
            "ok": False,
            "phase": _phase,
            "exc_type": type(exc).__name__,
            "exc_types": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
        }
    _write_json(Path(argv[1]), result)
    sys.stdout.flush()
    _shutdown_engine()
    return 0 if result["ok"] else 1


if __name__ == "__main__":  # the guard vLLM needs: its engine core is spawned and re-imports __main__
    sys.exit(main(sys.argv[1:]))
