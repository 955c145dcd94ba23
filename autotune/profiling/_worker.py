"""The profiling job: ``python -m autotune.profiling._worker JOB.json RESULT.json`` on the engine's worker harness.

One process = one engine launch for one drafter at K_max, with `policies.scheduler.PeagleScheduler` installed
(the parent sets ``PEAGLE_SCHEDULER_CONFIG``). It runs a short warm-up at every shape it measures, then one
closed-loop phase per concurrency: exactly ``concurrency`` requests in flight (a new one is added as soon as one
finishes), every request labelled with its workload class and phase through ``SamplingParams.extra_args`` so the
plugin can split its statistics.

Job keys besides the harness's (``model``, ``engine_kwargs``): ``phases`` ([{"name", "concurrency", "requests":
[{"class", request fields...}], "max_k"?, "reset_prefix_cache"?}]: ``max_k`` pins the phase's verified depth through
each request's ``peagle_max_k`` label, the cap a client may set too; ``reset_prefix_cache`` empties vLLM's prefix
cache before the phase, so a phase prefills its prompts as a fresh engine would), ``warmup`` (phases of the same
form, `autotune.profiling.shape_warmup` / `plan_warmup`: run first, labelled "warmup", with ``ignore_eos``, in no
figure), ``ignore_eos``, ``return_outputs``, and
``turns`` ({"dir", "name"}, optional): the launch runs side by side with another one and takes turns with it
(`autotune.profiling._turns`): it writes ``<name>-ready`` after the warm-up, waits for ``<name>-go-<n>`` before
phase n and writes ``<name>-done-<n>`` after it; an ``abort`` file (the other launch failed) stops it.

Result: ``"phases": [{"name", "concurrency", "max_k", "num_requests", "output_tokens", "wall_s", "started_at",
"ended_at", "spec", "ttft_ms", "tpot_ms", "steps", "step_ms", "step_ms_iqr"}]`` (the two times: seconds since the
epoch; per-request latencies as the offline job measures them, `autotune.engine.request_latencies`; ``steps``:
``LLMEngine.step`` calls, ``step_ms`` their mean and ``step_ms_iqr`` their interquartile range, ms, on this process's
clock), ``"warmup"`` ([{"concurrency", "max_k", "num_requests", "output_tokens", "steps", "wall_s"}] per warm-up
phase),
``"spec_before"``/``"spec_after"`` (vLLM's cumulative ``vllm:spec_decode_*`` counters around all measured phases;
"spec" is the delta over one phase), ``"outputs"`` (with ``return_outputs``) and the timings ``warmup_s`` and
``measure_s``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from autotune.engine import (
    EngineSession,
    enter,
    request_from_dict,
    request_latencies,
    snapshot_from_metrics,
    spec_delta,
    worker_main,
)
from autotune.profiling._turns import Turns
from policies import MAX_K_KEY
from policies.plugin import CLASS_KEY, PHASE_KEY

WARMUP_PHASE = "warmup"


def run_closed_loop(
    engine: Any, prompts: list[tuple[Any, Any]], concurrency: int, id_prefix: str
) -> tuple[list[Any], float, list[float]]:
    """Run (prompt, SamplingParams) pairs with at most `concurrency` in flight; returns (outputs in the order of
    `prompts`, wall s, the duration of each ``LLMEngine.step`` call in ms).

    Uses ``LLMEngine.add_request``/``step`` (what ``LLM.generate`` does internally) so a finished request is
    replaced at once and the decode batch stays at `concurrency` until the queue runs dry. Request ids are
    ``{id_prefix}-{index}``; pass a prefix that is unique per call.
    """
    queue = deque(enumerate(prompts))
    in_flight = 0
    finished: dict[int, Any] = {}
    index: dict[str, int] = {}
    step_ms: list[float] = []
    start = time.perf_counter()
    while queue or in_flight:
        while queue and in_flight < concurrency:
            i, (prompt, params) = queue.popleft()
            request_id = f"{id_prefix}-{i}"
            index[request_id] = i
            engine.add_request(request_id, prompt, params)
            in_flight += 1
        t = time.perf_counter()
        outs = engine.step()
        step_ms.append((time.perf_counter() - t) * 1000.0)
        for out in outs:
            if bool(getattr(out, "finished", False)):
                finished[index.get(str(out.request_id), len(index) + len(finished))] = out
                in_flight -= 1
    return [finished[i] for i in sorted(finished)], time.perf_counter() - start, step_ms


def _step_summary(step_ms: list[float]) -> dict[str, Any]:
    """Engine steps of one phase: how many, their mean and interquartile range (ms; None without steps)."""
    if not step_ms:
        return {"steps": 0, "step_ms": None, "step_ms_iqr": None}
    q = statistics.quantiles(step_ms, n=4) if len(step_ms) >= 2 else [step_ms[0]] * 3
    return {"steps": len(step_ms), "step_ms": statistics.fmean(step_ms), "step_ms_iqr": q[2] - q[0]}


def profile_phases(job: Mapping[str, Any], session: EngineSession) -> dict[str, Any]:
    """Warm up, then run each phase closed-loop with its requests labelled (class, phase) for the plugin."""
    from vllm import SamplingParams

    llm, timings = session.llm, session.timings
    engine = llm.llm_engine
    ignore_eos = bool(job.get("ignore_eos", False))

    def pair(r: Mapping[str, Any], phase: str, max_k: int | None = None, warm: bool = False) -> tuple[Any, Any]:
        request = request_from_dict(r)
        labels: dict[str, Any] = {CLASS_KEY: r["class"], PHASE_KEY: phase}
        if max_k is not None:
            labels[MAX_K_KEY] = max_k
        params = SamplingParams(
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            ignore_eos=ignore_eos or warm,  # a warm-up request runs all its tokens, so every shape runs its steps
            extra_args=labels,
        )
        return session.prompt(request), params

    enter("warmup")
    t = time.perf_counter()
    warmup: list[dict[str, Any]] = []
    for n, phase in enumerate(job.get("warmup") or []):
        concurrency = int(phase["concurrency"])
        max_k = None if phase.get("max_k") is None else int(phase["max_k"])
        pairs = [pair(r, WARMUP_PHASE, max_k, warm=True) for r in phase["requests"]]
        finished, wall, step_ms = run_closed_loop(engine, pairs, concurrency, f"{WARMUP_PHASE}.{n}")
        warmup.append({
            "concurrency": concurrency,
            "max_k": max_k,
            "num_requests": len(finished),
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in finished if o.outputs),
            "steps": len(step_ms),
            "wall_s": wall,
        })
    timings["warmup_s"] = time.perf_counter() - t
    turns = Turns.from_job(job.get("turns"))
    if turns is not None:
        turns.ready()

    enter("measure")
    before = snapshot_from_metrics(llm.get_metrics())
    phases: list[dict[str, Any]] = []
    outputs: dict[str, Any] = {}
    for n, phase in enumerate(job["phases"]):
        name, concurrency = str(phase["name"]), int(phase["concurrency"])
        max_k = None if phase.get("max_k") is None else int(phase["max_k"])
        pairs = [pair(r, name, max_k=max_k) for r in phase["requests"]]
        if turns is not None:
            with session.progress.paused():  # waiting for the other engine's turn is no stall
                turns.wait_go(n)
        if phase.get("reset_prefix_cache"):
            llm.reset_prefix_cache()
        phase_before = snapshot_from_metrics(llm.get_metrics())
        started_at = time.time()
        finished, wall, step_ms = run_closed_loop(engine, pairs, concurrency, f"{name}.{n}")
        latencies = [request_latencies(o) for o in finished]
        phases.append(
            {
                "name": name,
                "concurrency": concurrency,
                "max_k": max_k,
                "num_requests": len(finished),
                "output_tokens": sum(len(o.outputs[0].token_ids) for o in finished if o.outputs),
                "wall_s": wall,
                "started_at": started_at,
                "ended_at": time.time(),
                "spec": spec_delta(phase_before, snapshot_from_metrics(llm.get_metrics())),
                "ttft_ms": [x for x, _ in latencies if x is not None],
                "tpot_ms": [y for _, y in latencies if y is not None],
                **_step_summary(step_ms),
            }
        )
        if turns is not None:
            turns.done(n)
        if job.get("return_outputs"):
            outputs.setdefault(name, []).extend(list(o.outputs[0].token_ids) for o in finished)
    after = snapshot_from_metrics(llm.get_metrics())
    timings["measure_s"] = float(sum(float(p["wall_s"]) for p in phases))
    result: dict[str, Any] = {"phases": phases, "warmup": warmup, "spec_before": before, "spec_after": after}
    if job.get("return_outputs"):
        result["outputs"] = outputs
    return result


if __name__ == "__main__":  # the guard vLLM needs: its engine core is spawned and re-imports __main__
    sys.exit(worker_main("autotune.profiling._worker", sys.argv[1:], profile_phases))
