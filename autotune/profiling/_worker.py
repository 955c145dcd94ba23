"""Engine subprocess of the profiler: ``python -m autotune.profiling._worker JOB.json RESULT.json``.

One process = one engine launch for one drafter at K_max, with `policies.scheduler.PeagleScheduler` installed
(the parent sets ``PEAGLE_SCHEDULER_CONFIG``). It runs a short warm-up, then one closed-loop phase per concurrency:
exactly ``concurrency`` requests in flight (a new one is added as soon as one finishes), every request labelled
with its workload class and phase through ``SamplingParams.extra_args`` so the plugin can split its statistics.

Job (JSON): ``model``, ``engine_kwargs`` (``LLM(...)`` arguments, speculative config and scheduler included),
``phases`` ([{"name", "concurrency", "requests": [{"class", request fields...}]}]), ``warmup`` (request dicts with
"class"), ``ignore_eos``, ``return_outputs``.

Result (JSON): ``{"ok": true, "timings": {...}, "phases": [{"name", "concurrency", "num_requests", "output_tokens",
"wall_s", "spec"}], "spec_before": ..., "spec_after": ...}`` (vLLM's cumulative ``vllm:spec_decode_*`` counters
around all measured phases; "spec" is the delta over one phase) or ``{"ok": false, "phase", "exc_type",
"exc_types", "message"}``. Phase marks go to stdout in the vllm backend's format, so its failure classification
applies unchanged.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from autotune.backends._vllm_worker import PHASE_MARK, spec_delta, spec_snapshot
from policies._plugin_config import CLASS_KEY, PHASE_KEY

WARMUP_PHASE = "warmup"
#: Warm-up requests are cut to this many tokens: enough to run prefill, drafting and verification once.
WARMUP_MAX_TOKENS = 16

_phase = "start"
_engine: Any = None


def _enter(phase: str) -> None:
    global _phase
    _phase = phase
    print(f"{PHASE_MARK}{phase}", flush=True)


def _prompt(request: dict[str, Any], tokenizer: Any) -> str:
    """Plain prompts as they are; chat messages through the tokenizer's chat template when it has one."""
    if request.get("prompt") is not None:
        return str(request["prompt"])
    messages = list(request.get("messages") or ())
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)


def run_closed_loop(
    engine: Any, prompts: list[tuple[str, Any]], concurrency: int, id_prefix: str
) -> tuple[list[Any], float]:
    """Run (prompt, SamplingParams) pairs with at most `concurrency` in flight; returns (outputs in the order of
    `prompts`, wall s).

    Uses ``LLMEngine.add_request``/``step`` (what ``LLM.generate`` does internally) so a finished request is
    replaced at once and the decode batch stays at `concurrency` until the queue runs dry. Request ids are
    ``{id_prefix}-{index}``; pass a prefix that is unique per call.
    """
    queue = deque(enumerate(prompts))
    in_flight = 0
    finished: dict[int, Any] = {}
    index: dict[str, int] = {}
    start = time.perf_counter()
    while queue or in_flight:
        while queue and in_flight < concurrency:
            i, (prompt, params) = queue.popleft()
            request_id = f"{id_prefix}-{i}"
            index[request_id] = i
            engine.add_request(request_id, prompt, params)
            in_flight += 1
        for out in engine.step():
            if bool(getattr(out, "finished", False)):
                finished[index.get(str(out.request_id), len(index) + len(finished))] = out
                in_flight -= 1
    return [finished[i] for i in sorted(finished)], time.perf_counter() - start


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
    engine = llm.llm_engine
    ignore_eos = bool(job.get("ignore_eos", False))

    def params(r: dict[str, Any], phase: str, max_tokens: int | None = None) -> Any:
        return SamplingParams(
            temperature=float(r.get("temperature", 0.0)),
            max_tokens=int(max_tokens or r.get("max_tokens", 128)),
            ignore_eos=ignore_eos,
            extra_args={CLASS_KEY: r["class"], PHASE_KEY: phase},
        )

    _enter("warmup")
    t = time.perf_counter()
    warm = list(job.get("warmup") or [])
    if warm:
        pairs = [
            (_prompt(r, tokenizer), params(r, WARMUP_PHASE, min(int(r.get("max_tokens", 128)), WARMUP_MAX_TOKENS)))
            for r in warm
        ]
        run_closed_loop(engine, pairs, len(pairs), WARMUP_PHASE)
    timings["warmup_s"] = time.perf_counter() - t

    _enter("measure")
    before = spec_snapshot(llm.get_metrics())
    phases: list[dict[str, Any]] = []
    outputs: dict[str, Any] = {}
    for n, phase in enumerate(job["phases"]):
        name, concurrency = str(phase["name"]), int(phase["concurrency"])
        pairs = [(_prompt(r, tokenizer), params(r, name)) for r in phase["requests"]]
        phase_before = spec_snapshot(llm.get_metrics())
        finished, wall = run_closed_loop(engine, pairs, concurrency, f"{name}.{n}")
        phases.append(
            {
                "name": name,
                "concurrency": concurrency,
                "num_requests": len(finished),
                "output_tokens": sum(len(o.outputs[0].token_ids) for o in finished if o.outputs),
                "wall_s": wall,
                "spec": spec_delta(phase_before, spec_snapshot(llm.get_metrics())),
            }
        )
        if job.get("return_outputs"):
            outputs.setdefault(name, []).extend(list(o.outputs[0].token_ids) for o in finished)
    after = spec_snapshot(llm.get_metrics())
    timings["measure_s"] = float(sum(float(p["wall_s"]) for p in phases))
    _enter("done")
    result: dict[str, Any] = {
        "ok": True, "timings": timings, "phases": phases, "spec_before": before, "spec_after": after,
    }
    if job.get("return_outputs"):
        result["outputs"] = outputs
    return result


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: the parent never reads half a result


def _shutdown_engine() -> None:
    """Stop the engine core now (the result is written); this also makes the plugin write its final stats."""
    core = getattr(getattr(_engine, "llm_engine", None), "engine_core", None)
    if core is None:
        return
    try:
        core.shutdown(timeout=0)
    except Exception:  # the parent kills the whole process group next, whatever happens here
        traceback.print_exc()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m autotune.profiling._worker JOB.json RESULT.json", file=sys.stderr)
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
